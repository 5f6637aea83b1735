"""Where K/V are in the attention's working set (Ulysses, no context parallelism), the fused backward's dq
partials are held while its kernel runs, beside the kernel's own values, not beside the whole working set
that is held after it: the attention side is the larger of the two moments
(`cost_models.pricing.memory.fused_kernel_working_set`; read from a tpu7x compile, docs/compiler_aborts.md)."""

import dataclasses

import pytest

from cost_models.models import MODELS
from cost_models.units import GiB
from planner import Plan, make_mesh
from planner.estimate import estimate

pytestmark = pytest.mark.pure
MODEL = dataclasses.replace(MODELS["llama3.1-8b"], num_layers=4)


def _estimate(fused: bool):
    # 64 sequences of 64K on tpu7x:2x2x1 (8 devices): Ulysses 2 × fsdp 4, 16 × 32768 = 524288 tokens a device
    plan = Plan(
        model=MODEL,
        topology="tpu7x:2x2x1",
        seq_len=65536,
        global_batch=64,
        mesh=make_mesh(fsdp=4, context_ulysses=2),
        cp_strategy="ulysses",
        remat="full",
        block_q=2048,
        block_kv=2048,
        fused_attention_backward=fused,
    )
    return estimate(plan).hbm_bytes


def test_the_partials_are_held_beside_the_kernels_values_not_the_whole_working_set():
    tokens = 16 * 32768
    # the layer's values per token: the normed input 4096, q and the output 32 × 128 each, K and V 8 × 128
    # each, the residual stream's two 4096 (nothing kept under `full`): 22528 in bf16, 22 GiB
    values = tokens * (4096 + 2 * 4096 + 2 * 1024 + 2 * 4096) * 2
    assert values == 22 * GiB
    separate, fused = _estimate(False), _estimate(True)
    # the separate kernels: the whole set, every value and its gradient
    assert separate["attention_working_set"] == 2 * values == 44 * GiB
    # the fused kernel: 32 partials (65536 / 2048) of 16 sequences × 16 heads × 65536 × 128 in bf16, over as
    # many chunks of the keys as keep them within an eighth of the HBM: 2 partials a chunk and the fp32 sum
    partials = fused["attention_buffers"] - separate["attention_buffers"]
    assert partials == 16 * 16 * 65536 * 128 * (2 * 2 + 4) == 16 * GiB
    # while it runs: the values, the output's gradient and the dq it forms (32 heads × 128 each, bf16); the
    # whole set less the partials (28 GiB) is the smaller moment
    assert fused["attention_working_set"] == values + tokens * 2 * 4096 * 2 == 30 * GiB
