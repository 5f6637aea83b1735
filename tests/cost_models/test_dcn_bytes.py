"""The data all-reduce over DCN moves the bytes MaxText's compiled multi-slice step sends.

MaxText 0.2.5's train step for a small model (MaxText's llama2 block, 512 wide, 4 heads of 128,
MLP 2048, vocabulary 32768, untied) was compiled deviceless over N v5e-16 slices, FSDP inside
each slice and data parallelism across them, and its host transfers to the megascale runtime
(the DCN collectives) were read from the compiled module (docs/evidence/maxtext_dcn.txt). Each device all-reduces its
fsdp shard of every gradient in bf16: four all-reduces per layer, issued at the top of the next
layer's backward iteration and awaited at its end, plus seven per step (embedding, output head,
norm scales, two scalars). cpplan prices the same bytes as one all-reduce, and the calls' DCN latency
(a reduce-scatter and an all-gather each; v5e's fitted row figures) beside them.
"""

import pytest

from cost_models.models import ModelSpec
from planner.estimate import estimate
from planner.plan import Plan, make_mesh

pytestmark = pytest.mark.pure
V5E_DCN = 3.125e9  # v5e's chip row, B/s per chip
V5E_DCN_LATENCY = (2.02e-4, 1.371e-4)  # v5e's chip row: s a collective across N slices, base and per slice

# (layers, slices): bytes one device sends to the DCN all-reduces per step, from the compiled module:
# the backward loop body's (524,288 B in four all-reduces) times its trip count (XLA peels one
# iteration), plus the step's own (eleven, the peeled layer's four among them)
COMPILED = {(4, 2): 3 * 524_288 + 4_722_688, (8, 4): 7 * 524_288 + 4_724_736}


def _small(layers: int) -> ModelSpec:
    return ModelSpec("maxtext-small", layers, 512, 4, 4, 128, 2048, 32768)


@pytest.mark.parametrize("layers, slices", sorted(COMPILED))
def test_dcn_bytes_match_maxtexts_compiled_step(layers, slices):
    compiled_bytes = COMPILED[(layers, slices)]
    plan = Plan(
        model=_small(layers),
        topology=f"{slices}xv5e-16",
        seq_len=512,
        global_batch=16 * slices,
        mesh=make_mesh(data=slices, fsdp=16),
        dcn_data=slices,
    )
    seconds = estimate(plan).comm_s["data_all_reduce"]
    # 4 all-reduces a layer and 7 a step, each a reduce-scatter and an all-gather waiting DCN's latency (the
    # data axis has no ICI span inside a slice: no ICI latency)
    base, per_slice = V5E_DCN_LATENCY
    waited = (4 * layers + 7) * 2 * (base + per_slice * slices)
    # an all-reduce over n slices sends 2·(n-1)/n of the shard; the DCN carries it at the chip's line rate
    priced_bytes = (seconds - waited) * V5E_DCN / (2 * (slices - 1) / slices)
    by_hand = plan.model.num_params * 2 / 16
    assert priced_bytes == pytest.approx(by_hand, rel=1e-9)
    # the compiled sends pad the norm scales and the scalars to whole tiles: within 0.1%
    assert priced_bytes == pytest.approx(compiled_bytes, rel=1e-3)


@pytest.mark.parametrize("slices", [1, 2, 4, 32])
def test_a_collective_across_slices_waits_the_rows_dcn_latency_beside_icis(slices):
    from cost_models.topology import Segment, get_topology

    topo = get_topology(f"{slices}xv5e-16" if slices > 1 else "v5e-16")
    ici = topo.links((Segment(0, 4, 1),))  # 4 devices along the slice's first dimension
    across = topo.across_slices(ici, slices)
    base, per_slice = V5E_DCN_LATENCY
    waited = base + per_slice * slices if slices > 1 else 0.0
    assert topo.chip.dcn_latency_s(slices) == pytest.approx(waited, rel=1e-12)
    assert across.collective_latency_s == pytest.approx(ici.collective_latency_s + waited, rel=1e-12)
