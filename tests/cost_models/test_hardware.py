"""Chips, topologies and the collective formulas on them, checked by hand."""

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from grouped_fit_script import grouped_fit_script

from cost_models import collectives
from cost_models.chips import (
    CHIP_DIR,
    CHIP_DIR_ENV,
    DEFAULTED_FIELDS,
    GROUPED_MATMUL_FIELDS,
    get_chip,
    known_chips,
    load_chip,
)
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


# ---- fp8 peaks and grouped-matmul (mixture-of-experts) figures (regenerate/fit_grouped_matmul.py)

TPU_ROWS = ("v5p", "v5e", "v6e", "tpu7x")
FITTED = GROUPED_MATMUL_FIELDS[:5]  # the bf16 figures every TPU row has; the fp8 one only where fp8 is faster
UNALIGNED = "grouped_matmul_unaligned_slowdown"
UNALIGNED_MEASURED = ("v5p", "v6e", "tpu7x")  # tokamax 0.0.17 times K=N=2880 on these; not on v5e
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "kernels" / "grouped_matmul.json"


def _row(name: str):
    return load_chip(CHIP_DIR / f"{name}.json")


def test_fp8_peaks_are_the_documented_ones():
    tpu7x = _row("tpu7x")
    assert tpu7x.peak_fp8_flops_per_s == 4614e12 == 2 * tpu7x.peak_bf16_flops_per_s
    for name in ("v5p", "v6e"):  # fp8 at the bf16 rate: the Cloud TPU7x docs' comparison table
        chip = _row(name)
        assert chip.peak_fp8_flops_per_s == chip.peak_bf16_flops_per_s
        assert "Peak compute per chip (FP8)" in chip.sources["peak_fp8_flops_per_s"]
    for name in ("v5e", "cpu"):  # no fp8 rate documented (v5e) or measured (a host)
        assert _row(name).peak_fp8_flops_per_s == 0.0
    assert "fp8_ops_per_second 0" in _row("v5e").sources["peak_fp8_flops_per_s"]
    for name in (*TPU_ROWS, "cpu"):
        assert _row(name).sources.get("peak_fp8_flops_per_s"), f"{name}.peak_fp8_flops_per_s has no source"


@pytest.mark.parametrize("name", TPU_ROWS)
def test_grouped_matmul_figures_are_fitted_sourced_and_in_range(name):
    chip = _row(name)
    assert 0.4 < chip.grouped_matmul_efficiency <= 1.0
    assert 0.4 < chip.grouped_matmul_weight_grad_efficiency <= 1.0
    assert 64 <= chip.grouped_matmul_group_rows <= 1024  # about a row tile of megablox's kernel per group
    assert 64 <= chip.grouped_matmul_weight_grad_group_rows <= 1024
    assert 1e-7 < chip.grouped_matmul_group_overhead_s < 1e-5
    for field in FITTED:
        source = chip.sources[field]
        assert "pallas_mosaic_tpu_ragged_dot.json" in source and "tokamax 0.0.17" in source
        assert "RMS error" in source and "calls" in source and "least squares" in source
    # the kernel runs on one of v5p's two TensorCores: under half the megacore device's peak
    assert (chip.grouped_matmul_efficiency < 0.5) == (name == "v5p")
    assert chip.sources["grouped_matmul_fp8_efficiency"]
    if name == "tpu7x":
        assert 0.2 < chip.grouped_matmul_fp8_efficiency <= 1.0
        assert "fp8 calls" in chip.sources["grouped_matmul_fp8_efficiency"]
    else:  # fp8 no faster than bf16 there: priced with the bf16 figures
        assert chip.grouped_matmul_fp8_efficiency == 0.0


