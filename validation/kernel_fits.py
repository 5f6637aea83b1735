"""Fits TPU chip rows' kernel figures to tokamax's measured kernel timings and checks them
(`regenerate/fit_kernels.py` runs it and writes the rows).

tokamax ships the TPU timings it measured while autotuning, one JSON file per kernel and device
(`tokamax/data/autotuning/<device>/`). From the Mosaic flash attention (forward with residuals,
and its VJP) this fits, per chip, the attention figures `cost_models/pricing/attention.py` prices
with; the matmul efficiency is the best rate tokamax's grouped-matmul kernels reached on calls of
dense-layer shapes (`dense_matmul_efficiency`). TPU7x entries are per TensorCore: `per_core_note`.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from cost_models.chips import CHIP_DIR, Chip, load_chip
from cost_models.compute import attention_extent, splash_step_costs, tile_efficiency

RESULTS_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "kernels"
AUTOTUNING = Path("tokamax") / "data" / "autotuning"
DEVICE_DIRS = {"v5p": "tpu_v5", "v5e": "tpu_v5_lite", "v6e": "tpu_v6_lite", "tpu7x": "tpu7x"}
FORWARD_FILE, BACKWARD_FILE = "pallas_mosaic_tpu_flash_attention.json", "pallas_mosaic_tpu_flash_attention_vjp.json"
# the Mosaic grouped-matmul kernels, old and new; not the API's ragged_dot.json, which times whichever
# implementation tokamax picked, for some calls XLA's lowering that multiplies every row by every
# group's weights (0.1-0.4% of the peak with 256 groups)
MATMUL_FILES = ("pallas_mosaic_tpu_ragged_dot.json", "pallas_mosaic_tpu_v2_ragged_dot.json")
GLU_FILE = "gated_linear_unit.json"  # reported beside the figure, not used for it: see dense_matmul_efficiency
LONG = 4096  # the target is set on kernels of at least this many tokens
DENSE_GROUP_ROWS = 1024  # a ragged dot whose groups have this many rows each is a run of dense matmuls
DENSE_DIM = 1024  # contracting and output widths at least this: a transformer layer's, not a router's
MATMUL_BOUND = 2.0  # arithmetic intensity at least this many times the device's ridge point
# where a chip has no timings of a kind, the chip whose figures it takes, and why
ATTENTION_STAND_IN = {"v5e": ("v5p", "the same 128×128 MXU and splash kernel")}
BACKWARD_STAND_IN = {chip: ("tpu7x", "the same splash backward kernels") for chip in ("v5p", "v5e", "v6e")}
MATMUL_STAND_IN = {"v6e": ("tpu7x", "the same 256×256 MXU generation")}
PRECISION = 4  # significant digits written into the rows: a refit that moves less is no change


@dataclass(frozen=True)
class Source:
    """Where a timing file came from."""

    path: Path
    cite: str  # repository or package, commit or version, path


@dataclass(frozen=True)
class AttentionTiming:
    """One measured flash-attention call (its fastest config)."""

    batch: int
    seq: int
    q_heads: int
    kv_heads: int
    head_dim: int
    causal: bool
    block_q: int
    block_kv: int
    seconds: float

    @property
    def label(self) -> str:
        mask = "causal" if self.causal else "full"
        return f"{self.batch}x{self.seq}x{self.q_heads}/{self.kv_heads}x{self.head_dim} {mask}"


@dataclass(frozen=True)
class AttentionFit:
    """A chip's attention figures and how well they reproduce its timings."""

    efficiency: float
    step_s: float
    masked_element_s: float
    operand_passes: float
    backward_operand_passes: float = 0.0


def installed_dir(package: Path | None = None) -> Path:
    """The autotuning data of a tokamax package: `package` (a `.../site-packages/tokamax` folder of
    another environment, to read a release this one does not import) or the importable one."""
    import importlib.util

    if package is None:
        spec = importlib.util.find_spec("tokamax")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(
                "tokamax is not installed: give --tokamax or --data with a checkout of github.com/openxla/tokamax"
            )
        package = Path(next(iter(spec.submodule_search_locations)))
    return package / "data" / "autotuning"


