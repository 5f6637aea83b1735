"""Fits the TPU chip rows' grouped-matmul figures (a mixture-of-experts layer's expert matmuls) to
tokamax's measured ragged-dot timings, prints model against measured, and with `--write` writes the
figures and their sources into cost_models/data/chips/*.json.

tokamax ships the timings it measured while autotuning its Mosaic grouped-matmul kernels, one file per
kernel and device (`tokamax/data/autotuning/<device>/pallas_mosaic_tpu_ragged_dot.json` and
`..._v2_ragged_dot.json`): per call, the operand shapes, the group sizes (listed, or a row count that
tokamax spreads over the groups by uniform random routing) and the median time of each config tried.
The figures are fitted, per chip, in the model the row's `Chip.grouped_matmul_seconds` prices with:

    max(2·(rows + groups·r)·contract·out / (peak·e), bytes / hbm_bw) + groups·c

per device (tokamax times one JAX device: one TensorCore of a TPU7x), by least squares on relative
error over the forward (rows × [contract, out] per group), the gradient of its rows (the same kernel
against the transposed matrices) and the weight gradient (each group's [contract, out] summed over its
rows, with its own e and r), every call's fastest config. The kernel is tokamax's first one,
`pallas_mosaic_tpu_ragged_dot`: megablox's grouped matmul (a row tile per group boundary, as
MaxText's default `megablox=True` path runs it), the one kernel timed on all four chips and in all
three forms. The v2 kernel (MaxText's `use_gmm_v2`), timed on three chips and without weight
gradients, is fitted alone and reported beside it. fp8 calls (fp8 weights, rows quantized in the
kernel) fit an fp8 efficiency against the fp8 peak, the other figures held.

Calls whose contracted or output width is not a multiple of the TPU's 128 lanes are left out of that
fit: tokamax times one such width, K=N=2880 (GPT-OSS's experts), in all three forms on v5p, v6e and
TPU7x, and they run far slower than the aligned calls' model. Their median measured/model ratio is the
row's `grouped_matmul_unaligned_slowdown` (1.0 where no such call is timed), which
`Chip.grouped_matmul_seconds` multiplies the time of any unaligned call by. The report also prices them
with their widths padded, up to a multiple of 128, of the row's MXU tile and of the kernel's own tiles
(the fastest config's tile_k, tile_n): padding explains a few percent of the slowdown, not its bulk.

    python regenerate/fit_grouped_matmul.py --tokamax /path/to/site-packages/tokamax [--write]

The printed report is benchmarks/results/kernels/grouped_matmul.txt; the figures and sources also go
to grouped_matmul.json beside it (`--out` elsewhere).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

# this checkout's rows, whatever cpplan the interpreter has installed: --write edits them
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cost_models.chips import CHIP_DIR, GROUPED_MATMUL_FIELDS, Chip, ChipKind, load_chip  # noqa: E402
from validation.kernel_fits import (  # noqa: E402
    DEVICE_DIRS,
    MATMUL_FILES,
    PRECISION,
    RESULTS_DIR,
    find_file,
    installed_dir,
)

KERNEL, V2_KERNEL = (Path(name).stem for name in MATMUL_FILES)
FORMS = ("forward", "dgrad", "weight_grad")
LANES = ChipKind.TPU.lanes  # calls of widths not multiples of this are left out of the fit (reported apart)
# the fitted figures (the row's GROUPED_MATMUL_FIELDS but the fp8 one), their start and bounds
FIGURES = GROUPED_MATMUL_FIELDS[:5]
START = (0.7, 200.0, 1e-6, 0.6, 300.0)
LOWER, UPPER = (1e-3, 0.0, 0.0, 1e-3, 0.0), (1.0, 8192.0, 1e-4, 1.0, 8192.0)
SCALE = np.array([1.0, 100.0, 1e-6, 1.0, 100.0])  # parameters near 1 for the solver
TIED_BELOW = 4  # weight-gradient calls under which their rows per group are tied to the forward's
FP8_FIGURE = GROUPED_MATMUL_FIELDS[5]
UNALIGNED_FIGURE = "grouped_matmul_unaligned_slowdown"  # the median measured/model ratio of the calls left out
assert UNALIGNED_FIGURE in GROUPED_MATMUL_FIELDS


@dataclass(frozen=True)
class GroupedTiming:
    """One measured grouped matmul (its fastest config)."""

    kernel: str  # the timing file's stem
    form: str  # forward, dgrad or weight_grad
    dtype: str  # bf16, fp8 or fp4 (the weights'; rows are bf16)
    groups: int  # groups with at least one row
    rows: int
    contract: int
    out: int
    seconds: float
    generated: bool  # tokamax spread the rows over the groups (uniform routing), or listed them
    config: str = ""  # the fastest config, as the timing file writes it

    @property
    def group_rows(self) -> float:
        return self.rows / self.groups

    @property
    def flops(self) -> float:
        return 2.0 * self.rows * self.contract * self.out

    @property
    def label(self) -> str:
        spread = "routed" if self.generated else "listed"
        return (
            f"{self.form} {self.dtype} {self.groups}x~{self.group_rows:.0f} rows ({spread}) "
            f"K={self.contract} N={self.out}"
        )


def _weights(operand) -> str | None:
    """The dtype of an operand written `bf16[8,4096]`, or quantized ({qvalue: 'f8_e4m3fn[...]', scale: ...}),
    or to be quantized in the kernel ({value: 'bf16[...]', qtype: ...})."""
    if isinstance(operand, str):
        return operand.split("[")[0]
    # a quantized matrix holds its values in qvalue; rows quantized in the kernel keep theirs in value
    value = (operand.get("qvalue") or operand.get("value")) if isinstance(operand, dict) else None
    return value.split("[")[0] if isinstance(value, str) else None


def _dims(operand) -> list[int]:
    text = operand if isinstance(operand, str) else operand.get("value") or operand.get("qvalue")
    return [int(d) for d in re.fullmatch(r"\w+\[([\d,]*)\]", text).group(1).split(",") if d]


def read_grouped(path: Path) -> list[GroupedTiming]:
    """The plain calls of a ragged-dot timing file: no residuals, bias or fused activation; bf16 rows
    times bf16, fp8 or fp4 matrices (fp8/fp4 ones quantized, the rows quantized in the kernel)."""
    out = []
    for key, configs in json.loads(path.read_text()).items():
        call = json.loads(key)
        times = [
            (statistics.median(c["evaluation_times_ms"]) * 1e-3, config)
            for config, c in configs.items()
            if c.get("evaluation_times_ms")
        ]
        if not times or any(
            call.get(k) for k in ("return_residuals", "activation", "fuse_gateup_activation", "rhs_bias")
        ):
            continue
        lhs, rhs = _weights(call["lhs"]), _weights(call["rhs"])
        dtype = {"bf16": "bf16", "f8_e4m3fn": "fp8", "f8_e5m2": "fp8", "f4_e2m1fn": "fp4"}.get(rhs)
        if lhs != "bf16" or dtype is None:
            continue
        sizes = call["group_sizes"]
        if isinstance(sizes, dict):  # rows routed uniformly at random: every group is filled at these sizes
            groups, rows, generated = sizes["num_groups"], sizes["total_size"], True
        else:
            groups, rows, generated = sum(1 for s in sizes if s), sum(sizes), False
        if not groups:
            continue
        numbers = call["ragged_dot_dimension_numbers"]
        (lhs_contract, rhs_contract), _ = numbers["dot_dimension_numbers"]
        (l_dims, r_dims) = _dims(call["lhs"]), _dims(call["rhs"])
        if numbers["rhs_group_dimensions"]:  # [rows, K] · [groups, ., .] → [rows, N]
            form = "forward" if rhs_contract == [1] else "dgrad"
            grouped = numbers["rhs_group_dimensions"][0]
            contract = l_dims[lhs_contract[0]]
            out_dim = next(d for i, d in enumerate(r_dims) if i not in (rhs_contract[0], grouped))
        else:  # [rows, K]ᵀ · [rows, N] per group → [groups, K, N]
            form, contract, out_dim = "weight_grad", l_dims[1], r_dims[1]
        seconds, config = min(times)
        out.append(GroupedTiming(path.stem, form, dtype, groups, rows, contract, out_dim, seconds, generated, config))
    return out


def with_figures(chip: Chip, values) -> Chip:
    """The row with grouped-matmul figures `values` (FIGURES' order, the fp8 one last if given)."""
    names = FIGURES + (FP8_FIGURE,) if len(values) > len(FIGURES) else FIGURES
    return dataclasses.replace(chip, **{n: float(v) for n, v in zip(names, values)})


def model_seconds(chip: Chip, t: GroupedTiming) -> float:
    return chip.grouped_matmul_seconds(
        t.groups, t.rows, t.contract, t.out, weight_grad=t.form == "weight_grad", fp8=t.dtype == "fp8"
    )


def fit(chip: Chip, timings: list[GroupedTiming]) -> tuple[tuple[float, ...], np.ndarray]:
    """The figures that best explain `timings` (relative error, least squares) and each call's
    relative error. Timings without weight gradients leave the weight-gradient figures at their start;
    with fewer than `TIED_BELOW` weight gradients their rows per group are the forward's (two figures from
    two calls have no unique best: scipy releases part on them), their efficiency alone fitted."""
    tied = sum(t.form == "weight_grad" for t in timings) < TIED_BELOW
    free = [i for i in range(len(FIGURES)) if not (tied and FIGURES[i] == "grouped_matmul_weight_grad_group_rows")]

    def figures(q):
        p = np.array(START) / SCALE
        p[free] = q
        if tied:
            p[FIGURES.index("grouped_matmul_weight_grad_group_rows")] = p[FIGURES.index("grouped_matmul_group_rows")]
        return p * SCALE

    def residuals(q):
        trial = with_figures(chip, figures(q))
        return np.array([model_seconds(trial, t) / t.seconds - 1 for t in timings])

    start, lower, upper = (np.array(v)[free] / SCALE[free] for v in (START, LOWER, UPPER))
    solution = least_squares(residuals, start, bounds=(lower, upper))
    return tuple(float(v) for v in figures(solution.x)), solution.fun


def fit_fp8(chip: Chip, timings: list[GroupedTiming]) -> tuple[float, np.ndarray]:
    """The fp8 efficiency, of the fp8 peak, with the row's other grouped figures held."""

    def residuals(p):
        trial = dataclasses.replace(chip, grouped_matmul_fp8_efficiency=float(p[0]))
        return np.array([model_seconds(trial, t) / t.seconds - 1 for t in timings])

    solution = least_squares(residuals, [0.5], bounds=([1e-3], [1.0]))
    return float(solution.x[0]), solution.fun


def rms(errors) -> float:
    errors = np.asarray(errors, dtype=float)
    return float(np.sqrt(np.mean(errors**2))) if errors.size else float("nan")


def _round(value: float) -> float:
    return float(f"{value:.{PRECISION}g}")


def _blob(path: Path) -> str:
    """The file's git blob id: the bytes a checkout of tokamax would hold."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _forms_text(timings: list[GroupedTiming], errors) -> str:
    parts = []
    for form in FORMS:
        chosen = [e for t, e in zip(timings, errors) if t.form == form]
        if chosen:
            parts.append(f"{form.replace('_', ' ')} {len(chosen)} calls, {rms(chosen):.1%}")
    return "; ".join(parts)


def alternative_forms(chip: Chip, timings: list[GroupedTiming]) -> list[tuple[str, float]]:
    """RMS errors of simpler models over the same timings (forward and dgrad): why the fitted form."""
    peak = chip.peak_bf16_flops_per_s / chip.devices_per_chip
    hbm = chip.hbm_bw_bytes_per_s / chip.devices_per_chip
    calls = [t for t in timings if t.form != "weight_grad"]

    def best(label, model, start, upper):
        def residuals(p):
            return np.array([model(p, t) / t.seconds - 1 for t in calls])

        solution = least_squares(residuals, start, bounds=(np.zeros(len(start)), upper))
        return label, rms(solution.fun)

    def moved(t):
        return (2.0 * t.rows * (t.contract + t.out) + 2.0 * t.groups * t.contract * t.out) / hbm

    return [
        best("rows·K·N/(peak·e)", lambda p, t: t.flops / (peak * p[0]), [0.5], [1.0]),
        best("+ seconds per group", lambda p, t: t.flops / (peak * p[0]) + t.groups * p[1] * 1e-6, [0.5, 1], [1, 100]),
        best(
            "(rows + groups·r)·K·N/(peak·e)",
            lambda p, t: t.flops * (1 + t.groups * p[1] * 100 / t.rows) / (peak * p[0]),
            [0.5, 2],
            [1, 80],
        ),
        best(
            "max(that, bytes/hbm) + seconds per group",
            lambda p, t: (
                max(t.flops * (1 + t.groups * p[1] * 100 / t.rows) / (peak * p[0]), moved(t)) + t.groups * p[2] * 1e-6
            ),
            [0.5, 2, 1],
            [1, 80, 100],
        ),
    ]


def _lane_aligned(t: GroupedTiming) -> bool:
    return t.contract % LANES == 0 and t.out % LANES == 0


def _aligned(timings: list[GroupedTiming]) -> list[GroupedTiming]:
    return [t for t in timings if t.dtype == "bf16" and _lane_aligned(t)]


def _unaligned(timings: list[GroupedTiming]) -> list[GroupedTiming]:
    return [t for t in timings if t.dtype == "bf16" and not _lane_aligned(t)]


def padded(t: GroupedTiming, contract_multiple: int, out_multiple: int | None = None) -> GroupedTiming:
    """The call with its contracted and output widths rounded up to multiples of these."""

    def up(width: int, multiple: int) -> int:
        return -(-width // multiple) * multiple

    return dataclasses.replace(
        t, contract=up(t.contract, contract_multiple), out=up(t.out, out_multiple or contract_multiple)
    )


def kernel_tiles(t: GroupedTiming) -> tuple[int, int] | None:
    """The fastest config's tile_k and tile_n (the contracted and output widths' tiles), where it names both."""
    try:
        config = json.loads(t.config)
    except ValueError:
        return None
    k, n = (config.get(key) if isinstance(config, dict) else None for key in ("tile_k", "tile_n"))
    return (k, n) if isinstance(k, int) and isinstance(n, int) else None


@dataclass
class ChipFit:
    """One chip's fit: the row with its fitted figures, the calls and their errors."""

    name: str
    chip: Chip  # the row with the fitted (rounded) figures
    cite: str  # the main kernel's timing file
    calls: list[GroupedTiming]  # bf16 calls of lane-aligned widths, fitted
    errors: np.ndarray
    unaligned: list[GroupedTiming]  # bf16 calls left out: their median ratio is the unaligned slowdown
    v2_calls: list[GroupedTiming]
    v2_values: tuple[float, ...] = ()
    v2_errors: np.ndarray | None = None
    v2_unaligned: list[GroupedTiming] = dataclasses.field(default_factory=list)
    fp8_calls: list[GroupedTiming] = dataclasses.field(default_factory=list)
    fp8_fitted: bool = False  # fitted at the chip's fp8 peak, or priced with the bf16 figures

    @property
    def peak(self) -> float:
        return self.chip.peak_bf16_flops_per_s / self.chip.devices_per_chip

    @property
    def aligned_chip(self) -> Chip:
        """The row's model of a lane-aligned call: its figures without the unaligned slowdown."""
        return dataclasses.replace(self.chip, **{UNALIGNED_FIGURE: 1.0})

    def error(self, t: GroupedTiming) -> float:
        return model_seconds(self.chip, t) / t.seconds - 1

    def ratio(self, t: GroupedTiming, priced: GroupedTiming | None = None) -> float:
        """The call's measured time over the aligned model's for it (or for `priced`, the call padded)."""
        return t.seconds / model_seconds(self.aligned_chip, priced or t)

    def padding(self) -> dict[str, list[float]]:
        """The unaligned calls' measured time over the aligned model's with their widths padded, per rule."""
        rules = {f"to a multiple of {LANES}": [self.ratio(t, padded(t, LANES)) for t in self.unaligned]}
        tile = self.chip.mxu_tile
        if tile != LANES:
            rules[f"to the MXU tile ({tile})"] = [self.ratio(t, padded(t, tile)) for t in self.unaligned]
        tiles = [kernel_tiles(t) for t in self.unaligned]
        if self.unaligned and all(tiles):
            rules["to the fastest config's tiles"] = [
                self.ratio(t, padded(t, *kn)) for t, kn in zip(self.unaligned, tiles)
            ]
        return rules

    def near_ratios(self) -> tuple[list[GroupedTiming], list[float]]:
        """The aligned calls nearest the unaligned ones (as many groups, rows per group within 2x): their
        measured time over the model's, to set the unaligned calls' ratios against."""
        near = [
            t
            for t in self.calls
            if any(t.groups == u.groups and 0.5 <= t.group_rows / u.group_rows <= 2 for u in self.unaligned)
        ]
        return near, [self.ratio(t) for t in near]

    def v2_unaligned_ratios(self) -> list[float]:
        """The v2 kernel's unaligned calls' time over its own fit's model (the aligned calls')."""
        if not self.v2_values:
            return []
        v2 = with_figures(self.aligned_chip, self.v2_values)
        return [t.seconds / model_seconds(v2, t) for t in self.v2_unaligned]

    def v2_ratios(self) -> list[float]:
        """The v2 kernel's time over the main kernel's, for the calls both time."""
        main = {(t.form, t.groups, t.rows, t.contract, t.out): t.seconds for t in self.calls}
        return [
            t.seconds / main[k] for t in self.v2_calls if (k := (t.form, t.groups, t.rows, t.contract, t.out)) in main
        ]