@pytest.mark.parametrize("name", TPU_ROWS)
def test_unaligned_slowdown_is_measured_and_sourced(name):
    chip = _row(name)
    slowdown, source = chip.grouped_matmul_unaligned_slowdown, chip.sources[UNALIGNED]
    assert "tokamax 0.0.17" in source and "pallas_mosaic_tpu_ragged_dot.json" in source
    if name not in UNALIGNED_MEASURED:
        assert slowdown == 1.0 and "not measured" in source
        return
    # the median of the 3 calls at K=N=2880 (forward, dgrad, weight gradient), the only unaligned width timed
    assert "Only K=2880 N=2880 measured" in source and "the median" in source and "3 calls" in source
    assert "spread" in source and "Not a padding rule" in source
    assert slowdown > 1.2  # v5p 1.27; v6e and tpu7x about 2
    if name == "tpu7x":
        assert 1.8 < slowdown < 2.2
    # the median of the three calls' ratios, which its source lists per form
    ratios = [float(r) for r in re.findall(r"(?:forward|dgrad|weight grad) (\d\.\d{3})", source)]
    assert len(ratios) == 3 and min(ratios) <= slowdown <= max(ratios)
    assert slowdown == pytest.approx(sorted(ratios)[1], abs=1e-3)
    # padding the widths to 128 or to the MXU tile leaves most of it: the source says by how much
    padded = [float(x) for x in re.findall(r"leaves the calls (\d\.\d\d)", source)]
    assert padded and all(1.1 < x < slowdown for x in padded)


@pytest.mark.parametrize("name", UNALIGNED_MEASURED)
def test_an_unaligned_width_costs_the_measured_slowdown(name):
    chip = _row(name)
    aligned = dataclasses.replace(chip, grouped_matmul_unaligned_slowdown=1.0)
    slowdown = chip.grouped_matmul_unaligned_slowdown
    # GPT-OSS's 2880 (the width measured), Gemma's 704 and 2816, one width or both, all three forms
    for k, n in ((2880, 2880), (2816, 704), (704, 2816), (4096, 2880), (2880, 4096)):
        for weight_grad in (False, True):
            seconds = chip.grouped_matmul_seconds(128, 327680, k, n, weight_grad=weight_grad)
            assert seconds == pytest.approx(
                slowdown * aligned.grouped_matmul_seconds(128, 327680, k, n, weight_grad=weight_grad)
            )
            assert seconds > 1.2 * aligned.grouped_matmul_seconds(128, 327680, k, n, weight_grad=weight_grad)
    # widths of whole lanes are priced as fitted, however little they exceed an unaligned one
    for k, n in ((2944, 2944), (3072, 3072), (768, 2816 + 128)):
        assert chip.grouped_matmul_seconds(128, 327680, k, n) == aligned.grouped_matmul_seconds(128, 327680, k, n)
    # not a padding rule: 2880 costs more than 2944 (its width padded to 128 lanes) or 3072 (to 256)
    assert chip.grouped_matmul_seconds(128, 327680, 2880, 2880) > chip.grouped_matmul_seconds(128, 327680, 3072, 3072)


def test_rows_hold_the_grouped_matmul_fit_the_script_printed():
    fits = json.loads(RESULTS.read_text())
    assert sorted(fits) == sorted(TPU_ROWS)
    for name, fit in fits.items():
        row = json.loads((CHIP_DIR / f"{name}.json").read_text())
        assert set(fit["figures"]) == set(GROUPED_MATMUL_FIELDS)
        for field, value in fit["figures"].items():
            assert row[field] == value, f"{name}.{field}: run python regenerate/fit_grouped_matmul.py --write"
            assert row["sources"][field] == fit["sources"][field]


