"""The offloaded values a layer's backward holds through its MLP's backward: the layer loop
fetches a layer's offloaded values an iteration ahead, so those its attention's backward reads
(its input, q, k, v, the attention output) are back in HBM while the MLP's backward runs, and the
memory price counts them on the MLP side (cost_models.remat: `READ_BY_ATTENTION_BACKWARD`, the remat
table's `fetched_ahead` column)."""

import pytest

from cost_models.models import MODELS
from cost_models.remat import LAYER_INPUT, POLICIES, custom_placements, remat_table
from cost_models.units import MiB
from cost_models.vocabulary import RematPolicy
from planner import Plan, make_mesh
from planner.estimate import estimate

pytestmark = pytest.mark.pure
MODEL = MODELS["llama3.1-8b"]
QKV_WIDTH = 32 * 128 + 2 * 8 * 128  # q, k and v of Llama 3.1 8B per token: 32 query heads, 8 KV heads of 128


def per_policy(custom=()):
    return dict(zip(POLICIES, remat_table(MODEL, custom_placements(custom)).fetched_ahead))


def test_only_offloaded_values_the_attention_backward_reads_are_fetched_ahead():
    widths = per_policy()
    assert widths[RematPolicy.QKV_PROJ_OFFLOADED] == QKV_WIDTH
    # minimal_offloaded also offloads the out projection and the MLP's inputs: the out projection is
    # read before the MLP's backward (to form its input), the MLP's values chunk by chunk
    assert widths[RematPolicy.MINIMAL_OFFLOADED] == QKV_WIDTH
    assert all(
        widths[p] == 0 for p in POLICIES if p not in (RematPolicy.QKV_PROJ_OFFLOADED, RematPolicy.MINIMAL_OFFLOADED)
    )
    custom = RematPolicy.CUSTOM
    assert per_policy({LAYER_INPUT: "offload", "query_proj": "offload"})[custom] == MODEL.hidden + 32 * 128
    assert per_policy({"context": "offload", "key_proj": "device"})[custom] == 32 * 128
    assert per_policy({"out_proj": "offload", "mlpwi_0": "offload", "mlpwi_1": "offload"})[custom] == 0


def test_mlp_side_holds_one_layers_fetched_qkv():
    # the same plan with q, k and v on the host or kept in HBM: the kept ones are in `activations`,
    # the offloaded ones come back for the layer's backward; 8 sequences of 8K over 8 devices is
    # 8192 tokens a device, 6144 values each in bf16: 96 MiB
    def mlp_side(remat):
        plan = Plan(model=MODEL, topology="v5p-16", seq_len=8192, global_batch=8, mesh=make_mesh(fsdp=8), remat=remat)
        return estimate(plan).hbm_bytes["mlp_working_set"]

    assert mlp_side("qkv_proj_offloaded") - mlp_side("save_qkv_proj") == pytest.approx(96 * MiB)
