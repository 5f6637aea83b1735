"""Fits a chip row's figures for XLA's own grouped matmul (`jax.lax.ragged_dot`, the kernel cpplan's runtime
runs its experts with) to timings of it on the chip, prints model against measured, and with `--write`
writes the figures and their sources into the chip's row (cost_models/data/chips/<chip>.json).

The timings are benchmarks/tpu_grouped_matmul.py's (one JSON line per call: groups, rows per group, contract
and output widths, the forward's seconds and the backward's, its input and weight gradients together). The
model is the one `Chip.grouped_matmul_seconds` prices tokamax's kernel with (regenerate/fit_grouped_matmul.py),
its five figures fitted anew by least squares on relative error: each call's forward against the forward's
model, its backward against the input gradient's model (a forward of the transposed matrices) plus the
weight gradient's. The benchmark times each call alone, waited for, so its forward holds one dispatch of a
jitted call on the host (its backward, a difference of two such times, holds none): the median dispatch
latency measured on the same chip (benchmarks/results/tpu_<chip>/dispatch_latency.txt) is taken off each
forward, as a program's ragged dots pay no dispatch of their own. Calls whose widths are not multiples
of the 128 lanes are left out of the fit; their median measured/model ratio is the row's
`ragged_dot_unaligned_slowdown`.

With `--layer`, benchmarks/tpu_moe_layer.py's timings of the runtime's whole MoE MLP in parts give the row's
`ragged_dot_permute_passes`: the part without the experts' matmuls (route, permute, unpermute and combine,
forward and backward) as HBM passes over the routed copies (tokens × top k × hidden, bf16) at the row's
bandwidth, a third of it per forward (as the price counts the backward twice the forward), the median over
the timed chunk sizes. The router's matmul, priced apart, is in that time too (about 1 % of it for 8 experts).

    python regenerate/fit_ragged_dot.py --chip v5e benchmarks/results/tpu_v5e/grouped_matmul*.jsonl [--write]

The printed report is benchmarks/results/kernels/ragged_dot_<chip>.txt.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rows: --write edits them
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fit_grouped_matmul import FIGURES, LOWER, SCALE, START, UPPER, rms, write_rows  # noqa: E402

from cost_models.chips import RAGGED_DOT_FIELDS, Chip, ChipKind, GroupedKernel, get_chip  # noqa: E402
from cost_models.models import get_model  # noqa: E402
from cost_models.pricing.experts import PERMUTE_PASSES  # noqa: E402
from validation.kernel_fits import PRECISION  # noqa: E402

KERNEL = "ragged_dot"  # the benchmark's name for jax.lax.ragged_dot
FITTED = RAGGED_DOT_FIELDS[:5]  # in FIGURES' order: efficiency, group rows, seconds per group, weight grad's two
UNALIGNED = RAGGED_DOT_FIELDS[5]
PERMUTE = "ragged_dot_permute_passes"
assert [f.removeprefix("ragged_dot_") for f in FITTED] == [f.removeprefix("grouped_matmul_") for f in FIGURES]


@dataclass(frozen=True)
class Call:
    """One timed ragged dot: its shape and the forward's and backward's seconds."""

    groups: int
    rows_per_group: int
    contract: int
    out: int
    forward_s: float
    backward_s: float
    source: str  # the timing file's name

    @property
    def rows(self) -> int:
        return self.groups * self.rows_per_group

    @property
    def aligned(self) -> bool:
        return self.contract % ChipKind.TPU.lanes == 0 and self.out % ChipKind.TPU.lanes == 0

    @property
    def label(self) -> str:
        return f"{self.groups}x{self.rows_per_group} K={self.contract} N={self.out}"


def dispatch_latency(path: Path) -> float:
    """The median of the dispatch latencies (`dispatch   523 µs`) a dispatch-latency report lists, seconds."""
    values = [float(m) * 1e-6 for m in re.findall(r"dispatch\s+([\d.]+) µs", path.read_text())]
    if not values:
        raise SystemExit(f"{path}: no `dispatch N µs` line; write it with the chip's dispatch-latency benchmark")
    return statistics.median(values)


def read_calls(paths: list[Path], dispatch_s: float) -> list[Call]:
    """The ragged-dot calls the files timed, each forward less one dispatch (other kernels and calls that
    failed are skipped)."""
    calls = []
    for path in paths:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("kernel") != KERNEL or "measured" not in row:
                continue
            m = row["measured"]
            calls.append(
                Call(
                    row["groups"],
                    row["rows_per_group"],
                    row["contract"],
                    row["out"],
                    m["forward_s"] - dispatch_s,
                    m["backward_s"],
                    path.name,
                )
            )
    return calls


def modelled(chip: Chip, c: Call) -> tuple[float, float]:
    """The row's forward and backward (input gradient + weight gradient) of the call, XLA's figures."""
    kernel = GroupedKernel.XLA_RAGGED_DOT
    forward = chip.grouped_matmul_seconds(c.groups, c.rows, c.contract, c.out, kernel=kernel)
    backward = chip.grouped_matmul_seconds(c.groups, c.rows, c.out, c.contract, kernel=kernel)
    backward += chip.grouped_matmul_seconds(c.groups, c.rows, c.contract, c.out, weight_grad=True, kernel=kernel)
    return forward, backward


def errors_of(chip: Chip, calls: list[Call]) -> np.ndarray:
    """Relative errors, forward and backward of each call in turn."""
    return np.array(
        [e for c in calls for e in np.divide(modelled(chip, c), (c.forward_s, c.backward_s)) - 1], dtype=float
    )


def ratios(chip: Chip, calls: list[Call]) -> list[float]:
    """Each call's measured time over the row's, forward and backward together."""
    return [sum((c.forward_s, c.backward_s)) / sum(modelled(chip, c)) for c in calls]


def without_slowdown(chip: Chip) -> Chip:
    """The row's model of a lane-aligned call: its written unaligned slowdown left out."""
    return dataclasses.replace(chip, **{UNALIGNED: 1.0})