def test_grouped_matmul_seconds_by_hand():
    chip = dataclasses.replace(
        _row("tpu7x"),
        grouped_matmul_efficiency=0.7,
        grouped_matmul_group_rows=300.0,
        grouped_matmul_group_overhead_s=2e-6,
        grouped_matmul_weight_grad_efficiency=0.6,
        grouped_matmul_weight_grad_group_rows=400.0,
        grouped_matmul_fp8_efficiency=0.5,
    )
    peak, hbm = 2307e12 / 2, 7.38e12 / 2  # one TensorCore of a TPU7x
    # 256 experts of 1024 rows each, 7168 → 2048: the MXU bounds it
    math = 2 * (262144 + 256 * 300) * 7168 * 2048 / (peak * 0.7)
    assert chip.grouped_matmul_seconds(256, 262144, 7168, 2048) == pytest.approx(math + 256 * 2e-6)
    math = 2 * (262144 + 256 * 400) * 7168 * 2048 / (peak * 0.6)
    assert chip.grouped_matmul_seconds(256, 262144, 7168, 2048, weight_grad=True) == pytest.approx(math + 256 * 2e-6)
    math = 2 * (262144 + 256 * 300) * 7168 * 2048 / (2 * peak * 0.5)  # fp8: its own peak and efficiency
    assert chip.grouped_matmul_seconds(256, 262144, 7168, 2048, fp8=True) == pytest.approx(math + 256 * 2e-6)
    # 64 experts of 8 rows: reading the experts' matrices once bounds it where a group's padding is short
    # of the ridge point (1153.5e12 · 0.7 / 3.69e12 = 219 rows); 1 byte each in fp8
    short = dataclasses.replace(chip, grouped_matmul_group_rows=100.0)
    moved = 2 * 512 * (7168 + 2048) + 2 * 64 * 7168 * 2048
    assert short.grouped_matmul_seconds(64, 512, 7168, 2048) == pytest.approx(moved / hbm + 64 * 2e-6)
    moved = 2 * 512 * (7168 + 2048) + 64 * 7168 * 2048
    math = 2 * (512 + 64 * 100) * 7168 * 2048 / (2 * peak * 0.5)
    assert moved / hbm > math
    assert short.grouped_matmul_seconds(64, 512, 7168, 2048, fp8=True) == pytest.approx(moved / hbm + 64 * 2e-6)
    # at r = 300 the padded tiles outlast the read
    math = 2 * (512 + 64 * 300) * 7168 * 2048 / (peak * 0.7)
    assert chip.grouped_matmul_seconds(64, 512, 7168, 2048) == pytest.approx(math + 64 * 2e-6)
    # a width that is not a multiple of 128 lanes: the whole time, MXU and per-group, times the slowdown
    slow = dataclasses.replace(chip, grouped_matmul_unaligned_slowdown=1.5)
    math = 2 * (262144 + 256 * 300) * 2816 * 704 / (peak * 0.7)
    assert slow.grouped_matmul_seconds(256, 262144, 2816, 704) == pytest.approx(1.5 * (math + 256 * 2e-6))
    math = 2 * (262144 + 256 * 400) * 704 * 2816 / (peak * 0.6)
    assert slow.grouped_matmul_seconds(256, 262144, 704, 2816, weight_grad=True) == pytest.approx(
        1.5 * (math + 256 * 2e-6)
    )
    math = 2 * (262144 + 256 * 300) * 2880 * 2048 / (2 * peak * 0.5)  # one width unaligned is enough; fp8 too
    assert slow.grouped_matmul_seconds(256, 262144, 2880, 2048, fp8=True) == pytest.approx(1.5 * (math + 256 * 2e-6))
    math = 2 * (262144 + 256 * 300) * 7168 * 2048 / (peak * 0.7)
    assert slow.grouped_matmul_seconds(256, 262144, 7168, 2048) == pytest.approx(math + 256 * 2e-6)


