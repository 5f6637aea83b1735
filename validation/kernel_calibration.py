"""Calibration on a chip that runs the kernels natively (a TPU): the matmul rate at a model's shapes,
splash's forward and both backwards (fused; dq + dK/dV) timed at the blocks the search uses over
4K-128K tokens and two head sizes, and an elementwise pass. The attention figures of the chip row are
fitted to those timings by least squares, each through the formulas the price itself uses
(`splash_step_costs`, the backward at `attention_backward_over_forward`, separate kernels at
`attention_unfused_backward_factor`), so the fitted row prices the timed kernels as closely as the fit
error says. Sizes are bounded so that the whole run takes minutes on one chip.
Method: docs/provenance/strategies_and_validation.md#calibration
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from cost_models.compute import causal_block_fraction, dq_elements, dq_partials, splash_step_costs

LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)
BLOCKS = (1024, 2048, 512)  # in the order timed: a budget cut leaves out the blocks the search uses least
HEAD_DIMS = (128, 256)
# the heads a timing runs are halved (down to one kv head's group) until the forward stays under this
# many FLOPs, about 40 ms on a v5e chip: long sequences cost what short ones do
FORWARD_FLOPS = 4e12
FUSED_PARTIALS_BYTES = (
    2 * 2**30
)  # the fused backward's dq partials (one q-sized array per key block) above this are not timed
ATTENTION_BUDGET_S = 300.0  # compiles included; the shapes left when it is spent are listed as not timed
MATMUL_TOKENS = 8192  # rows of the model's matmuls
MEMORY_VALUES = 2**27  # an elementwise pass over 256 MiB of bf16

KINDS = ("forward", "backward_fused", "backward_separate")
# the fitted figures, in the order of the fit's parameters
FIGURES = (
    "attention_s_per_flop",
    "attention_block_overhead_s",
    "attention_masked_element_s",
    "attention_operand_passes",
    "attention_backward_over_forward",
    "attention_backward_operand_passes",
    "attention_unfused_backward_factor",
)


def chip_figures(chip) -> tuple:
    """A chip row's attention figures in `FIGURES` order: what `native_figures` fits, read back from the row."""
    return (
        1.0 / (chip.attention_efficiency * chip.peak_bf16_flops_per_s),
        chip.attention_block_overhead_s,
        chip.attention_masked_element_s,
        chip.attention_operand_passes,
        chip.attention_backward_over_forward,
        chip.attention_backward_operand_passes,
        chip.attention_unfused_backward_factor,
    )


@dataclass(frozen=True)
class KernelShape:
    """One timed splash call: lengths, square blocks, causal, heads (query, kv) and head size."""

    q_len: int
    kv_len: int
    block: int
    causal: bool
    heads: int
    kv_heads: int
    head_dim: int