def fit(chip: Chip, calls: list[Call]) -> Chip:
    """The row with the five figures that best explain the lane-aligned `calls` and their unaligned slowdown."""

    aligned_model = without_slowdown(chip)

    def trial(q) -> Chip:
        return dataclasses.replace(aligned_model, **{n: float(v) for n, v in zip(FITTED, np.asarray(q) * SCALE)})

    aligned = [c for c in calls if c.aligned]
    start, lower, upper = (np.array(v) / SCALE for v in (START, LOWER, UPPER))
    solution = least_squares(lambda q: errors_of(trial(q), aligned), start, bounds=(lower, upper))
    fitted = dataclasses.replace(
        trial(solution.x), **{n: float(f"{getattr(trial(solution.x), n):.{PRECISION}g}") for n in FITTED}
    )
    unaligned = ratios(fitted, [c for c in calls if not c.aligned])
    slowdown = float(f"{statistics.median(unaligned):.{PRECISION}g}") if unaligned else 1.0
    return dataclasses.replace(fitted, **{UNALIGNED: slowdown})


def sources_of(chip: Chip, calls: list[Call], dispatch_s: float) -> dict[str, str]:
    aligned = [c for c in calls if c.aligned]
    unaligned = [c for c in calls if not c.aligned]
    errors = errors_of(chip, aligned)
    worst = int(np.argmax(np.abs(errors)))
    files = ", ".join(sorted({c.source for c in calls}))
    how = (
        f"fitted to jax.lax.ragged_dot timed on the chip by benchmarks/tpu_grouped_matmul.py (jax 0.10.2, "
        f"bf16; benchmarks/results/tpu_{chip.name}/{{{files}}}): {len(aligned)} lane-aligned calls, each its "
        f"forward and its backward (input + weight gradient), {min(c.rows_per_group for c in aligned)}-"
        f"{max(c.rows_per_group for c in aligned)} rows per group over {min(c.groups for c in aligned)}-"
        f"{max(c.groups for c in aligned)} groups, each forward less the chip's median dispatch latency "
        f"({dispatch_s * 1e6:.0f} µs, benchmarks/results/tpu_{chip.name}/dispatch_latency.txt), by least squares on "
        f"relative error (scipy least_squares, regenerate/fit_ragged_dot.py) in the model of "
        f"Chip.grouped_matmul_seconds; RMS error {rms(errors):.1%}, "
        f"largest {errors[worst]:+.0%} ({aligned[worst // 2].label} {('forward', 'backward')[worst % 2]})"
    )
    what = {
        "ragged_dot_efficiency": "XLA's ragged dot's MXU efficiency, of the per-device bf16 peak, forward and dgrad",
        "ragged_dot_group_rows": "rows of MXU work each group adds to the forward and dgrad",
        "ragged_dot_group_overhead_s": "seconds each group adds (all three forms)",
        "ragged_dot_weight_grad_efficiency": "the weight gradient's MXU efficiency, of the per-device bf16 peak",
        "ragged_dot_weight_grad_group_rows": "rows of MXU work each group adds to the weight gradient",
    }
    sources = {name: f"{how}. {text}" for name, text in what.items()}
    if unaligned:
        slow = ratios(without_slowdown(chip), unaligned)
        sources[UNALIGNED] = (
            f"the median measured/model ratio of the {len(unaligned)} calls of widths not multiples of 128 lanes "
            f"(" + ", ".join(sorted({f"K={c.contract} N={c.out}" for c in unaligned})) + f"), left out of the fit "
            f"({min(slow):.2f}-{max(slow):.2f}), same timings: {how.split(':')[0]}"
        )
    else:
        sources[UNALIGNED] = "1.0: no call of widths off the 128 lanes timed"
    return sources