def fit_chip(name: str, device: str, base: Path) -> ChipFit:
    # the fits price lane-aligned calls: the row's unaligned slowdown, refitted below, is held at 1
    chip = dataclasses.replace(load_chip(CHIP_DIR / f"{name}.json"), **{UNALIGNED_FIGURE: 1.0})
    main, v2 = (find_file(device, f"{kernel}.json", [], base) for kernel in (KERNEL, V2_KERNEL))
    timings = read_grouped(main.path)
    v2_timings = read_grouped(v2.path) if v2 else []
    calls = _aligned(timings)
    values, _ = fit(chip, calls)
    fitted = with_figures(chip, [_round(v) for v in values])
    out = ChipFit(
        name=name,
        chip=fitted,
        cite=f"{main.cite} (git blob {_blob(main.path)[:12]})",
        calls=calls,
        errors=np.array([model_seconds(fitted, t) / t.seconds - 1 for t in calls]),
        unaligned=sorted(_unaligned(timings), key=lambda t: (FORMS.index(t.form), t.contract, t.out, t.rows)),
        v2_calls=_aligned(v2_timings),
        v2_unaligned=_unaligned(v2_timings),
        fp8_calls=[t for t in timings if t.dtype == "fp8"],
    )
    if out.v2_calls:
        out.v2_values, out.v2_errors = fit(chip, out.v2_calls)
    # fp8 weights, rows quantized in the kernel: fitted where the chip has an fp8 rate above bf16's
    if out.fp8_calls and fitted.peak_fp8_flops_per_s > fitted.peak_bf16_flops_per_s:
        efficiency, _ = fit_fp8(fitted, out.fp8_calls)
        out.chip = dataclasses.replace(fitted, grouped_matmul_fp8_efficiency=_round(efficiency))
        out.fp8_fitted = True
    # widths that are not multiples of the lanes: the median of their measured time over the aligned model's
    if out.unaligned:
        slowdown = statistics.median(out.ratio(t) for t in out.unaligned)
        out.chip = dataclasses.replace(out.chip, **{UNALIGNED_FIGURE: _round(slowdown)})
    return out


