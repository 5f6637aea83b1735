"""A mixture-of-experts layer's backward as MaxText's grouped matmuls hold it (MaxText 0.2.5's DeepSeek-V3
compile at EP 1, docs/moe_compiled.md, "shard_exp_on_fsdp"): the gathered expert matrices or their gradients,
never both, and without expert parallelism three routed copies hidden-wide; by hand on the TPU7x recipe."""

import dataclasses

import numpy as np
import pytest

from cost_models.pricing.experts import ROUTED_COPIES_HELD, routed_copy_bytes
from cost_models.pricing.memory import price_memory
from cost_models.pricing.step import price_layer_attention
from cost_models.targets import Target
from planner.estimate import candidates_of
from planner.maxtext import read_maxtext

pytestmark = pytest.mark.pure

# the TPU7x recipe tpu7x-256-deepseek3-671b-4k-bf16 (benchmarks/public_ironwood_runs.csv), its pricing flags
RECIPE = (
    "model_name=deepseek3-671b per_device_batch_size=8 max_target_length=4096 ici_fsdp_parallelism=-1 "
    "remat_policy=custom decoder_layer_input=offload mu_dtype=bfloat16 megablox=True sparse_matmul=True "
    "fsdp_shard_on_exp=True attention=flash sa_block_q=2048 sa_block_kv=2048 weight_dtype=float32 "
    "compile_topology=tpu7x-256 compile_topology_num_slices=1"
)
TOKENS, HIDDEN, EXPERTS, TOP_K, WIDTH, SHARED_WIDTH = 8 * 4096, 7168, 256, 8, 2048, 2048


def mlp_working_set(x, grouped_matmul_backward: bool) -> float:
    traits = Target.MAXTEXT.traits
    attention, context = price_layer_attention(x, Target.MAXTEXT)
    memory = price_memory(
        x,
        attention.layout,
        context,
        mlp_chunk_tokens=traits.mlp_chunk_tokens,
        head_gradient_in_head_layout=traits.head_gradient_in_head_layout,
        kv_buffers_working_set=traits.kv_buffers_working_set,
        layers_switch_masks=traits.layers_switch_masks,
        expert_buffers_worst_case=traits.maxtext_rules,
        grouped_matmul_backward=grouped_matmul_backward,
    )
    return float(np.ravel(memory.mlp_working_set)[0])


def test_the_recipe_holds_three_expert_matrices_and_three_routed_copies():
    x = candidates_of(read_maxtext(RECIPE).plan)
    assert x.expert[0] == 1 and x.tokens_per_device[0] == TOKENS
    # one matrix of all 256 experts and the shared one, gathered whole (EP 1), bf16
    matrix = HIDDEN * (EXPERTS * WIDTH + SHARED_WIDTH) * 2
    assert matrix == 7_545_552_896
    # the sorted input, the output's gradient in expert order, the recomputed expert output: tokens × 8 rows each
    copies = 3 * TOKENS * TOP_K * HIDDEN * 2
    assert ROUTED_COPIES_HELD == 3 and routed_copy_bytes(x)[0] == copies == 11_274_289_152
    # the chunk-loop rule held the three gathered matrices and their three gradients at once
    assert mlp_working_set(x, False) - mlp_working_set(x, True) == pytest.approx(3 * matrix - copies, rel=1e-12)


def test_expert_parallelism_prices_receive_buffers_not_routed_copies():
    plan = read_maxtext(
        RECIPE.replace("ici_fsdp_parallelism=-1", "ici_fsdp_parallelism=-1 ici_expert_parallelism=4")
    ).plan
    x = candidates_of(plan)
    assert x.expert[0] == 4 and routed_copy_bytes(x)[0] == 0.0
    # each device gathers its 64 experts' matrices (and the shared one's); only the three gradients go
    matrix = HIDDEN * (EXPERTS // 4 * WIDTH + SHARED_WIDTH) * 2
    assert mlp_working_set(x, False) - mlp_working_set(x, True) == pytest.approx(3 * matrix, rel=1e-12)


def test_a_dense_model_keeps_the_chunk_loop_rule():
    plan = read_maxtext(RECIPE).plan
    x = candidates_of(dataclasses.replace(plan, model=dataclasses.replace(plan.model, name="dense", experts=None)))
    assert mlp_working_set(x, True) == mlp_working_set(x, False)
