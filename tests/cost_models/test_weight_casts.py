"""The HBM price's weight casts, gradients by phase and MLP chunk loop (cost_models.pricing.memory),
by hand, on bench_memory's row "v5p all_gather8 save_dot_except_mlp" (Llama 3.1 8B's shapes with 2
layers, 64K tokens over context 8). Its deviceless compile (docs/weight_casts.md)
holds at its peak the bf16 casts of both layers' stacked weight shards (`convert.301-307`, 104 MiB),
the layers' fp32 gradient sums (208 MiB) and no gradient of the input embedding or the output head.
"""

import dataclasses

import pytest

from cost_models.models import MODELS
from cost_models.units import MiB
from planner import Plan, estimate, make_mesh

pytestmark = pytest.mark.pure
TWO_LAYERS = dataclasses.replace(MODELS["llama3.1-8b"], name="llama3.1-8b-2l", num_layers=2)
HIDDEN, INTER, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 4096, 14336, 128256, 32, 8, 128


def _plan(**fields) -> Plan:
    return Plan(
        model=TWO_LAYERS,
        topology="v5p:2x2x2",
        seq_len=65536,
        global_batch=1,
        mesh=make_mesh(context=8),
        cp_strategy="all_gather",
        load_balance="zigzag",
        remat="save_dot_except_mlp",
        block_q=512,
        block_kv=512,
        loss_chunk_tokens=8192,
        **fields,
    )


def test_weight_casts_by_hand():
    b = estimate(_plan()).hbm_bytes
    # q, k, v, out and the MLP's three matrices of each layer, over 8 devices, in bf16
    matrices = HIDDEN * (HEADS + 2 * KV_HEADS) * HEAD_DIM + HEADS * HEAD_DIM * HIDDEN + 3 * HIDDEN * INTER
    assert b["weight_casts"] == 2 * matrices / 8 * 2
    assert b["weight_casts"] / MiB == 104  # convert.301-307 in the compile
    # weights already in the compute dtype are read as they are: no copy
    assert estimate(_plan(param_dtype="bfloat16")).hbm_bytes["weight_casts"] == 0


def test_gradients_by_phase():
    b = estimate(_plan()).hbm_bytes
    layer = 2 * TWO_LAYERS.params_per_layer / 8
    head = HIDDEN * VOCAB / 8
    # the backward: the layers' fp32 gradients and the head's bf16 pieces
    assert b["layer_grads"] == layer * 4 and b["head_grad"] == head * 2
    assert (b["layer_grads"] + b["head_grad"]) / MiB == pytest.approx(208 + 125.25, abs=0.01)
    # the update: the embedding's fp32 gradient and the head's, besides
    assert b["update_gradients"] == (head + HIDDEN * VOCAB / 8 + HIDDEN / 8) * 4 - head * 2
    assert b["layer_grads"] + b["head_grad"] + b["update_gradients"] == TWO_LAYERS.num_params / 8 * 4


def test_mlp_chunk_loop_holds_its_matrices():
    # 8192 tokens per device: two chunks of 4096; the loop holds the three gathered matrices, their
    # three bf16 gradient sums and one chunk's new sum (in the compile: 10 matrices of 112 MiB)
    two = estimate(_plan()).hbm_bytes["mlp_working_set"]
    # 4096 tokens: one chunk, each gradient formed once
    one = estimate(dataclasses.replace(_plan(), seq_len=32768)).hbm_bytes["mlp_working_set"]
    chunk = 4096 * 2 * (2 * INTER + HIDDEN) * 2
    # beside them the MLP's input and its gradient, the layer output's gradient and the residual the
    # MLP's norm read, for every token (no tensor axis)
    assert two == 4 * 8192 * HIDDEN * 2 + chunk + 7 * HIDDEN * INTER * 2
    assert one == 4 * 4096 * HIDDEN * 2 + chunk + 6 * HIDDEN * INTER * 2