def with_permute_passes(chip: Chip, layer: Path, model) -> tuple[Chip, str]:
    """The row with `ragged_dot_permute_passes` from a layer timing file, and the figure's source."""
    rows = [json.loads(line) for line in layer.read_text().splitlines()]
    rest = [r for r in rows if r["part"] == "rest"]
    if not rest or model.experts is None:
        raise SystemExit(f"{layer}: no `rest` part timed, or {model.name} has no experts: no permute passes to fit")
    bandwidth = chip.hbm_bw_bytes_per_s / chip.devices_per_chip
    passes = {
        r["tokens"]: r["forward_backward_s"]
        / 3
        * bandwidth
        / (r["tokens"] * model.experts.per_token * model.hidden * 2)
        for r in rest
    }
    value = float(f"{statistics.median(passes.values()):.{PRECISION}g}")
    source = (
        f"timed on the chip by benchmarks/tpu_moe_layer.py (jax 0.10.2, bf16; benchmarks/results/tpu_{chip.name}/"
        f"{layer.name}): the runtime's route, permute, unpermute and combine of {model.name} (hidden {model.hidden}, "
        f"{model.experts.count} experts, top {model.experts.per_token}), forward and backward, at "
        + ", ".join(f"{t} tokens {p:.1f}" for t, p in sorted(passes.items()))
        + f" passes over the routed copies at the row's HBM bandwidth, a third per forward; the median "
        f"(regenerate/fit_ragged_dot.py --layer), against {PERMUTE_PASSES} counted for one forward's copies"
    )
    return dataclasses.replace(chip, ragged_dot_permute_passes=value), source


