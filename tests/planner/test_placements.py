"""The search's placements against the one segment rule: each placement's links are `Topology.links` over
the segments `axis_segments` gives its axes, no two placements have the same links, and every axis order ×
physical order that tiles the slice has the links of one of them."""

import itertools

import pytest

from cost_models.candidates import GROUP_AXES
from cost_models.placement import axis_segments
from cost_models.topology import Segment, get_topology
from cost_models.vocabulary import AXES
from planner.search import _Placements

pytestmark = pytest.mark.pure


def _figures(links: dict) -> tuple:
    return tuple(
        (a.collective_bw_bytes_per_s, a.collective_latency_s, a.ring_bw_bytes_per_s, a.ring_latency_s)
        for a in (links[group] for group in GROUP_AXES)
    )


def _links_by_segments(topo, axis_order, physical_order, size_of) -> dict | None:
    dims = {d.name: i for i, d in enumerate(topo.physical_dims)}
    active = [a for a in axis_order if size_of[a] > 1]
    sizes = tuple(topo.physical_dims[dims[name]].size for name in physical_order)
    segs = axis_segments(tuple(size_of[a] for a in active), sizes)
    if segs is None:
        return None
    of_axis = {
        a: tuple(Segment(dims[physical_order[s.dim]], s.size, s.stride) for s in ss) for a, ss in zip(active, segs)
    }
    return {group: topo.links(sum((of_axis.get(a, ()) for a in axes), ())) for group, axes in GROUP_AXES.items()}


@pytest.mark.parametrize(
    "name, sizes",
    [
        ("tpu7x:4x4x8", (2, 4, 8, 2, 2, 1)),  # four dimensions with the chip's two cores
        ("tpu7x:4x4x8", (1, 16, 4, 1, 4, 1)),
        ("v5p:4x4x8", (2, 2, 16, 1, 2, 1)),
        ("v5e:4x8", (1, 4, 2, 2, 2, 1)),
        ("tpu7x:4x4x8", (1, 4, 4, 1, 2, 4)),  # an expert axis: its all-to-all group and the experts' weight group
        ("v5p:4x4x8", (2, 2, 4, 1, 1, 8)),
    ],
)
def test_placements_follow_the_segment_rule_and_cover_every_tiling_order(name, sizes):
    topo = get_topology(name)
    size_of = dict(zip(AXES, sizes))
    placements = _Placements(topo).of(sizes)
    kept = [_figures(p.links) for p in placements]
    assert len(set(kept)) == len(kept)
    for p in placements:
        assert p.links == _links_by_segments(topo, p.axis_order, p.physical_order, size_of)
    names = [d.name for d in topo.physical_dims]
    active = [a for a in AXES if size_of[a] > 1]
    for axis_order, physical_order in itertools.product(itertools.permutations(active), itertools.permutations(names)):
        links = _links_by_segments(topo, axis_order, physical_order, size_of)
        if links is not None:
            assert _figures(links) in kept
