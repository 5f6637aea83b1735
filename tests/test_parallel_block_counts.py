"""The price's collective bytes for MaxText's parallel block (`decoder_block=default`) on a TPU,
against what the compiled steps move (benchmarks/results/compiler_counts.txt, v5p:2x2x1)."""
import dataclasses

import pytest

from cost_models.counts import priced_link_bytes
from cost_models.models import get_model
from planner.estimate import candidates_of
from planner.plan import Plan, make_mesh

pytestmark = pytest.mark.pure

SMALL = get_model("small")
PARALLEL = dataclasses.replace(SMALL, name="small-default", decoder_block="default")


def _ring_bytes(model) -> dict:
    plan = Plan(model=model, topology="v5p:2x2x1", seq_len=4096, global_batch=1, mesh=make_mesh(context=2, tensor=2),
                cp_strategy="ring", load_balance="zigzag", remat="full", block_q=256, block_kv=256,
                loss_chunk_tokens=256)
    return {family: float(b[0]) for family, b in priced_link_bytes(candidates_of(plan)).items()}


def test_parallel_ring_step_gathers_its_qkv_weights_once_under_full_remat():
    """The compiled v5p ring step (context 2 × tensor 2, full remat) of the parallel block gathers
    2,392,064 B of weights and moves 11,558,912 B over tensor (5 collectives a layer); the
    sequential block's step gathers its recomputed q/k/v weights a second time, the parallel one's
    shard_map does not: priced with that second gather it was 12.4% over."""
    parallel, sequential = _ring_bytes(PARALLEL), _ring_bytes(SMALL)
    assert parallel["fsdp_all_gather"] == pytest.approx(2392064, rel=0.05)
    assert parallel["tensor"] == pytest.approx(11558912, rel=0.05)
    # the sequential step's second gather: q, k, v in bf16, a tensor-th each, over context's 2 devices
    qkv = SMALL.hidden * (SMALL.num_heads + 2 * SMALL.num_kv_heads) * SMALL.head_dim
    regather = SMALL.num_layers * qkv * 2 / 2 * (2 - 1) / 2
    assert sequential["fsdp_all_gather"] - parallel["fsdp_all_gather"] == pytest.approx(regather, rel=0.01)