def _short(t: GroupedTiming) -> str:
    return f"{t.groups}x{t.group_rows:.0f} rows K={t.contract} N={t.out}"


def _widths(timings: list[GroupedTiming]) -> str:
    return ", ".join(sorted({f"K={t.contract} N={t.out}" for t in timings}))


def _span(values) -> str:
    low, high = f"{min(values):.2f}", f"{max(values):.2f}"
    return low if low == high else f"{low}-{high}"


def unaligned_source(f: ChipFit) -> str:
    """The unaligned slowdown's citation: the calls, their ratios, and why a factor rather than padding."""
    if not f.unaligned:
        return (
            f"1.0: not measured. {f.cite} holds no bf16 call whose contracted or output width is not a multiple of "
            f"{LANES} (its {len(f.calls)} bf16 calls are all lane-aligned), so a grouped matmul of such widths is "
            f"priced as an aligned one (regenerate/fit_grouped_matmul.py)"
        )
    ratios = [f.ratio(t) for t in f.unaligned]
    rates = [t.flops / t.seconds / f.peak for t in f.unaligned]
    shapes = ", ".join(sorted({f"{t.groups} groups of ~{t.group_rows:.0f} rows" for t in f.unaligned}))
    forms = ", ".join(f"{t.form.replace('_', ' ')} {r:.3f}" for t, r in zip(f.unaligned, ratios))
    tiles = sorted({f"{kn[0]}x{kn[1]}" for t in f.unaligned if (kn := kernel_tiles(t))})
    near, near_ratios = f.near_ratios()
    padding = f.padding()
    explained = max(statistics.median(ratios) / statistics.median(r) for r in padding.values())
    text = (
        f"{getattr(f.chip, UNALIGNED_FIGURE):g}: the median, over the {len(f.unaligned)} bf16 calls of {f.cite} "
        f"whose widths are not multiples of {LANES} lanes (left out of the other figures' fit), of measured time "
        f"over Chip.grouped_matmul_seconds's with the row's fitted figures (this factor 1). "
        f"Only {_widths(f.unaligned)} measured (GPT-OSS's expert widths; {shapes}): {forms} "
        f"(spread {min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} calls); they run at {_span(rates)} of the "
        f"per-device bf16 peak. Applied to the whole time of a grouped matmul whose contracted or output width "
        f"is not a multiple of {LANES}, at the widths as they are; one width measured, so how the slowdown moves "
        f"with the width (704, 2816, ...) is not. Not a padding rule: the model at the widths padded "
        + "; ".join(f"{label} leaves the calls {_span(r)}x slower" for label, r in padding.items())
        + (f" (the fastest configs' tile_k x tile_n: {', '.join(tiles)})" if tiles else "")
        + f", where the {len(near)} aligned calls of as many groups and rows per group take {_span(near_ratios)}x the "
        f"model's time: padding accounts for a factor of at most {explained:.2f} of the "
        f"{statistics.median(ratios):.2f}, so the factor is the measured one, not derived from a padded width"
    )
    v2 = f.v2_unaligned_ratios()
    if v2:
        text += (
            f". tokamax's v2 kernel ({V2_KERNEL}) is slow at {_widths(f.v2_unaligned)} too: {_span(v2)}x its own "
            f"fit's model ({len(v2)} timed {'call' if len(v2) == 1 else 'calls'}), so the slowdown is the width's, "
            f"not one kernel's"
        )
    return text + " (benchmarks/results/kernels/grouped_matmul.txt)"


