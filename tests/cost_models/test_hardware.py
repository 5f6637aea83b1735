"""Chips, topologies and the collective formulas on them, checked by hand."""

import json
import math

import pytest

from cost_models import collectives
from cost_models.chips import CHIP_DIR_ENV, get_chip, known_chips, load_chip
from cost_models.errors import CpplanError
from cost_models.placement import axis_segments, span_segments, tiles
from cost_models.topology import Segment, get_topology

pytestmark = pytest.mark.pure


def test_every_cited_figure_has_a_source():
    for chip in known_chips().values():
        row = chip.to_dict()
        if not chip.kind.has_torus:
            continue
        for name in (
            "peak_bf16_flops_per_s",
            "hbm_bytes_per_device",
            "hbm_bw_bytes_per_s",
            "ici_link_bw_bytes_per_s",
            "wraparound",
            "devices_per_chip",
            "dcn_bw_bytes_per_s",
            "matmul_efficiency",
        ):
            assert chip.sources.get(name), f"{chip.name}.{name}={row[name]} has no source"


@pytest.mark.parametrize(
    "name, canonical, devices",
    [
        ("v5p-8", "v5p:2x2x1", 4),
        ("v5p-16", "v5p:2x2x2", 8),
        ("v5p-128", "v5p:4x4x4", 64),
        ("v5p-256", "v5p:4x4x8", 128),
        ("v5p-1024", "v5p:8x8x8", 512),
        ("tpu7x-8", "tpu7x:2x2x1", 8),
        ("tpu7x-128", "tpu7x:4x4x4", 128),
        ("tpu7x:4x4x4", "tpu7x:4x4x4", 128),
        ("v5p:16x20x28", "v5p:16x20x28", 8960),
        ("tpu7x:16x24x24", "tpu7x:16x24x24", 18432),
        ("v5e-256", "v5e:16x16", 256),
        ("cpu:8", "cpu:8", 8),
    ],
)
def test_slice_names(name, canonical, devices):
    topo = get_topology(name)
    assert topo.name == canonical
    assert topo.num_devices == devices


def test_wraparound_per_dimension():
    assert [d.wraps for d in get_topology("v5p:4x4x8").physical_dims] == [True, True, True]
    assert [d.wraps for d in get_topology("v5p:2x2x2").physical_dims] == [False, False, False]
    assert [d.wraps for d in get_topology("v5e:8x16").physical_dims] == [False, True]
    tpu7x = get_topology("tpu7x:4x4x4").physical_dims
    assert [d.name for d in tpu7x] == ["x", "y", "z", "core"] and tpu7x[-1].size == 2


@pytest.mark.parametrize(
    "bad, words",
    [
        ("v5p:3x3x3", ["does not exist", "multiple of 4", "2x2x1"]),
        ("v5p:4x4", ["3D torus"]),
        ("v5q-8", ["unknown chip", "Did you mean 'v5p'"]),
        ("v5p-12", ["no v5p slice has 6 chips"]),
        ("v5p-7", ["not a multiple"]),
        ("v5p:32x32x32", ["exceed the largest v5p pod"]),
        ("cpu:0", ["cpu:N"]),
        ("banana", ["cannot parse topology", "v5p:4x4x8"]),
    ],
)
def test_bad_topologies_say_what_exists(bad, words):
    with pytest.raises(CpplanError) as err:
        get_topology(bad)
    for w in words:
        assert w in str(err.value)


def test_all_gather_with_and_without_wraparound():
    gib = 1e9
    # v5p 4x4x4: x wraps, both directions at 9e10 B/s each: 1e9 · 3/4 / 1.8e11 + 4/2 hops · 1 µs
    links = get_topology("v5p:4x4x4").links((Segment(0, 4, 1),))
    assert links.collective_bw_bytes_per_s == 1.8e11 and links.wraps
    t = collectives.all_gather(gib, 4, links.collective_bw_bytes_per_s, links.collective_latency_s)
    assert t == pytest.approx(0.75e9 / 1.8e11 + 2e-6, rel=1e-12)
    # v5e 4x4: no wraparound, one direction at 4.5e10 B/s, latency over 3 hops
    links = get_topology("v5e:4x4").links((Segment(0, 4, 1),))
    assert links.collective_bw_bytes_per_s == 4.5e10 and not links.wraps
    t = collectives.all_gather(gib, 4, links.collective_bw_bytes_per_s, links.collective_latency_s)
    assert t == pytest.approx(0.75e9 / 4.5e10 + 3e-6, rel=1e-12)
    # two wrapped dims at once: bandwidth adds, 16 devices
    links = get_topology("v5p:4x4x4").links((Segment(2, 4, 1), Segment(1, 4, 1)))
    t = collectives.all_gather(gib, 16, links.collective_bw_bytes_per_s, links.collective_latency_s)
    assert t == pytest.approx(gib * 15 / 16 / 3.6e11 + 4e-6, rel=1e-12)


def test_all_to_all_is_a_quarter_of_all_gather():
    links = get_topology("v5p:4x4x4").links((Segment(0, 4, 1),))
    # 1e8 bytes per device before and after: A·n/(4W) = 1e8 · 4 / (4 · 1.8e11) + 2 µs
    t = collectives.all_to_all(1e8, 4, links.collective_bw_bytes_per_s, links.collective_latency_s)
    assert t == pytest.approx(1e8 * 4 / (4 * 1.8e11) + 2e-6, rel=1e-12)
    # without wraparound (v5e 4x4): one direction at 4.5e10 B/s, 3 hops of latency
    line = get_topology("v5e:4x4").links((Segment(1, 4, 1),))
    t = collectives.all_to_all(1e8, 4, line.collective_bw_bytes_per_s, line.collective_latency_s)
    assert t == pytest.approx(1e8 * 4 / (4 * 4.5e10) + 3e-6, rel=1e-12)
    # two devices: each pushes half its array through the one link between them
    pair = get_topology("v5p:2x2x1").links((Segment(0, 2, 1),))
    assert collectives.all_to_all(1e8, 2, pair.collective_bw_bytes_per_s, 0.0) == pytest.approx(0.5e8 / 9e10)
    # the same whole array over twice the devices: each holds half, the time does not move
    assert collectives.all_to_all(0.5e8, 8, 1.8e11, 0.0) == pytest.approx(1e8 * 4 / (4 * 1.8e11))