def report(chip: Chip, calls: list[Call]) -> str:
    lines = [
        f"# XLA's ragged dot (jax.lax.ragged_dot, cpplan's runtime's expert matmuls) on {chip.name}: measured against",
        "# the row's model, max(2·(rows + groups·r)·K·N/(peak·e), bytes/hbm_bw) + groups·c",
        "# (Chip.grouped_matmul_seconds with kernel=xla_ragged_dot); fitted by regenerate/fit_ragged_dot.py.",
        "# Widths off the 128 lanes left out of the fit: their median ratio is ragged_dot_unaligned_slowdown.",
        "# Forwards less one dispatch each.",
        "figures: " + ", ".join(f"{n.removeprefix('ragged_dot_')}={getattr(chip, n):g}" for n in RAGGED_DOT_FIELDS),
    ]
    for c in sorted(calls, key=lambda c: (not c.aligned, c.groups, c.rows_per_group, c.contract, c.out)):
        forward, backward = modelled(chip, c)
        lines.append(
            f"  {'' if c.aligned else 'left out: '}{c.label:26} forward {c.forward_s * 1e3:7.3f} ms, model "
            f"{forward * 1e3:7.3f} ({forward / c.forward_s - 1:+6.1%}); backward {c.backward_s * 1e3:7.3f} ms, "
            f"model {backward * 1e3:7.3f} ({backward / c.backward_s - 1:+6.1%})"
        )
    aligned = [c for c in calls if c.aligned]
    lines.append(f"RMS over {len(aligned)} aligned calls' forward and backward: {rms(errors_of(chip, aligned)):.1%}")
    tokamax = dataclasses.replace(chip, **{n: 0.0 for n in FITTED})  # the row's tokamax figures in their place
    against = ratios(tokamax, aligned)
    lines.append(
        f"against the row's tokamax figures: measured/model median {statistics.median(against):.2f} "
        f"({min(against):.2f}-{max(against):.2f})"
    )
    if chip.ragged_dot_permute_passes:
        lines.append(
            f"route, permute, unpermute and combine: {chip.ragged_dot_permute_passes:g} HBM passes per forward"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chip", required=True, help="the chip row the timings were made on (e.g. v5e)")
    parser.add_argument("timings", nargs="+", type=Path, help="benchmarks/tpu_grouped_matmul.py's JSON lines")
    parser.add_argument("--dispatch", type=Path, help="the chip's dispatch-latency report (default its results')")
    parser.add_argument("--layer", type=Path, help="benchmarks/tpu_moe_layer.py's timings (the permute passes)")
    parser.add_argument("--model", help="the model --layer timed (a name or config.json)")
    parser.add_argument("--write", action="store_true", help="write the figures and sources into the chip row")
    parser.add_argument(
        "--out", type=Path, help="the report (default benchmarks/results/kernels/ragged_dot_<chip>.txt)"
    )
    args = parser.parse_args()
    latency = (
        args.dispatch
        or Path(__file__).resolve().parents[1] / "benchmarks/results" / f"tpu_{args.chip}/dispatch_latency.txt"
    )
    dispatch_s = dispatch_latency(latency)
    calls = read_calls(args.timings, dispatch_s)
    if not [c for c in calls if c.aligned]:
        parser.error(f"no lane-aligned {KERNEL} call in {[str(p) for p in args.timings]}: nothing to fit")
    chip = fit(get_chip(args.chip), calls)
    if args.layer:
        if not args.model:
            parser.error("--layer needs --model: the model whose MoE MLP it timed (its copies' bytes)")
        chip, passes_source = with_permute_passes(chip, args.layer, get_model(args.model))
    text = report(chip, calls)
    print(text, end="")
    out = (
        args.out
        or Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "kernels" / f"ragged_dot_{chip.name}.txt"
    )
    out.write_text(text)
    if args.write:
        figures = {n: getattr(chip, n) for n in RAGGED_DOT_FIELDS}
        sources = sources_of(chip, calls, dispatch_s)
        if args.layer:
            figures[PERMUTE], sources[PERMUTE] = chip.ragged_dot_permute_passes, passes_source
        write_rows({chip.name: {"figures": figures, "sources": sources}})


if __name__ == "__main__":
    main()