def sources_of(f: ChipFit) -> dict[str, str]:
    """Each fitted figure's citation: file, calls, method, errors."""
    worst = int(np.argmax(np.abs(f.errors)))
    group_rows = [t.group_rows for t in f.calls]
    widths = [w for t in f.calls for w in (t.contract, t.out)]
    how = (
        f"fitted to {f.cite}, tokamax's first Mosaic grouped-matmul kernel (megablox's algorithm, which MaxText's "
        f"default megablox=True path runs; the one kernel tokamax times on every TPU and in all three forms): "
        f"{len(f.calls)} bf16 calls, fastest config each ({_forms_text(f.calls, f.errors)}), "
        f"{min(group_rows):.0f}-{max(group_rows):.0f} rows per group over {min(t.groups for t in f.calls)}-"
        f"{max(t.groups for t in f.calls)} groups, widths {min(widths)}-{max(widths)}, by least squares on relative "
        f"error (scipy least_squares) in the model of Chip.grouped_matmul_seconds, max(2·(rows + groups·r)·K·N/"
        f"(peak·e), bytes/hbm_bw) + groups·c per device, with the row's other grouped_matmul figures; RMS error "
        f"{rms(f.errors):.1%}, largest {f.errors[worst]:+.0%} ({f.calls[worst].label})."
    )
    if f.unaligned:
        rates = [t.flops / t.seconds / f.peak for t in f.unaligned]
        how += (
            f" {len(f.unaligned)} calls of widths that are not multiples of {LANES} ({_widths(f.unaligned)}) are left "
            f"out: they run at {min(rates):.2f}-{max(rates):.2f} of the peak, "
            f"{statistics.median(f.ratio(t) for t in f.unaligned):.2f}x (median) the time this model gives them "
            f"({UNALIGNED_FIGURE})."
        )
    best = max(t.flops / t.seconds for t in f.calls if t.form != "weight_grad") / f.peak
    efficiency = (
        f"{how} The kernel's MXU efficiency, of the per-device bf16 peak ({f.peak / 1e12:.0f} TFLOP/s), for the "
        f"forward and the gradient of its rows; its fastest call here reaches {best:.2f}."
    )
    if f.v2_calls:
        ratios = f.v2_ratios()
        e, r, c = f.v2_values[:3]
        efficiency += (
            f" tokamax's v2 kernel ({V2_KERNEL}, MaxText's use_gmm_v2; no weight-gradient timings) takes "
            f"{statistics.median(ratios):.2f}x this kernel's time (median of {len(ratios)} calls both time, "
            f"{min(ratios):.2f}-{max(ratios):.2f}); fitted alone ({len(f.v2_calls)} calls, forward and dgrad): "
            f"e={e:.3f}, r={r:.0f}, c={c * 1e6:.2f} µs, RMS {rms(f.v2_errors):.1%} "
            f"(benchmarks/results/kernels/grouped_matmul.txt)."
        )
    v2_rates = [t.flops / t.seconds / f.peak for t in f.v2_calls if t.form != "weight_grad" and t.group_rows >= 256]
    if f.chip.devices_per_chip == 1 and f.chip.tensorcores_per_chip > 1 and max(v2_rates, default=0) > 0.6:
        # a megacore device: a kernel that stays under half its peak runs on one of its cores
        efficiency += (
            f" The kernel keeps one of the megacore's {f.chip.tensorcores_per_chip} TensorCores busy: no call reaches "
            f"half the device's peak, where the v2 kernel's calls of 256 rows per group or more reach "
            f"{min(v2_rates):.2f}-{max(v2_rates):.2f} (both cores on some shapes, one or less on others of as many "
            f"rows per group)"
        )
    sources = dict(
        grouped_matmul_efficiency=efficiency,
        grouped_matmul_group_rows=(
            f"{how} Rows of MXU work each group adds to the forward and dgrad: the row tile a group boundary "
            f"splits (megablox visits m/tm + groups - 1 row tiles)"
        ),
        grouped_matmul_group_overhead_s=f"{how} Seconds each group adds (all three forms)",
        grouped_matmul_weight_grad_efficiency=(
            f"{how} The weight gradient's (each group's [K, N] summed over its rows) MXU efficiency, of the "
            f"per-device bf16 peak"
        ),
        grouped_matmul_weight_grad_group_rows=f"{how} Rows of MXU work each group adds to the weight gradient",
    )
    fp8_errors = [f.error(t) for t in f.fp8_calls]
    if f.fp8_fitted:
        fp8_peak = f.chip.peak_fp8_flops_per_s / f.chip.devices_per_chip
        bf16 = [model_seconds(f.chip, dataclasses.replace(t, dtype="bf16")) / t.seconds for t in f.fp8_calls]
        sources[FP8_FIGURE] = (
            f"fitted to {f.cite}: its {len(f.fp8_calls)} fp8 calls (f8_e4m3fn weights with bf16 scales, bf16 rows "
            f"quantized to fp8 in the kernel; fastest config each: "
            + ", ".join(f"{label} {t.seconds * 1e3:.3f} ms" for label, t in zip(map(_short, f.fp8_calls), f.fp8_calls))
            + f") in Chip.grouped_matmul_seconds at the per-device fp8 peak ({fp8_peak / 1e12:.0f} TFLOP/s), fp8 "
            f"weights read once, the row's other grouped_matmul figures held (the bf16 fit's); least squares on "
            f"relative error, one figure for {len(f.fp8_calls)} calls: RMS error {rms(fp8_errors):.1%} "
            f"({', '.join(f'{e:+.0%}' for e in fp8_errors)}). The bf16 figures price the same calls in bf16 at "
            f"{min(bf16):.2f}-{max(bf16):.2f}x their measured fp8 times. Fraction of the fp8 peak"
        )
    else:
        sources[FP8_FIGURE] = (
            "0: no fp8 rate of this chip's own (peak_fp8_flops_per_s), so an fp8 grouped matmul is priced with the "
            "bf16 figures, its fp8 weights read once"
        )
        if f.fp8_calls:
            sources[FP8_FIGURE] += (
                f"; tokamax's {len(f.fp8_calls)} fp8 calls here ({f.cite}; fp8 weights, rows quantized in the "
                f"kernel), priced so: "
                + ", ".join(f"{label} {e:+.0%}" for label, e in zip(map(_short, f.fp8_calls), fp8_errors))
            )
    sources[UNALIGNED_FIGURE] = unaligned_source(f)
    return sources