@pytest.mark.parametrize("name", TPU_ROWS)
def test_fewer_rows_per_group_cost_more_per_flop(name):
    chip = _row(name)
    per_flop = [
        chip.grouped_matmul_seconds(rows_total // group_rows, rows_total, 4096, 1536) / (2 * rows_total * 4096 * 1536)
        for rows_total, group_rows in ((131072, 256), (131072, 1024), (524288, 4096))
    ]
    assert per_flop[0] > per_flop[1] > per_flop[2]
    dense = 1 / (chip.peak_bf16_flops_per_s / chip.devices_per_chip * chip.matmul_efficiency)
    assert per_flop[-1] > dense * 0.95  # the grouped kernel is no faster than the row's dense matmul


def test_a_measured_row_without_the_new_fields_loads_and_prices_dense(tmp_path):
    row = get_chip("cpu").to_dict()
    for field in DEFAULTED_FIELDS:
        del row[field]
        del row["sources"][field]
    (tmp_path / "old.json").write_text(json.dumps(row))
    old = load_chip(tmp_path / "old.json")
    assert old.peak_fp8_flops_per_s == 0.0 and all(getattr(old, f) == 0.0 for f in GROUPED_MATMUL_FIELDS[:6])
    assert old.grouped_matmul_unaligned_slowdown == 1.0  # not measured: no slowdown
    # not measured: a grouped matmul is the dense one at the row's matmul efficiency, no per-group cost
    peak = old.peak_bf16_flops_per_s / old.devices_per_chip
    math = 2 * 65536 * 2048 * 1024 / (peak * old.matmul_efficiency)
    moved = (2 * 65536 * (2048 + 1024) + 2 * 16 * 2048 * 1024) / (old.hbm_bw_bytes_per_s / old.devices_per_chip)
    assert old.grouped_matmul_seconds(16, 65536, 2048, 1024) == pytest.approx(max(math, moved))
    assert old.grouped_matmul_seconds(16, 65536, 2048, 1024, weight_grad=True) == pytest.approx(max(math, moved))
    # a TPU row written before the unaligned slowdown loads at 1.0: an unaligned width priced as an aligned one
    row = get_chip("tpu7x").to_dict()
    del row[UNALIGNED], row["sources"][UNALIGNED]
    (tmp_path / "tpu.json").write_text(json.dumps(row))
    tpu = load_chip(tmp_path / "tpu.json")
    assert tpu.grouped_matmul_unaligned_slowdown == 1.0
    assert tpu.grouped_matmul_seconds(128, 327680, 2880, 2880) == pytest.approx(
        dataclasses.replace(get_chip("tpu7x"), grouped_matmul_unaligned_slowdown=1.0).grouped_matmul_seconds(
            128, 327680, 2880, 2880
        )
    )


@pytest.mark.parametrize(
    "change, words",
    [
        ({"grouped_matmul_efficiency": 1.5}, "grouped_matmul_efficiency=1.5 must be"),
        ({"grouped_matmul_group_rows": -1.0}, "grouped_matmul_group_rows=-1.0 must be"),
        ({"peak_fp8_flops_per_s": float("nan")}, "must be finite"),
        ({"peak_fp8_flops_per_s": 0.0, "grouped_matmul_fp8_efficiency": 0.5}, "fp8 peak"),
        ({"grouped_matmul_unaligned_slowdown": 0.0}, "grouped_matmul_unaligned_slowdown=0.0 must be > 0"),
        ({"grouped_matmul_unaligned_slowdown": float("inf")}, "must be finite"),
    ],
)
def test_bad_grouped_or_fp8_figures_are_refused(tmp_path, change, words):
    row = dict(get_chip("tpu7x").to_dict(), **change)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(row))
    with pytest.raises(CpplanError, match=re.escape(words)):
        load_chip(path)


FORM_NUMBERS = {  # each form's ragged-dot dimension numbers, as tokamax writes them
    "forward": ([[[1], [1]], [[], []]], [0]),
    "dgrad": ([[[1], [2]], [[], []]], [0]),
    "weight_grad": ([[[0], [0]], [[], []]], []),
}
SHAPES = ((256, 256, 7168, 2048), (128, 1024, 4096, 1536), (64, 4096, 2048, 768), (8, 8, 4096, 4096))


def _timing_entries(chip, shapes, times_model: float = 1.0, tiles: str = '{"tile_m": null}') -> dict:
    """tokamax-format timings of `shapes` (groups, rows per group, K, N) in all three forms: the row's model
    times `times_model` (as the fastest config, `tiles`) and a config twice as slow."""
    entries = {}
    for groups, group_rows, k, n in shapes:
        rows = groups * group_rows
        for form, (dims, grouped) in FORM_NUMBERS.items():
            lhs, rhs = {
                "forward": (f"bf16[{rows},{k}]", f"bf16[{groups},{k},{n}]"),
                "dgrad": (f"bf16[{rows},{k}]", f"bf16[{groups},{n},{k}]"),
                "weight_grad": (f"bf16[{rows},{k}]", f"bf16[{rows},{n}]"),
            }[form]
            call = {
                "lhs": lhs,
                "rhs": rhs,
                "group_sizes": {"num_groups": groups, "total_size": rows},
                "ragged_dot_dimension_numbers": {"dot_dimension_numbers": dims, "rhs_group_dimensions": grouped},
                "return_residuals": False,
            }
            seconds = chip.grouped_matmul_seconds(groups, rows, k, n, weight_grad=form == "weight_grad")
            times = [seconds * times_model * 1e3] * 5
            entries[json.dumps(call)] = {
                tiles: {"evaluation_times_ms": times},
                '{"tile_m": 128}': {"evaluation_times_ms": [2 * t for t in times]},  # the slower config is not used
            }
    return entries