def kernel_shapes(heads: int, kv_heads: int, head_dim: int) -> list[KernelShape]:
    """The causal calls timed, for a model of `heads` / `kv_heads` × `head_dim`: each head size of
    `HEAD_DIMS` with the model's width of heads (heads × head_dim) and its query heads per kv head,
    every length of `LENGTHS` and block of `BLOCKS`, heads halved at long lengths (`FORWARD_FLOPS`)."""
    group = max(heads // kv_heads, 1)
    shapes = []
    for block in BLOCKS:
        for dim in HEAD_DIMS:
            width = max(heads * head_dim // dim, group)
            for length in LENGTHS:
                h = width
                while h > group and 4 * length * length / 2 * h * dim > FORWARD_FLOPS and (h // 2) % group == 0:
                    h //= 2
                shapes.append(KernelShape(length, length, block, True, h, max(h // group, 1), dim))
    return shapes


def fused_partials_bytes(shape: KernelShape, act_bytes: int) -> int:
    """Bytes of the fused backward's dq partials as jax's splash holds them (`compute.dq_partials`)."""
    count, nbytes = dq_partials(shape.kv_len, shape.block, act_bytes=act_bytes, in_q_dtype=True)
    return int(count * nbytes * dq_elements(shape.heads, shape.q_len, shape.head_dim))


@dataclass(frozen=True)
class KernelTerms:
    """What one call's kernels cost per unit of each fitted figure: executed forward FLOPs, and per kernel
    kind the seconds per unit of (block overhead, masked logit, forward operand passes, backward operand
    passes) and a fixed part (the fused backward's dq partials through HBM)."""

    flops: float
    units: dict  # kind -> (per step s, per masked element s, forward passes, backward passes)
    fixed: dict  # kind -> seconds


def kernel_terms(shape: KernelShape, *, act_bytes: int, hbm_s_per_byte: float) -> KernelTerms:
    """The price's terms for one call, as `cost_models.pricing.attention` prices it on one device."""
    extent = (
        shape.q_len * shape.kv_len * (float(causal_block_fraction(shape.q_len, shape.block)) if shape.causal else 1)
    )
    flops = 4.0 * shape.heads * shape.head_dim * extent

    def costs(fused: bool, step=0.0, masked=0.0, passes=(0.0, 0.0), hbm=0.0):
        fwd, bwd = splash_step_costs(
            shape.heads,
            shape.kv_heads,
            shape.q_len,
            shape.kv_len,
            head_dim=shape.head_dim,
            act_bytes=act_bytes,
            block_q=shape.block,
            block_kv=shape.block,
            per_step_s=step,
            per_step_byte_s=0.0,
            per_masked_element_s=masked,
            per_call_byte_s=passes,
            causal=shape.causal,
            fused_backward=fused,
            hbm_s_per_byte=hbm,
            dq_partials_in_q_dtype=True,  # jax's splash, which calibrate times
        )
        return float(fwd), float(bwd)

    units, fixed = {}, {}
    for kind, fused in (("forward", False), ("backward_fused", True), ("backward_separate", False)):
        side = 0 if kind == "forward" else 1
        units[kind] = (
            costs(fused, step=1.0)[side],
            costs(fused, masked=1.0)[side],
            costs(fused, passes=(hbm_s_per_byte, 0.0))[side],
            costs(fused, passes=(0.0, hbm_s_per_byte))[side],
        )
        fixed[kind] = costs(fused, hbm=hbm_s_per_byte)[side]
    return KernelTerms(flops, units, fixed)


def predict(figures: np.ndarray, terms: KernelTerms, kind: str) -> float:
    """Seconds of one kernel kind of a call under the figures (in `FIGURES` order)."""
    per_flop, step, masked, passes, ratio, bwd_passes, unfused = figures
    math = (
        per_flop * terms.flops * {"forward": 1.0, "backward_fused": ratio, "backward_separate": ratio * unfused}[kind]
    )
    per_step, per_masked, fwd_pass, bwd_pass = terms.units[kind]
    return math + step * per_step + masked * per_masked + passes * fwd_pass + bwd_passes * bwd_pass + terms.fixed[kind]


@dataclass(frozen=True)
class KernelFit:
    """The fitted figures (`FIGURES` order) and, per timing, (shape, kind, measured s, fitted s)."""

    figures: tuple
    points: tuple

    def errors(self, kind: str | None = None) -> np.ndarray:
        """|fitted ÷ measured − 1| of the timings (of one kernel kind)."""
        return np.array([abs(f / t - 1) for _, k, t, f in self.points if kind in (None, k)])

    def error_text(self) -> str:
        """The fit's errors in words: mean and largest, overall and per kernel kind."""
        kinds = ", ".join(f"{k.replace('_', ' ')} {self.errors(k).mean():.1%}" for k in KINDS if len(self.errors(k)))
        return f"mean error {self.errors().mean():.1%}, largest {self.errors().max():.1%} ({kinds})"


def fit_kernels(points: list[tuple[KernelShape, str, float]], terms: dict, extra=None) -> KernelFit:
    """The figures that best explain the timings `points` (shape, kernel kind, seconds), in relative error
    so that every timing weighs the same; every figure ≥ 0, the FLOP cost, backward ratio and unfused
    factor > 0. `terms`: shape -> `KernelTerms`. `extra`, to try one more figure beside the seven: (units,
    scale), `units(shape, kind)` how much of it a call's kernel of that kind holds and `scale` the seconds a
    unit is about; its fitted figure (≥ 0) follows the seven."""
    seconds = np.array([t for *_, t in points])
    flops = np.array([terms[s].flops for s, *_ in points])
    per_flop = float(
        np.median(seconds[[k == "forward" for _, k, _ in points]] / flops[[k == "forward" for _, k, _ in points]])
    )
    x0 = [per_flop, 1e-7, 1e-13, 1.0, 2.0, 1.0, 1.3]
    scale = [per_flop, 1e-7, 1e-12, 1.0, 1.0, 1.0, 1.0]
    lower = [1e-3, 0, 0, 0, 0.1, 0, 0.1]
    if extra is not None:
        x0, scale, lower = x0 + [extra[1]], scale + [extra[1]], lower + [0]
    x0, scale = np.array(x0), np.array(scale)

    def price(figures, shape, kind):
        more = figures[7] * extra[0](shape, kind) if extra is not None else 0.0
        return predict(figures[:7], terms[shape], kind) + more

    def residuals(x):
        figures = x * scale
        return np.array([price(figures, s, k) / t - 1 for s, k, t in points])

    fit = least_squares(residuals, x0 / scale, bounds=(np.array(lower), np.inf), x_scale="jac")
    figures = fit.x * scale
    return KernelFit(
        tuple(float(f) for f in figures),
        tuple((s, k, float(t), float(price(figures, s, k))) for s, k, t in points),
    )


def time_kernels(mesh, topo, dtype: str, shapes: list[KernelShape], *, repeats: int, act_bytes: int):
    """Times each shape's kernels (`runtime.measure.time_splash`) until `ATTENTION_BUDGET_S` is spent.

    Returns:
        (timings: list of dicts, one per shape timed, with the shape, seconds per kind and errors;
        the shapes left untimed by the budget)
    """
    from runtime import measure

    timings, start = [], time.perf_counter()
    for i, shape in enumerate(shapes):
        if time.perf_counter() - start > ATTENTION_BUDGET_S:
            return timings, shapes[i:]
        partials = fused_partials_bytes(shape, act_bytes)
        skip = (
            f"its dq partials would take {partials / 2**30:.1f} GiB (over {FUSED_PARTIALS_BYTES / 2**30:.0f})"
            if partials > FUSED_PARTIALS_BYTES
            else ""
        )
        heads = dict(heads=shape.heads, kv_heads=shape.kv_heads, head_dim=shape.head_dim)
        shape4 = (shape.q_len, shape.kv_len, shape.block, shape.causal)
        times = measure.time_splash(mesh, topo, dtype, shape4, repeats=repeats, skip_fused=skip, **heads)
        timings.append(
            {
                "shape": shape.__dict__,
                "forward_s": times.forward_s,
                "backward_fused_s": times.backward_fused_s,
                "backward_separate_s": times.backward_separate_s,
                "errors": times.errors,
            }
        )
    return timings, []


def time_kernels_into(path: Path, chip, shapes: list[KernelShape], *, repeats: int, act_bytes: int) -> None:
    """Times each shape's kernels on this machine's one `chip` as `cpplan calibrate` timed the kernels its row
    was fitted to (the chip's compiler flags, its most scoped VMEM), one shape at a time, each written to `path`
    (a JSON line with the device and the jax release, the file started afresh) and printed as it is measured."""
    from runtime.launch import use_tpu_compiler_flags

    use_tpu_compiler_flags(chip, chip.scoped_vmem_max_bytes // 1024)
    import jax

    from cost_models.topology import get_topology
    from runtime import measure

    topo = get_topology(f"{chip.name}:1x1")
    mesh = measure.device_mesh(topo)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as log:
        for shape in shapes:
            (timing,), _ = time_kernels(mesh, topo, "bfloat16", [shape], repeats=repeats, act_bytes=act_bytes)
            log.write(json.dumps(timing | {"device": jax.devices()[0].device_kind, "jax": jax.__version__}) + "\n")
            log.flush()
            print(json.dumps(timing), flush=True)


def read_timings(path: Path) -> list[dict]:
    """The timings `time_kernels_into` wrote to `path`."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def kernel_timing_script(argv: list[str], *, doc: str, stem: str, shapes, repeats: int, act_bytes: int, report) -> int:
    """The command line of a script that times splash calls on a chip and reports on them,
    `SCRIPT OUT [CHIP] [--price-only]` (CHIP: a chip row, default v5e): times `shapes` into OUT/<stem>.jsonl
    (`time_kernels_into`), unless --price-only reads that file again, anywhere; then writes and prints
    `report(timings, chip, chip_name)`, its lines, as OUT/<stem>.txt. No OUT: prints `doc`, status 2."""
    from cost_models.chips import get_chip

    if not argv or argv[0].startswith("-"):
        print(doc, file=sys.stderr)
        return 2
    out = Path(argv[0])
    chip_name = next((a for a in argv[1:] if not a.startswith("-")), "v5e")
    chip = get_chip(chip_name)
    path = out / f"{stem}.jsonl"
    if "--price-only" not in argv[1:]:
        time_kernels_into(path, chip, list(shapes), repeats=repeats, act_bytes=act_bytes)
    text = "\n".join(report(read_timings(path), chip, chip_name))
    (out / f"{stem}.txt").write_text(text + "\n")
    print(text)
    return 0


def timed_points(timings: list[dict]) -> list[tuple[KernelShape, str, float]]:
    """(shape, kind, seconds) of every kernel timed."""
    return [
        (KernelShape(**t["shape"]), kind, t[f"{kind}_s"])
        for t in timings
        for kind in KINDS
        if t[f"{kind}_s"] is not None
    ]


def model_matmuls(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int) -> list[tuple]:
    """(m, k, n) of a Llama-style layer's matmuls over `MATMUL_TOKENS` rows: the q, k, v projections, the
    output projection, the MLP's gate and up projections, and its down projection."""
    t = MATMUL_TOKENS
    return [
        (t, hidden, (heads + 2 * kv_heads) * head_dim),
        (t, heads * head_dim, hidden),
        (t, hidden, 2 * intermediate),
        (t, intermediate, hidden),
    ]


@dataclass(frozen=True)
class ModelDims:
    """The model shapes a chip is calibrated at (default: the 4-layer Llama-shaped benchmark model)."""

    hidden: int = 2048
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 8192


def native_figures(mesh, topo, dtype: str, *, repeats: int, how: str, dims: ModelDims, shapes=None):
    """Measures and fits the compute figures of a chip that runs the kernels natively.

    Args:
        mesh, topo: the devices (`runtime.measure.device_mesh`) and their topology.
        how: the sources' opening words (which command measured, when).
        dims: the model whose matmuls and heads are timed.
        shapes: the splash calls timed (default `kernel_shapes` of the model's heads).
    Returns:
        (the row's fields measured, their sources, the raw timings and fit)
    """
    import jax.numpy as jnp

    from runtime import measure

    act_bytes = jnp.dtype(dtype).itemsize
    peak = topo.peak_flops_per_device
    matmuls = model_matmuls(dims.hidden, dims.heads, dims.kv_heads, dims.head_dim, dims.intermediate)
    matmul_s = measure.measure_matmuls(mesh, dtype, matmuls, repeats)
    rate = sum(2.0 * m * k * n for m, k, n in matmuls) / sum(matmul_s)  # per device: the layer's mix, time-weighted
    memory = measure.measure_memory(mesh, dtype, MEMORY_VALUES, repeats) / mesh.devices.size
    shapes = kernel_shapes(dims.heads, dims.kv_heads, dims.head_dim) if shapes is None else shapes
    timings, untimed = time_kernels(mesh, topo, dtype, shapes, repeats=repeats, act_bytes=act_bytes)
    points = timed_points(timings)
    terms = {s: kernel_terms(s, act_bytes=act_bytes, hbm_s_per_byte=1.0 / memory) for s, *_ in points}
    fit = fit_kernels(points, terms)
    per_flop, step, masked, passes, ratio, bwd_passes, unfused = fit.figures
    measured = dict(
        matmul_efficiency=min(rate / peak, 1.0),
        hbm_bw_bytes_per_s=memory * topo.devices_per_chip,
        attention_efficiency=1.0 / (per_flop * peak),
        attention_block_overhead_s=step,
        attention_step_s_per_operand_byte=0.0,
        attention_masked_element_s=masked,
        attention_operand_passes=passes,
        attention_backward_over_forward=ratio,
        attention_backward_operand_passes=bwd_passes,
        attention_unfused_backward_factor=unfused,
    )
    lengths = sorted({s.q_len for s, *_ in points})
    blocks = sorted({s.block for s, *_ in points})
    dims_text = sorted({f"{s.heads}/{s.kv_heads} heads × {s.head_dim}" for s, *_ in points})
    timed = (
        f"{len(points)} timings of jax's splash kernels (forward; fused backward; separate dq + dK/dV) in "
        f"{dtype}, causal, {lengths[0]}-{lengths[-1]} tokens, blocks {blocks}, {', '.join(dims_text)} "
        f"(heads fewer at long lengths)"
    )
    fitted = f"{how}: a least-squares fit (scipy, relative error) of {timed}; {fit.error_text()}; the same fit gives"
    sources = {
        "matmul_efficiency": (
            f"{how}: {dtype} matmuls of a layer of hidden {dims.hidden}, {dims.heads}/{dims.kv_heads} heads × "
            f"{dims.head_dim}, intermediate {dims.intermediate} over {MATMUL_TOKENS} tokens "
            f"({', '.join(f'{m}×{k}·{k}×{n}' for m, k, n in matmuls)}), fastest of at least {repeats} timings "
            f"each, calls dispatched back to back: {rate / 1e12:.1f} TFLOP/s over the cited peak"
        ),
        "hbm_bw_bytes_per_s": (
            f"{how}: x*1.5+0.5 over {MEMORY_VALUES} {dtype} values per device (one read, one write), calls "
            f"dispatched back to back"
        ),
        "attention_efficiency": f"{fitted} the forward's FLOP rate, relative to the cited peak",
        "attention_block_overhead_s": f"{fitted} the cost per grid step of each kernel",
        "attention_step_s_per_operand_byte": (
            "0: a Mosaic kernel on a TPU moves one block per operand per grid step (the fit's passes over the "
            "operands hold what a call pays per byte)"
        ),
        "attention_masked_element_s": f"{fitted} the cost per logit where the causal rule is evaluated",
        "attention_operand_passes": f"{fitted} the forward's passes over its operands at HBM bandwidth",
        "attention_backward_over_forward": f"{fitted} the fused backward's MXU time over the forward's",
        "attention_backward_operand_passes": f"{fitted} the backward's passes over its operands at HBM bandwidth",
        "attention_unfused_backward_factor": f"{fitted} the dq and dK/dV kernels' time over the fused backward's",
    }
    raw = {
        "matmuls": [{"m": m, "k": k, "n": n, "seconds": t} for (m, k, n), t in zip(matmuls, matmul_s)],
        "matmul_flops_per_s_per_device": rate,
        "memory_bytes_per_s_per_device": memory,
        "splash": timings,
        "splash_not_timed": [s.__dict__ for s in untimed],
        "splash_fit": {
            "figures": dict(zip(FIGURES, fit.figures)),
            "mean_error": float(fit.errors().mean()),
            "max_error": float(fit.errors().max()),
            "points": [{"shape": s.__dict__, "kind": k, "measured_s": t, "fitted_s": f} for s, k, t, f in fit.points],
        },
    }
    return measured, sources, raw