def lines_of(f: ChipFit) -> list[str]:
    """The report's section for one chip: figures, every call against the model, what was left out."""
    figures = {k: getattr(f.chip, k) for k in GROUPED_MATMUL_FIELDS}
    lines = [
        f"## {f.name}: {KERNEL}, {len(f.calls)} bf16 calls ({_forms_text(f.calls, f.errors)})",
        "figures: "
        + ", ".join(f"{k.removeprefix('grouped_matmul_')}={v:g}" for k, v in figures.items())
        + f"; RMS {rms(f.errors):.1%}",
    ]
    order = sorted(range(len(f.calls)), key=lambda i: (FORMS.index(f.calls[i].form), f.calls[i].group_rows))
    for t in [f.calls[i] for i in order] + f.unaligned:
        lines.append(
            f"  {'left out: ' if t in f.unaligned else ''}{t.label:58} measured {t.seconds * 1e3:8.3f} ms  "
            f"model {model_seconds(f.chip, t) * 1e3:8.3f} ms ({f.error(t):+6.1%})  "
            f"{t.flops / t.seconds / f.peak:.2f} of peak"
            + (f"; {f.ratio(t):.3f}x the aligned model, config {t.config}" if t in f.unaligned else "")
        )
    if f.unaligned:
        near, near_ratios = f.near_ratios()
        lines.append(
            f"unaligned widths ({_widths(f.unaligned)}, left out of the fit): {UNALIGNED_FIGURE}="
            f"{getattr(f.chip, UNALIGNED_FIGURE):g}, median of {len(f.unaligned)} calls' measured/aligned model "
            f"({_span([f.ratio(t) for t in f.unaligned])}); padded "
            + "; ".join(f"{label} {_span(r)}" for label, r in f.padding().items())
            + f"; the {len(near)} aligned calls of as many groups and rows per group: {_span(near_ratios)}"
            + (f"; {V2_KERNEL}'s over its own fit: {_span(f.v2_unaligned_ratios())}" if f.v2_unaligned_ratios() else "")
        )
    else:
        lines.append(f"unaligned widths: no call timed, {UNALIGNED_FIGURE}=1 (not measured)")
    for t in f.fp8_calls:
        lines.append(
            f"  {t.label:58} measured {t.seconds * 1e3:8.3f} ms  model {model_seconds(f.chip, t) * 1e3:8.3f} ms "
            f"({f.error(t):+6.1%})  "
            + (
                f"{t.flops / t.seconds / (f.chip.peak_fp8_flops_per_s / f.chip.devices_per_chip):.2f} of the fp8 peak"
                if f.fp8_fitted
                else "bf16 figures (no fp8 rate)"
            )
        )
    if f.fp8_fitted:
        lines.append(f"fp8: {len(f.fp8_calls)} calls, RMS {rms([f.error(t) for t in f.fp8_calls]):.1%}")
    if f.v2_calls:
        ratios = f.v2_ratios()
        e, r, c = f.v2_values[:3]
        lines.append(
            f"{V2_KERNEL}: {len(f.v2_calls)} bf16 forward/dgrad calls: e={e:.3f} r={r:.0f} c={c * 1e6:.2f} µs, "
            f"RMS {rms(f.v2_errors):.1%}; its time over {KERNEL}'s: median {statistics.median(ratios):.2f} of "
            f"{len(ratios)} calls both time"
        )
    lines.append(
        "simpler models, forward and dgrad (RMS): "
        + "; ".join(f"{label} {error:.1%}" for label, error in alternative_forms(f.chip, f.calls))
    )
    return lines + [""]