def package_version(base: Path) -> str:
    """The release of the tokamax package whose autotuning folder is `base`, from its dist-info."""
    import importlib.metadata

    infos = sorted((base.parents[2]).glob("tokamax-*.dist-info"))
    if not infos:
        raise SystemExit(f"no tokamax-*.dist-info beside {base.parents[1]}: point --tokamax at an installed package")
    return importlib.metadata.PathDistribution(infos[-1]).version


def _git(checkout: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def find_file(device: str, name: str, checkouts: list[Path], base: Path) -> Source | None:
    """The first readable, non-empty copy of `device/name`: installed package, then checkouts."""
    candidate = base / device / name
    if _readable(candidate):
        version = package_version(base)
        cite = f"tokamax {version} (installed package): {AUTOTUNING / device / name}"
        # the commit that holds these very bytes, where a checkout says (among the commits that
        # wrote the file: one that deleted it has no bytes to compare)
        for checkout in checkouts:
            blob = _git(checkout, "hash-object", str(candidate))
            writes = _git(checkout, "log", "--diff-filter=AMR", "--format=%H", "--", str(AUTOTUNING / device / name))
            for commit in writes.split():
                if _git(checkout, "rev-parse", f"{commit}:{AUTOTUNING / device / name}") == blob:
                    cite += f", the bytes of openxla/tokamax@{commit}"
                    break
        return Source(candidate, cite)
    for checkout in checkouts:
        candidate = checkout / AUTOTUNING / device / name
        if _readable(candidate):
            commit = _git(checkout, "rev-parse", "HEAD")
            return Source(candidate, f"openxla/tokamax@{commit}: {AUTOTUNING / device / name}")
    return None


def _readable(path: Path) -> bool:
    try:
        return bool(json.loads(path.read_text()))
    except (OSError, ValueError):
        return False  # missing, empty, or (as some shipped copies are) not valid JSON


def _shape(operand) -> tuple[str, list[int]]:
    """(dtype, dims) of an operand written `bf16[8,4096,128]`; a quantized operand (written as a
    dict of value and scales, as newer tokamax releases do) is none of the bf16 calls fitted here."""
    if not isinstance(operand, str):
        return "quantized", []
    dtype, dims = re.fullmatch(r"(\w+)\[([\d,]*)\]", operand).groups()
    return dtype, [int(d) for d in dims.split(",") if d]


def _fastest(configs: dict) -> tuple[float, dict] | None:
    timed = [
        (statistics.median(c["evaluation_times_ms"]) * 1e-3, json.loads(cfg))
        for cfg, c in configs.items()
        if c.get("evaluation_times_ms")
    ]
    return min(timed, key=lambda t: t[0]) if timed else None


def read_attention(path: Path, *, backward: bool) -> list[AttentionTiming]:
    """The bf16 calls a cpplan model makes (no bias, bool mask, soft cap or dropout; equal q/k/v
    head dims); forward entries are those that return residuals, as training runs them."""
    timings = []
    for key, configs in json.loads(path.read_text()).items():
        call, fastest = json.loads(key), _fastest(configs)
        mask = call.get("mask") or {}
        bounded = any(mask.get(k) is not None for k in ("q_start", "q_end", "k_start", "k_end"))
        if (
            fastest is None
            or call.get("bias")
            or mask.get("bool_mask")
            or call.get("dropout_rate")
            or call.get("logits_soft_cap")
            or bounded
        ):
            continue
        if ("dout" in call) != backward or (not backward and not call.get("return_residuals")):
            continue
        (dtype, q), (_, k), (_, v) = _shape(call["q"]), _shape(call["k"]), _shape(call["v"])
        if dtype != "bf16" or len(q) != 4 or not q[3] == k[3] == v[3] or q[1] != k[1]:
            continue
        seconds, config = fastest
        # the VJP's configs name the dk/dv kernel's blocks
        block_q, block_kv = (
            (config["block_q_dkv"], config["block_kv_dkv"]) if backward else (config["block_q"], config["block_kv"])
        )
        timings.append(
            AttentionTiming(
                batch=q[0],
                seq=q[1],
                q_heads=q[2],
                kv_heads=k[2],
                head_dim=q[3],
                causal=bool(mask.get("is_causal")),
                block_q=min(block_q, q[1]),
                block_kv=min(block_kv, q[1]),
                seconds=seconds,
            )
        )
    return timings


def model_attention(chip: Chip, t: AttentionTiming, fit: AttentionFit, backward_over_forward: float):
    """cpplan's (forward, backward) seconds for one measured call, by the pricing's own formulas."""
    peak = chip.peak_bf16_flops_per_s / chip.devices_per_chip
    hbm_bw = chip.hbm_bw_bytes_per_s / chip.devices_per_chip
    extent = attention_extent(t.seq, 1, False, block_q=t.block_q, block_kv=t.block_kv, causal=t.causal)
    math = (
        4.0
        * t.batch
        * t.q_heads
        * t.head_dim
        * extent
        / (peak * fit.efficiency * tile_efficiency(t.head_dim, chip.mxu_tile))
    )
    # tokamax's VJP is splash's fused backward (its configs set only the dk/dv kernel's blocks): one
    # grid, and the sum of its dq partials, as the price has them
    fwd, bwd = splash_step_costs(
        t.batch * t.q_heads,
        t.batch * t.kv_heads,
        t.seq,
        t.seq,
        head_dim=t.head_dim,
        act_bytes=2,
        block_q=t.block_q,
        block_kv=t.block_kv,
        per_step_s=fit.step_s,
        per_step_byte_s=0.0,
        per_masked_element_s=fit.masked_element_s,
        per_call_byte_s=(fit.operand_passes / hbm_bw, fit.backward_operand_passes / hbm_bw),
        causal=t.causal,
        fused_backward=True,
        hbm_s_per_byte=1 / hbm_bw,
    )
    return float(math + fwd), float(backward_over_forward * math + bwd)


def fit_forward(
    chip: Chip, timings: list[AttentionTiming], *, max_efficiency: float = np.inf
) -> tuple[AttentionFit, float]:
    """Least squares on relative error over all forward timings, the efficiency at most `max_efficiency`;
    returns the fit and its RMS."""
    scale = np.array([1.0, 1e-7, 1e-12, 1.0])  # parameters near 1 for the solver

    def residuals(p):
        fit = AttentionFit(*(p * scale))
        return [model_attention(chip, t, fit, 0.0)[0] / t.seconds - 1 for t in timings]

    upper = [max_efficiency, np.inf, np.inf, np.inf]
    solution = least_squares(residuals, [min(0.7, max_efficiency), 1.0, 1.0, 1.0], bounds=(0, upper))
    return AttentionFit(*(float(v) for v in solution.x * scale)), float(np.sqrt(np.mean(solution.fun**2)))


def fit_backward(chip: Chip, fit: AttentionFit, timings: list[AttentionTiming]) -> tuple[float, float, float]:
    """The backward/forward MXU-time ratio and the backward's operand passes, per-step and masked
    costs held at the forward's; returns them and the RMS relative error."""

    def residuals(p):
        backward = AttentionFit(fit.efficiency, fit.step_s, fit.masked_element_s, fit.operand_passes, p[1])
        return [model_attention(chip, t, backward, p[0])[1] / t.seconds - 1 for t in timings]

    solution = least_squares(residuals, [2.5, 1.0], bounds=(0, np.inf))
    return float(solution.x[0]), float(solution.x[1]), float(np.sqrt(np.mean(solution.fun**2)))


@dataclass(frozen=True)
class MatmulTiming:
    """One measured bf16 grouped matmul of dense size (its fastest config), and its kernel."""

    kernel: str  # the timing file's stem: which of tokamax's ragged-dot kernels ran it
    lhs: str
    rhs: str
    groups: str  # how the rows were split
    group_rows: int  # rows of the smallest group: each group is a dense matmul this tall or taller
    rows: int  # rows multiplied in all
    contract: int
    out: int
    seconds: float

    @property
    def label(self) -> str:
        return f"{self.lhs}·{self.rhs} in {self.groups}"

    @property
    def flops_per_s(self) -> float:
        return 2.0 * self.rows * self.contract * self.out / self.seconds

    @property
    def intensity(self) -> float:
        """FLOPs per byte of one group's operands and output, each moved once (bf16)."""
        r, k, n = self.group_rows, self.contract, self.out
        return 2.0 * r * k * n / (2.0 * (r * k + k * n + r * n))


def read_dense_matmuls(path: Path) -> list[MatmulTiming]:
    """The bf16 forward ragged dots whose every group is a dense matmul of a transformer layer's size:
    each non-empty listed group (or, for tokamax's generated groups, their mean) at least
    DENSE_GROUP_ROWS tall, contracting and output widths at least DENSE_DIM; no quantization,
    fused activation or residuals."""
    out = []
    for key, configs in json.loads(path.read_text()).items():
        call, fastest = json.loads(key), _fastest(configs)
        if (
            fastest is None
            or call.get("return_residuals")
            or any(
                call.get(k)
                for k in (
                    "rhs_scale",
                    "lhs_scale",
                    "lhs_quantization_dtype",
                    "rhs_quantization_dtype",
                    "activation",
                    "fuse_gateup_activation",
                    "rhs_bias",
                )
            )
        ):
            continue
        (ldt, lhs), (rdt, rhs) = _shape(call["lhs"]), _shape(call["rhs"])
        numbers = call["ragged_dot_dimension_numbers"]
        if ldt != "bf16" or rdt != "bf16" or len(lhs) != 2 or len(rhs) != 3 or not numbers["rhs_group_dimensions"]:
            continue  # the weight-gradient form (no rhs groups) is not the layer matmul priced here
        (lhs_contract, rhs_contract), _ = numbers["dot_dimension_numbers"]
        groups = call["group_sizes"]
        if isinstance(groups, dict):  # tokamax's generated groups: random sizes around the mean
            rows, group_rows = groups["total_size"], groups["total_size"] // groups["num_groups"]
            described = f"{groups['num_groups']} generated groups of ~{group_rows} rows"
        else:
            filled = [g for g in groups if g]
            rows, group_rows = sum(filled), min(filled, default=0)
            described = (
                f"{len(filled)} of {len(groups)} groups of {group_rows} rows"
                if len(set(filled)) == 1
                else f"{len(filled)} groups of {group_rows}-{max(filled, default=0)} rows"
            )
        out_dim = [d for i, d in enumerate(rhs) if i not in (rhs_contract[0], *numbers["rhs_group_dimensions"])][0]
        timing = MatmulTiming(
            kernel=path.stem,
            lhs=call["lhs"],
            rhs=call["rhs"],
            groups=described,
            group_rows=group_rows,
            rows=rows,
            contract=lhs[lhs_contract[0]],
            out=out_dim,
            seconds=fastest[0],
        )
        if group_rows >= DENSE_GROUP_ROWS and min(timing.contract, timing.out) >= DENSE_DIM:
            out.append(timing)
    return out


def read_glu(path: Path) -> list[tuple[str, float, int, int]]:
    """(label, FLOP/s, in width, out width) of every timed gated linear unit: x·W with W [in, 2, out]."""
    out = []
    for key, configs in json.loads(path.read_text()).items():
        call, fastest = json.loads(key), _fastest(configs)
        (_, x), (_, w) = _shape(call["x"]), _shape(call["weights"])
        if fastest is None or not x or len(w) != 3:
            continue
        flops = 2.0 * float(np.prod(x[:-1])) * x[-1] * w[1] * w[2]
        out.append((f"{call['x']}·{call['weights']}", flops / fastest[0], w[0], w[2]))
    return out


def dense_matmul_efficiency(chip: Chip, timings: list[MatmulTiming]) -> tuple[float, MatmulTiming | None, list[float]]:
    """The efficiency of a dense XLA matmul on `chip`: the best rate of the dense-size timings over the
    device's peak. A rate a kernel reached is one the MXU sustains, so the best needs no filter; the
    spread is that of the matmul-bound timings (arithmetic intensity at least MATMUL_BOUND times the
    device's ridge point), whose shortfalls are the kernels' and not HBM's.

    The best and not the median: cpplan prices every dense layer matmul (thousands of rows, widths of
    thousands) at one rate, and XLA's own dot, which tokamax does not time at these sizes, has no
    groups to walk. The slower entries are the grouped kernels' tiling, not the MXU: one shape
    runs at 43% to 93% of the v5p peak across tokamax's three ragged-dot kernels, and random group
    boundaries cost a partial tile each. Every entry is the median of five timings that agree
    within 1%, so the best is not a noise outlier. The gated linear unit, the one XLA dense kernel
    tokamax times on TPUs, is no stand-in: its widths (64-768 contracting, 128-1536 out) leave it
    bound by its f32 epilogue and weight loads (see `read_glu` in the report).

    Args:
        chip: the chip row (peak and HBM bandwidth per device).
        timings: dense-size timings from `read_dense_matmuls`.

    Returns:
        (efficiency, the timing that sets it, every matmul-bound timing's efficiency, ascending);
        nan and None when there are no timings.
    """
    if not timings:
        return float("nan"), None, []
    peak = chip.peak_bf16_flops_per_s / chip.devices_per_chip
    ridge = chip.peak_bf16_flops_per_s / chip.hbm_bw_bytes_per_s
    best = max(timings, key=lambda t: t.flops_per_s)
    bound = [t.flops_per_s / peak for t in timings if t.intensity >= MATMUL_BOUND * ridge]
    return best.flops_per_s / peak, best, sorted(bound)


def mape(pairs) -> float:
    """Mean absolute percentage error of (model, measured) pairs; nan when there are none."""
    return float(np.mean([abs(m / t - 1) for m, t in pairs]) * 100) if pairs else float("nan")


def per_core_note(
    chip: Chip, timings: list[AttentionTiming], matmul: MatmulTiming | None, elsewhere: dict[str, float]
) -> str:
    """Whether a TPU7x entry is one TensorCore's or the whole chip's, from the achieved FLOP/s.

    Args:
        chip: the TPU7x row.
        timings: its forward attention timings.
        matmul: its fastest timing of a dense matmul shape that other chips' files also time.
        elsewhere: for each other chip, that same shape's best efficiency against its whole peak.
    """
    chip_peak = chip.peak_bf16_flops_per_s
    core_peak = chip_peak / chip.tensorcores_per_chip
    best_attention = max(
        4.0 * t.batch * t.q_heads * t.head_dim * t.seq**2 / t.seconds
        for t in timings
        if not t.causal and t.head_dim % chip.mxu_tile == 0
    )
    same_shape = ""
    if matmul is not None:
        others = ", ".join(f"{name} {value:.0%}" for name, value in sorted(elsewhere.items()))
        same_shape = (
            f"the dense matmul {matmul.label} ({matmul.kernel}) reaches {matmul.flops_per_s / core_peak:.0%} "
            f"of one TensorCore's {core_peak / 1e12:.0f} TFLOP/s ({matmul.flops_per_s / chip_peak:.0%} of "
            f"the chip's) where the same call reaches, of the whole chip, {others}; "
        )
    return (
        f"per TensorCore: {same_shape}full attention at head_dim {chip.mxu_tile} reaches "
        f"{best_attention / core_peak:.0%} of one TensorCore ({best_attention / chip_peak:.0%} of the chip); "
        f"a chip-level reading would put TPU7x at half of every other generation. JAX shows each TensorCore "
        f"as a device (the row's devices_per_chip={chip.devices_per_chip}), and tokamax times one device"
    )


def _round(value: float) -> float:
    return float(f"{value:.{PRECISION}g}")


def derive(checkouts: list[Path], base: Path) -> dict[str, dict]:
    """Every chip's figures, sources and comparison rows from the timing files found."""
    chips = {name: load_chip(CHIP_DIR / f"{name}.json") for name in DEVICE_DIRS}
    found = {}
    for name, device in DEVICE_DIRS.items():
        forward = find_file(device, FORWARD_FILE, checkouts, base)
        backward = find_file(device, BACKWARD_FILE, checkouts, base)
        matmuls = [s for s in (find_file(device, f, checkouts, base) for f in MATMUL_FILES) if s]
        found[name] = (forward, backward, matmuls)
    glu_found = {name: find_file(device, GLU_FILE, checkouts, base) for name, device in DEVICE_DIRS.items()}

    derived: dict[str, dict] = {name: {"figures": {}, "sources": {}, "comparison": []} for name in DEVICE_DIRS}
    attention_fits: dict[str, AttentionFit] = {}
    forward_timings: dict[str, list[AttentionTiming]] = {}
    for name, (forward, _, _) in found.items():
        if forward is None:
            continue
        timings = read_attention(forward.path, backward=False)
        fit, rms = fit_forward(chips[name], timings)
        attention_fits[name], forward_timings[name] = fit, timings
        shapes = ", ".join(sorted({t.label for t in timings}))
        how = (
            f"fitted to {forward.cite} ({len(timings)} bf16 forward calls with residuals, fastest config each: "
            f"{shapes}) by least squares on relative error (scipy least_squares), with the other attention "
            f"figures of this row; RMS error {rms:.1%}"
        )
        d = derived[name]
        d["figures"].update(
            attention_efficiency=_round(fit.efficiency),
            attention_block_overhead_s=_round(fit.step_s),
            attention_masked_element_s=_round(fit.masked_element_s),
            attention_operand_passes=_round(fit.operand_passes),
        )
        d["sources"].update(
            attention_efficiency=f"{how}. Against the MXU-padded peak per device (head_dim padded to mxu_tile)",
            attention_block_overhead_s=f"{how}. Seconds per (q block × kv block × head) grid step",
            attention_masked_element_s=f"{how}. Seconds per logit of the blocks the causal diagonal cuts",
            attention_operand_passes=(
                f"{how}. Passes over the call's q, k, v, o at the device's HBM bandwidth, "
                f"once per call (the copies and residuals around the kernel)"
            ),
        )

    backward_ratios: dict[str, float] = {}
    for name, (_, backward, _) in found.items():
        if backward is None or name not in attention_fits:
            continue
        timings = read_attention(backward.path, backward=True)
        ratio, passes, rms = fit_backward(chips[name], attention_fits[name], timings)
        backward_ratios[name] = ratio
        derived[name]["figures"].update(
            attention_backward_over_forward=_round(ratio), attention_backward_operand_passes=_round(passes)
        )
        how = (
            f"fitted to {backward.cite} ({len(timings)} bf16 VJP calls, fastest config each, dk/dv blocks) by "
            f"least squares on relative error with the backward operand passes, the per-step and masked-logit "
            f"figures held at the forward's (paid by the fused backward's one grid); RMS error {rms:.1%}"
        )
        derived[name]["sources"].update(
            attention_backward_over_forward=(
                f"{how}. Splash's fused backward's MXU time over the forward's, per "
                f"core (tokamax's VJP configs set only the dk/dv kernel's blocks)"
            ),
            attention_backward_operand_passes=f"{how}. Passes over the backward's operand arrays, once per call",
        )

    matmul_efficiency: dict[str, float] = {}
    matmul_timings: dict[str, list[MatmulTiming]] = {}
    for name, (_, _, matmuls) in found.items():
        chip = chips[name]
        timings = matmul_timings[name] = [t for src in matmuls for t in read_dense_matmuls(src.path)]
        efficiency, best, spread = dense_matmul_efficiency(chip, timings)
        if best is None:
            continue
        peak = chip.peak_bf16_flops_per_s / chip.devices_per_chip
        ridge = chip.peak_bf16_flops_per_s / chip.hbm_bw_bytes_per_s
        by_kernel = {}
        for t in timings:
            by_kernel[t.kernel] = max(by_kernel.get(t.kernel, 0.0), t.flops_per_s / peak)
        spread_text = (
            (
                f"{spread[0]:.2f}-{spread[-1]:.2f}, median {statistics.median(spread):.2f}, "
                f"{sum(e >= 0.95 * efficiency for e in spread)} within 5% of the best"
            )
            if spread
            else "none"
        )
        derived[name]["matmul_summary"] = (
            f"{efficiency:.3f} from {best.label} by {best.kernel} "
            f"({best.seconds * 1e3:.3f} ms); {len(timings)} dense-size timings, "
            f"matmul-bound spread {spread_text}"
        )
        glu = glu_found[name] and read_glu(glu_found[name].path)
        glu_note = (
            (
                f" tokamax's gated_linear_unit (an XLA dense GLU, {len(glu)} calls in {glu_found[name].cite}) "
                f"reaches at most {max(g[1] for g in glu) / peak:.2f} ({max(glu, key=lambda g: g[1])[0]}): "
                f"widths of at most {max(g[2] for g in glu)} in and {max(g[3] for g in glu)} out leave it "
                f"bound by its epilogue and weight loads, not the MXU, so it is not used"
            )
            if glu
            else ""
        )
        matmul_efficiency[name] = efficiency
        derived[name]["figures"]["matmul_efficiency"] = _round(efficiency)
        derived[name]["sources"]["matmul_efficiency"] = (
            f"the best of {len(timings)} bf16 ragged dots at dense sizes (every group ≥{DENSE_GROUP_ROWS} rows, or "
            f"that many on average where tokamax generates them; contracting and output widths ≥{DENSE_DIM}) in "
            f"{'; '.join(s.cite for s in matmuls)}: {best.label} by {best.kernel}, {best.seconds * 1e3:.3f} ms, "
            f"{best.flops_per_s / 1e12:.0f} TFLOP/s of {peak / 1e12:.0f} per device. Spread over the "
            f"{len(spread)} matmul-bound ones (arithmetic intensity ≥{MATMUL_BOUND:g}× the ridge point of "
            f"{ridge:.0f} FLOP/B): {spread_text}; best per kernel "
            f"{', '.join(f'{k} {v:.2f}' for k, v in sorted(by_kernel.items()))}. The best, not the median: "
            f"cpplan prices XLA's dense dot, which has no groups to walk; the grouped kernels' shortfalls are "
            f"their tiling (see dense_matmul_efficiency in validation/kernel_fits.py).{glu_note}"
        )

    for name in DEVICE_DIRS:
        d = derived[name]
        stand_in = ATTENTION_STAND_IN.get(name)
        if name not in attention_fits and stand_in and stand_in[0] in attention_fits:
            other, why = stand_in
            for field in (
                "attention_efficiency",
                "attention_block_overhead_s",
                "attention_masked_element_s",
                "attention_operand_passes",
            ):
                d["figures"][field] = derived[other]["figures"][field]
                d["sources"][field] = f"no attention timings for {name} in tokamax: assumed {other}'s ({why})"
        stand_in = BACKWARD_STAND_IN.get(name)
        if name not in backward_ratios and stand_in and stand_in[0] in backward_ratios:
            other, why = stand_in
            for field in ("attention_backward_over_forward", "attention_backward_operand_passes"):
                d["figures"][field] = derived[other]["figures"][field]
                d["sources"][field] = f"no VJP timings for {name} in tokamax: assumed {other}'s ({why})"
        stand_in = MATMUL_STAND_IN.get(name)
        if name not in matmul_efficiency and stand_in and stand_in[0] in matmul_efficiency:
            other, why = stand_in
            d["figures"]["matmul_efficiency"] = derived[other]["figures"]["matmul_efficiency"]
            d["sources"]["matmul_efficiency"] = (
                f"no dense matmul timings for {name} in tokamax: assumed {other}'s ({why})"
            )

    for name, timings in forward_timings.items():
        fitted = derived[name]["figures"]
        fit = AttentionFit(
            fitted["attention_efficiency"],
            fitted["attention_block_overhead_s"],
            fitted["attention_masked_element_s"],
            fitted["attention_operand_passes"],
            fitted["attention_backward_operand_passes"],
        )
        ratio = fitted.get("attention_backward_over_forward", chips[name].attention_backward_over_forward)
        before = AttentionFit(1.0, 0.0, 0.0, 0.0)  # every TPU row before these fits
        for t in timings:
            derived[name]["comparison"].append(
                (
                    "forward",
                    t,
                    model_attention(chips[name], t, fit, ratio)[0],
                    model_attention(chips[name], t, before, 2.5)[0],
                )
            )
        _, backward, _ = found[name]
        if backward is not None:
            for t in read_attention(backward.path, backward=True):
                derived[name]["comparison"].append(
                    (
                        "backward",
                        t,
                        model_attention(chips[name], t, fit, ratio)[1],
                        model_attention(chips[name], t, before, 2.5)[1],
                    )
                )
        if chips[name].devices_per_chip > 1:
            best_elsewhere: dict[str, dict[str, float]] = {}  # label -> chip -> best efficiency of the whole chip
            for other, other_timings in matmul_timings.items():
                for t in other_timings:
                    if other != name and chips[other].devices_per_chip == 1:
                        shape = best_elsewhere.setdefault(t.label, {})
                        shape[other] = max(shape.get(other, 0.0), t.flops_per_s / chips[other].peak_bf16_flops_per_s)
            shared = [t for t in matmul_timings.get(name, []) if t.label in best_elsewhere]
            # the shape the most chips time, and of those the one they run best: the cleanest comparison
            matmul = max(
                shared,
                key=lambda t: (
                    len(best_elsewhere[t.label]),
                    statistics.mean(best_elsewhere[t.label].values()),
                    t.flops_per_s,
                ),
                default=None,
            )
            note = (
                f"; tokamax's {name} timings are "
                f"{per_core_note(chips[name], timings, matmul, best_elsewhere[matmul.label] if matmul else {})}"
            )
            derived[name]["per_core_note"] = note
            for field in ("attention_efficiency", "matmul_efficiency"):
                derived[name]["sources"][field] += note
    return derived


def report(derived: dict[str, dict]) -> str:
    """The kernel-level comparison: per call, then MAPE per chip, direction and length band."""
    lines = [
        "# cpplan kernel time vs tokamax's measured TPU flash attention (fastest config per call)",
        "# model: the fitted chip row; before: attention efficiency 1, no step/call/mask costs, backward 2.5×",
        "",
    ]
    summary = [f"{'chip':6} {'pass':8} {'band':7} {'calls':>5} {'MAPE':>7} {'before':>7} {'median signed':>13}"]
    for name, d in derived.items():
        if not d["comparison"]:
            continue
        lines.append(f"## {name}")
        for direction, t, model, before in d["comparison"]:
            lines.append(
                f"{direction:8} {t.label:32} blocks {t.block_q}/{t.block_kv}  "
                f"measured {t.seconds * 1e3:8.3f} ms  model {model * 1e3:8.3f} ms "
                f"({model / t.seconds - 1:+6.1%})  before {before / t.seconds - 1:+6.1%}"
            )
        for direction in ("forward", "backward"):
            for band, keep in ((f"≥{LONG}", lambda t: t.seq >= LONG), (f"<{LONG}", lambda t: t.seq < LONG)):
                rows = [(m, t.seconds, b) for dr, t, m, b in d["comparison"] if dr == direction and keep(t)]
                if rows:
                    signed = statistics.median(m / t - 1 for m, t, _ in rows)
                    error = mape([(m, t) for m, t, _ in rows])
                    summary.append(
                        f"{name:6} {direction:8} {band:7} {len(rows):5d} {error:6.1f}%"
                        f" {mape([(b, t) for _, t, b in rows]):6.1f}% {signed:+12.1%}"
                    )
        full = {
            (dr, t.batch, t.seq, t.q_heads, t.head_dim): (t.seconds, m)
            for dr, t, m, _ in d["comparison"]
            if not t.causal
        }
        ratios = [
            (t.seconds / full[key][0], m / full[key][1])
            for dr, t, m, _ in d["comparison"]
            if t.causal and (key := (dr, t.batch, t.seq, t.q_heads, t.head_dim)) in full
        ]
        if ratios:
            measured, modelled = zip(*ratios)
            lines.append(
                f"causal/full time ratio over {len(ratios)} pairs: measured {min(measured):.2f}-"
                f"{max(measured):.2f}, model {min(modelled):.2f}-{max(modelled):.2f}"
            )
        if "per_core_note" in d:
            lines.append(d["per_core_note"].lstrip("; ") + ".")
        lines.append("")
    matmul = [f"{name}: {d['matmul_summary']}" for name, d in derived.items() if "matmul_summary" in d]
    return "\n".join(
        lines
        + [
            "## MAPE (model vs measured; 'before' is the previous row)",
            *summary,
            "",
            "## Matmul efficiency (best dense-size grouped matmul over the per-device peak)",
            *matmul,
            "",
        ]
    )


def write_rows(derived: dict[str, dict], *, only: list[str] | None = None) -> None:
    """Writes the figures (all, or those named in `only`) and their sources into the chip rows,
    leaving every other field alone."""
    for name, d in derived.items():
        path = CHIP_DIR / f"{name}.json"
        row = json.loads(path.read_text())
        fields = [f for f in d["figures"] if only is None or f in only]
        row.update({f: d["figures"][f] for f in fields})
        row["sources"].update({f: d["sources"][f] for f in fields})
        Chip.from_dict(row, origin=str(path))  # a row that would not load is never written
        path.write_text(json.dumps(row, indent=2) + "\n")
