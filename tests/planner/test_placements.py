"""The search's placements against the one segment rule: each placement's links are `Topology.links` over
the segments `axis_segments` gives its axes, no two placements have the same links, and every axis order ×
physical order that tiles the slice has the links of one of them."""

import itertools

import pytest

from cost_models.candidates import GROUP_AXES
from cost_models.placement import axis_segments
from cost_models.topology import Segment, get_topology
from cost_models.vocabulary import AXES
from planner.options import ordered_factorizations
from planner.search import _Placements, _span_ends

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


@pytest.mark.parametrize("name", ["tpu7x:4x4x8", "v5p:4x4x8", "v5e:4x8"])
def test_meshes_laid_together_get_the_placements_each_gets_alone(name):
    # a search lays the meshes whose axes have the same sizes in one batch: each must come out as it does alone
    topo = get_topology(name)
    meshes = ordered_factorizations(topo.num_devices, len(AXES), {})
    together = _Placements(topo)
    together.lay(meshes)
    for sizes in meshes[::3]:
        alone, laid = _Placements(topo), together.of(sizes)
        assert len(laid) == len(alone.of(sizes)), sizes
        assert [laid.orders(i) for i in range(len(laid))] == [alone.of(sizes).orders(i) for i in range(len(laid))]
        if laid:
            (groups, ring), (groups_alone, ring_alone) = together.link_table(sizes), alone.link_table(sizes)
            for group in GROUP_AXES:
                assert (groups[group].bw == groups_alone[group].bw).all(), (sizes, group)
                assert (groups[group].latency == groups_alone[group].latency).all(), (sizes, group)
            assert (ring.bw == ring_alone.bw).all() and (ring.latency == ring_alone.latency).all()


def test_a_mesh_s_span_ends_fit_the_bit_sets_of_its_groups():
    # a group's spans are a bit set over the intervals between the span ends (`_span_ends`, the products of some of
    # a mesh's sizes), held in 64-bit words: an axis more in `AXES` would overflow them
    assert len(_span_ends((2, 3, 5, 7, 11, 13))) == 2 ** len(AXES) <= 64