def derive(base: Path) -> dict[str, dict]:
    """Every TPU chip's figures, sources and report lines from the timing files of the tokamax package
    whose autotuning folder is `base`."""
    derived = {}
    for name, device in DEVICE_DIRS.items():
        f = fit_chip(name, device, base)
        figures = {k: getattr(f.chip, k) for k in GROUPED_MATMUL_FIELDS}
        derived[name] = {"figures": figures, "sources": sources_of(f), "lines": lines_of(f)}
    return derived


def write_rows(derived: dict[str, dict]) -> None:
    """Writes the figures and their sources into the chip rows, every other field left alone, each file
    in its own character style (escaped, or as written)."""
    for name, d in derived.items():
        path = CHIP_DIR / f"{name}.json"
        text = path.read_text()
        row = json.loads(text)
        row.update(d["figures"])
        row["sources"].update(d["sources"])
        Chip.from_dict(row, origin=str(path))  # a row that would not load is never written
        path.write_text(json.dumps(row, indent=2, ensure_ascii=text.isascii()) + "\n")


def report(derived: dict[str, dict]) -> str:
    header = [
        "# Grouped matmul (MoE expert matmul) per device: tokamax's measured ragged dots against the chip rows'",
        "# model, max(2·(rows + groups·r)·K·N/(peak·e), bytes/hbm_bw) + groups·c (Chip.grouped_matmul_seconds);",
        "# weight gradients with their own e and r. Fitted by regenerate/fit_grouped_matmul.py. Calls of widths",
        "# that are not multiples of 128 lanes are left out; their median measured/model ratio is the row's",
        "# grouped_matmul_unaligned_slowdown, the model's time times it (ratios also against padded widths).",
        "",
    ]
    return "\n".join(header + [line for d in derived.values() for line in d["lines"]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokamax",
        type=Path,
        help="a tokamax package folder (.../site-packages/tokamax) to read instead of the importable one",
    )
    parser.add_argument("--write", action="store_true", help="write the figures into cost_models/data/chips/*.json")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help=f"where the report goes (default {RESULTS_DIR})")
    args = parser.parse_args()
    base = installed_dir(args.tokamax)
    if not (base / DEVICE_DIRS["tpu7x"] / f"{V2_KERNEL}.json").exists():
        raise SystemExit(f"{base} has no {V2_KERNEL} timings: give --tokamax a tokamax 0.0.17 (or later) package")
    derived = derive(base)
    text = report(derived)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grouped_matmul.txt").write_text(text)
    (args.out / "grouped_matmul.json").write_text(
        json.dumps({name: {"figures": d["figures"], "sources": d["sources"]} for name, d in derived.items()}, indent=2)
        + "\n"
    )
    if args.write:
        write_rows(derived)


if __name__ == "__main__":
    main()
