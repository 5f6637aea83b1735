"""A chip row's figures for XLA's ragged dot (cpplan's runtime's expert matmuls) and its measured permute
passes: the kernel a price uses is its target's, a row that has not measured XLA's takes tokamax's figures,
and the v5e row holds what regenerate/fit_ragged_dot.py fits to the chip's own timings."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from cost_models.chips import CHIP_DIR, RAGGED_DOT_FIELDS, GroupedKernel, load_chip
from cost_models.targets import TRAITS, Target

ROOT = Path(__file__).resolve().parents[2]
V5E = ROOT / "benchmarks" / "results" / "tpu_v5e"


def _row(name: str):
    return load_chip(CHIP_DIR / f"{name}.json")


def test_xla_figures_price_by_hand():
    chip = dataclasses.replace(
        _row("v5e"),
        ragged_dot_efficiency=0.5,
        ragged_dot_group_rows=100.0,
        ragged_dot_group_overhead_s=1e-5,
        ragged_dot_weight_grad_efficiency=0.8,
        ragged_dot_weight_grad_group_rows=200.0,
        ragged_dot_unaligned_slowdown=1.25,
    )
    peak = chip.peak_bf16_flops_per_s  # one device per v5e chip
    xla = GroupedKernel.XLA_RAGGED_DOT
    # 8 experts of 1024 rows, 2048 → 1024: the MXU bounds it (8192 rows read are far under the math)
    math = 2 * (8192 + 8 * 100) * 2048 * 1024 / (peak * 0.5)
    assert chip.grouped_matmul_seconds(8, 8192, 2048, 1024, kernel=xla) == pytest.approx(math + 8 * 1e-5)
    math = 2 * (8192 + 8 * 200) * 2048 * 1024 / (peak * 0.8)
    assert chip.grouped_matmul_seconds(8, 8192, 2048, 1024, weight_grad=True, kernel=xla) == pytest.approx(
        math + 8 * 1e-5
    )
    math = 2 * (8192 + 8 * 100) * 2880 * 1024 / (peak * 0.5)  # 2880 is off the 128 lanes
    assert chip.grouped_matmul_seconds(8, 8192, 2880, 1024, kernel=xla) == pytest.approx(1.25 * (math + 8 * 1e-5))
    # tokamax's figures are the row's own, untouched by XLA's
    assert chip.grouped_matmul_seconds(8, 8192, 2048, 1024) == _row("v5e").grouped_matmul_seconds(8, 8192, 2048, 1024)


def test_a_row_without_xla_figures_prices_it_as_tokamax():
    tpu7x = _row("tpu7x")
    assert not tpu7x.measures(GroupedKernel.XLA_RAGGED_DOT) and tpu7x.measures(GroupedKernel.TOKAMAX)
    for weight_grad in (False, True):
        assert tpu7x.grouped_matmul_seconds(
            32, 65536, 7168, 2048, weight_grad=weight_grad, kernel=GroupedKernel.XLA_RAGGED_DOT
        ) == tpu7x.grouped_matmul_seconds(32, 65536, 7168, 2048, weight_grad=weight_grad)


def test_targets_price_the_kernel_they_run():
    assert TRAITS[Target.CPPLAN].grouped_kernel is GroupedKernel.XLA_RAGGED_DOT  # runtime/experts.py's ragged_dot
    assert TRAITS[Target.MAXTEXT].grouped_kernel is GroupedKernel.TOKAMAX


def test_permute_passes_only_for_xla():
    from cost_models.models import get_model
    from cost_models.pricing.experts import PERMUTE_PASSES, dispatch_bytes, price_experts
    from planner import explain
    from planner.estimate import candidates_of

    plan = explain(get_model(ROOT / "benchmarks/tpu_v5e/mixtral-4l-e8.json"), "8k", "v5e:1x1").best
    x = candidates_of(plan)
    chip = x.topology.chip
    assert chip.ragged_dot_permute_passes > PERMUTE_PASSES  # measured on the chip: XLA's gathers and scatters
    moved = dispatch_bytes(x) / x.topology.hbm_bw_per_device
    xla = price_experts(x, kernel=GroupedKernel.XLA_RAGGED_DOT).permute_s
    tokamax = price_experts(x, kernel=GroupedKernel.TOKAMAX).permute_s
    assert xla == pytest.approx(chip.ragged_dot_permute_passes * moved)
    assert tokamax == pytest.approx(PERMUTE_PASSES * moved)


def test_v5e_row_holds_the_fit_of_its_own_timings(tmp_path):
    """The fit script, run on the results it cites, writes exactly the row's figures (the row is current)."""
    script = ROOT / "regenerate" / "fit_ragged_dot.py"
    out = tmp_path / "report.txt"
    args = [sys.executable, str(script), "--chip", "v5e", str(V5E / "grouped_matmul.jsonl")]
    args += [str(V5E / "grouped_matmul_mixtral_4l.jsonl"), "--layer", str(V5E / "moe_layer.jsonl")]
    args += ["--model", str(ROOT / "benchmarks/tpu_v5e/mixtral-4l-e8.json"), "--out", str(out)]
    subprocess.run(args, check=True, capture_output=True, cwd=ROOT)
    row = _row("v5e")
    figures = dict(line.split("=") for line in out.read_text().split("figures: ")[1].splitlines()[0].split(", "))
    for field in RAGGED_DOT_FIELDS:
        assert float(figures[field.removeprefix("ragged_dot_")]) == pytest.approx(getattr(row, field), rel=1e-3), (
            f"v5e.{field}: run regenerate/fit_ragged_dot.py --write"
        )
    passes = float(out.read_text().split("combine: ")[1].split(" HBM")[0])
    assert passes == row.ragged_dot_permute_passes
