"""Two things MaxText's compile of Gemma 3 12B at 32K on v6e-256 runs that a gathered, Llama-block price left out
(docs/multislice.md): Gemma 3's block norms the MLP's output before the residual sum, so its backward reads
that output and a remat policy that does not keep it runs the MLP's out projection again; and
`use_iota_embed=True` looks the input embedding up as a one-hot matmul, forward and for the table's gradient."""

import dataclasses

import pytest

from cost_models.errors import CpplanError
from cost_models.models import MODELS, DecoderBlock
from cost_models.pricing.head import ONE_HOT_MASK_BYTES, ONE_HOT_PASSES
from cost_models.remat import CHECKPOINTS, MLP_OUTPUT, is_read, recomputed, remat_code, remat_table
from cost_models.vocabulary import RematPolicy
from planner import Plan, make_mesh
from planner.estimate import estimate
from planner.maxtext import export_maxtext, read_maxtext

pytestmark = pytest.mark.pure
GEMMA3 = MODELS["gemma3-12b"]
# the same shapes in Llama's block (two norms, q and k not normed)
LLAMA_BLOCK = dataclasses.replace(GEMMA3, name="gemma3-12b-llama-block", decoder_block="llama2", qk_norm=False)


def test_gemma3s_block_reads_the_mlp_output_so_full_remat_runs_its_out_projection_again():
    out = next(c for c in CHECKPOINTS if c.name == MLP_OUTPUT)
    assert GEMMA3.decoder_block is DecoderBlock.GEMMA3 and GEMMA3.decoder_block.post_norms
    assert is_read(out, GEMMA3) and not is_read(out, LLAMA_BLOCK)
    assert MLP_OUTPUT in recomputed(RematPolicy.FULL, model=GEMMA3)
    assert MLP_OUTPUT not in recomputed(RematPolicy.FULL, model=LLAMA_BLOCK)
    full, minimal = remat_code(RematPolicy.FULL), remat_code(RematPolicy.MINIMAL)
    gemma, llama = remat_table(GEMMA3), remat_table(LLAMA_BLOCK)
    # a gated MLP's three matmuls are the same size: Llama's block recomputes two of them, Gemma's all three
    assert llama.recompute_mlp[full] == pytest.approx(2 / 3) and gemma.recompute_mlp[full] == 1.0
    # minimal keeps every matmul output the backward reads: Gemma's MLP output is one, one hidden-wide value
    assert gemma.saved_on_device[minimal] - llama.saved_on_device[minimal] == GEMMA3.hidden


def plan(**changes):
    return Plan(
        model=GEMMA3,
        topology="v6e:4x4",
        seq_len=8192,
        global_batch=16,
        mesh=make_mesh(fsdp=16),
        remat="full",
        block_q=1024,
        block_kv=1024,
        **changes,
    )


def test_a_one_hot_embedding_adds_two_head_sized_matmuls_and_their_masks():
    gathered, one_hot = estimate(plan()), estimate(plan(one_hot_embedding=True))
    tokens, v, d = 8192, GEMMA3.vocab, GEMMA3.hidden  # one sequence of 8192 tokens a device
    assert ONE_HOT_PASSES == 2 and ONE_HOT_MASK_BYTES == 2
    added = one_hot.executed_flops_per_device - gathered.executed_flops_per_device
    assert added == pytest.approx(2 * (2 * tokens * v * d))  # [tokens, vocab] × [vocab, hidden], twice
    assert one_hot.compute_s["attention"] == gathered.compute_s["attention"]
    assert one_hot.compute_s["matmul"] > gathered.compute_s["matmul"]
    mask_s = 2 * tokens * v * 2 / plan().topology_spec.hbm_bw_per_device  # two masks, written and read
    assert one_hot.hbm_s["elementwise"] - gathered.hbm_s["elementwise"] == pytest.approx(mask_s)
    assert one_hot.step_time_s > gathered.step_time_s


def test_use_iota_embed_is_read_and_written_as_the_plans_one_hot_embedding():
    flags = (
        "model_name=gemma3-12b compile_topology=v6e-16 max_target_length=8192 per_device_batch_size=1 "
        "ici_fsdp_parallelism=-1 remat_policy=full sa_block_q=1024 sa_block_kv=1024 use_iota_embed=True"
    )
    found = read_maxtext(flags)
    assert found.plan.one_hot_embedding and "use_iota_embed" not in found.unread
    # the price says what it leaves out, however the plan was made
    assert any(n.startswith("one_hot_embedding: the one-hot lookup") for n in estimate(found.plan).notes)
    assert not any("one_hot" in n for n in estimate(plan()).notes)
    assert not read_maxtext(flags.replace(" use_iota_embed=True", "")).plan.one_hot_embedding
    assert export_maxtext(found.plan).flags["use_iota_embed"] is True
    assert "use_iota_embed" not in export_maxtext(dataclasses.replace(found.plan, one_hot_embedding=False)).flags
    assert Plan.from_json(found.plan.to_json()) == found.plan
    with pytest.raises(CpplanError, match="one_hot_embedding=1 must be true or false"):
        dataclasses.replace(found.plan, one_hot_embedding=1)