def test_ring_step_on_a_line_pays_the_closing_hop():
    wrapped = get_topology("v5p:4x4x8").links((Segment(2, 8, 1),))
    line = get_topology("v5p:2x2x2").links((Segment(2, 2, 1), Segment(1, 2, 1), Segment(0, 2, 1)))
    assert wrapped.ring_latency_s == pytest.approx(1e-6)
    assert line.ring_latency_s == pytest.approx(1e-6)  # every 2-long segment is its own neighbour
    long_line = get_topology("v5e:8x8").links((Segment(1, 8, 1),))
    assert long_line.ring_latency_s == pytest.approx(7e-6)
    assert collectives.ppermute(9e8, wrapped.ring_bw_bytes_per_s, wrapped.ring_latency_s) == pytest.approx(0.01 + 1e-6)


def test_devices_of_a_chip_share_its_links_and_contiguous_segments_merge():
    tpu7x = get_topology("tpu7x:4x4x4")
    alone = tpu7x.links((Segment(2, 4, 1),))  # an axis on z only: the two cores of a chip share z's links
    spanning = tpu7x.links((Segment(3, 2, 1), Segment(2, 4, 1)))  # core and z together
    assert alone.collective_bw_bytes_per_s == pytest.approx(2 * 1e11 / 2)
    assert spanning.collective_bw_bytes_per_s == pytest.approx(2 * 1e11 + 6e11)
    v5p = get_topology("v5p:4x4x8")
    split = v5p.links((Segment(2, 2, 1), Segment(2, 4, 2)))  # z as 2 then 4: the whole wrapped z
    assert split.collective_bw_bytes_per_s == v5p.links((Segment(2, 8, 1),)).collective_bw_bytes_per_s == 1.8e11


def test_axis_segments_walk_from_the_inside():
    segs = axis_segments((8, 16), (4, 4, 8))
    assert segs == ((Segment(1, 2, 2), Segment(0, 4, 1)), (Segment(2, 8, 1), Segment(1, 2, 1)))
    assert axis_segments((3, 8), (4, 6)) is None


def test_spans_tile_where_every_boundary_divides_the_next():
    # device order of 4 × 4 × 8: dimension boundaries 1, 8, 32, 128
    assert tiles((8, 16), (4, 4, 8))  # axis boundaries 1, 16, 128: 1 | 8 | 16 | 32 | 128
    assert not tiles((3, 8), (4, 6))  # 8 and 6 divide neither way
    assert not tiles((16,), (6, 4))  # 16 and the next boundary, 24
    assert tiles((2,), (3, 2))  # the outer dimension is not reached
    assert not tiles((4, 4), (2, 2))  # more positions than devices
    # positions 2 to 32 of 4 × 4 × 8: z from its second position (4 at stride 2), then the whole of y
    assert span_segments(2, 32, (4, 4, 8)) == (Segment(2, 4, 2), Segment(1, 4, 1))
    assert span_segments(2, 16, (4, 4, 8)) == (Segment(2, 4, 2), Segment(1, 2, 1))
    assert span_segments(1, 128, (4, 4, 8)) == (Segment(2, 8, 1), Segment(1, 4, 1), Segment(0, 4, 1))


def test_measured_chip_row_loads_from_a_directory(tmp_path, monkeypatch):
    row = get_chip("v5p").to_dict()
    row.update(name="mygpu", kind="gpu", peak_bf16_flops_per_s=9.89e14)
    (tmp_path / "mygpu.json").write_text(json.dumps(row))
    monkeypatch.setenv(CHIP_DIR_ENV, str(tmp_path))
    assert get_chip("mygpu").peak_bf16_flops_per_s == 9.89e14
    # a measured row replaces a cited one of the same name, in topologies already parsed too
    before = get_topology("cpu:8").chip.peak_bf16_flops_per_s
    measured = tmp_path / "measured"
    measured.mkdir()
    (measured / "cpu.json").write_text(json.dumps(dict(get_chip("cpu").to_dict(), peak_bf16_flops_per_s=before * 3)))
    monkeypatch.setenv(CHIP_DIR_ENV, str(measured))
    assert get_topology("cpu:8").chip.peak_bf16_flops_per_s == before * 3
    assert load_chip(tmp_path / "mygpu.json").name == "mygpu"
    del row["hbm_bw_bytes_per_s"]
    (tmp_path / "broken.json").write_text(json.dumps(row))
    with pytest.raises(CpplanError, match="missing fields \\['hbm_bw_bytes_per_s'\\]"):
        load_chip(tmp_path / "broken.json")


def test_per_device_figures_split_the_chip():
    tpu7x = get_topology("tpu7x:2x2x1")
    assert tpu7x.peak_flops_per_device == 2307e12 / 2
    cpu4, cpu8 = get_topology("cpu:4"), get_topology("cpu:8")
    assert cpu4.hbm_bytes_per_device == 2 * cpu8.hbm_bytes_per_device
    assert math.isclose(cpu4.peak_flops_per_device, 2 * cpu8.peak_flops_per_device)