def test_the_fit_recovers_figures_from_timings_built_by_hand(tmp_path):
    """tokamax-format timings made by the model from known figures: the reader finds each call's form and
    widths, and the fit gives the figures back."""
    script = grouped_fit_script()
    truth = dict(zip(script.FIGURES, (0.72, 350.0, 2e-6, 0.65, 380.0)))
    chip = dataclasses.replace(_row("tpu7x"), **truth)
    path = tmp_path / "pallas_mosaic_tpu_ragged_dot.json"
    path.write_text(json.dumps(_timing_entries(chip, SHAPES)))
    timings = script.read_grouped(path)
    assert sorted({t.form for t in timings}) == ["dgrad", "forward", "weight_grad"] and len(timings) == 12
    assert all((t.contract, t.out) in {(7168, 2048), (4096, 1536), (2048, 768), (4096, 4096)} for t in timings)
    assert all(t.config == '{"tile_m": null}' for t in timings)  # the fastest config's
    values, errors = script.fit(_row("tpu7x"), timings)
    assert np.max(np.abs(errors)) < 1e-6
    assert values == pytest.approx(tuple(truth.values()), rel=1e-3)


def test_the_fit_measures_the_unaligned_slowdown_from_timings_built_by_hand(tmp_path):
    """A tokamax package whose unaligned calls (K=N=2880) take 1.8x the aligned model's time: the fit leaves
    them out of the other figures, gives 1.8 back as the row's slowdown, and tests padding against it."""
    script = grouped_fit_script()
    truth = dict(zip(script.FIGURES, (0.72, 350.0, 2e-6, 0.65, 380.0)), grouped_matmul_unaligned_slowdown=1.0)
    chip = dataclasses.replace(_row("tpu7x"), **truth)
    entries = _timing_entries(chip, SHAPES + ((128, 2048, 4096, 2048),))
    tiles = '{"tile_m": 512, "tile_k": 2944, "tile_n": 1536}'
    entries.update(_timing_entries(chip, ((128, 2560, 2880, 2880),), times_model=1.8, tiles=tiles))
    site = tmp_path / "site-packages"
    (site / "tokamax-0.0.17.dist-info").mkdir(parents=True)
    (site / "tokamax-0.0.17.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tokamax\nVersion: 0.0.17\n"
    )
    base = site / "tokamax" / "data" / "autotuning"
    (base / "tpu7x").mkdir(parents=True)
    (base / "tpu7x" / "pallas_mosaic_tpu_ragged_dot.json").write_text(json.dumps(entries))
    fit = script.fit_chip("tpu7x", "tpu7x", base)
    assert len(fit.calls) == 15 and [(t.form, t.contract, t.out) for t in fit.unaligned] == [
        (form, 2880, 2880) for form in script.FORMS
    ]
    assert np.max(np.abs(fit.errors)) < 1e-3  # the aligned figures, fitted without the slow calls
    assert fit.chip.grouped_matmul_unaligned_slowdown == pytest.approx(1.8, rel=1e-3)
    assert all(fit.error(t) == pytest.approx(0, abs=2e-3) for t in fit.unaligned)  # the row's model, slowdown in
    # padded widths cost more in the model, so they leave less of the slowdown: each rule between 1 and 1.8
    padding = fit.padding()
    assert sorted(padding) == ["to a multiple of 128", "to the MXU tile (256)", "to the fastest config's tiles"]
    assert all(1.0 < r < 1.8 for ratios in padding.values() for r in ratios)
    assert padding["to a multiple of 128"] == pytest.approx([1.8 * (2880 / 2944) ** 2] * 3, rel=2e-3)
    sources = script.sources_of(fit)
    text = sources["grouped_matmul_unaligned_slowdown"]
    assert text.startswith("1.8: the median") and "Only K=2880 N=2880 measured" in text and "3 calls" in text
    assert "tokamax 0.0.17 (installed package): tokamax/data/autotuning/tpu7x/pallas_mosaic_tpu_ragged_dot.json" in text
    assert "2944x1536" in text and "Not a padding rule" in text
    assert "1.80x (median) the time this model gives them" in sources["grouped_matmul_efficiency"]
    # a chip with no unaligned call keeps 1.0, said to be not measured
    (base / "tpu7x" / "pallas_mosaic_tpu_ragged_dot.json").write_text(json.dumps(_timing_entries(chip, SHAPES)))
    fit = script.fit_chip("tpu7x", "tpu7x", base)
    assert fit.chip.grouped_matmul_unaligned_slowdown == 1.0
    assert script.sources_of(fit)["grouped_matmul_unaligned_slowdown"].startswith("1.0: not measured")
