"""Calibration (`cpplan calibrate`): time the devices present (`runtime.measure`), fit the cost
model's figures to the times, and write a chip row saying how each figure was measured.

It fits only kernel and collective figures, never an efficiency to match an end-to-end step time.
Method: docs/provenance/strategies_and_validation.md#calibration
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from cost_models import collectives
from cost_models.chips import Chip, ChipRuleError
from cost_models.compute import SPLASH_BACKWARD_OVER_FORWARD, causal_block_fraction, splash_step_costs
from cost_models.errors import CpplanError
from cost_models.placement import axis_segments
from cost_models.topology import Topology, get_topology
from cost_models.vocabulary import DTYPE_BYTES
from validation.outputs import prepare_out_dir, write_atomic

COLLECTIVE_SIZES = (2**16, 2**18, 2**20, 2**22)  # bytes per device
# seq ÷ (q_len, kv_len, block), causal: varied independently so that the four fitted costs separate
ATTENTION_SHAPES = (
    (4, 4, 4, False),
    (4, 4, 8, False),
    (4, 1, 4, False),
    (2, 2, 4, False),
    (8, 1, 8, False),
    (1, 1, 4, True),
    (2, 2, 4, True),
)


def row_path(out: "str | Path", chip_name: str) -> Path:
    """Where `--out OUT` writes a chip's row: OUT if it is a `.json` file, else `OUT/<chip>.json`."""
    out = Path(out)
    return out if out.suffix == ".json" else out / f"{chip_name}.json"


@dataclass(frozen=True)
class Calibration:
    """A measured chip row and the raw figures behind it."""

    chip: Chip
    raw: dict

    def write(self, path: "str | Path") -> Path:
        """Writes the row as JSON to `row_path(path)`, and every raw timing behind it to `timings_path`
        beside it; returns the row's file."""
        path = row_path(path, self.chip.name)
        prepare_out_dir(path.parent, (path.name,))
        timings = timings_path(path)
        prepare_out_dir(timings.parent, (timings.name,))
        write_atomic(timings, json.dumps(self.raw, indent=1, default=str) + "\n")
        return write_atomic(path, json.dumps(self.chip.to_dict(), indent=2, allow_nan=False) + "\n")


def timings_path(row: Path) -> Path:
    """Where the raw timings of the row at `row` go: `timings/<row's name>` beside it (a folder of its own,
    since every .json beside the row is read as a chip row)."""
    return row.parent / "timings" / row.name


@dataclass(frozen=True)
class AttentionFit:
    """Splash forward + backward's four fitted costs (seconds per FLOP, per grid step, per operand
    byte per step, per masked logit) and `shapes`: (q_len, kv_len, block, causal, measured, fitted)."""

    per_flop_s: float
    per_step_s: float
    per_step_byte_s: float
    per_masked_element_s: float
    shapes: tuple

    @property
    def mean_error(self) -> float:
        """Mean |fitted ÷ measured − 1| over the shapes."""
        return float(np.mean([abs(fit / t - 1) for *_, t, fit in self.shapes]))


def splash_terms(
    q_len: int, kv_len: int, block: int, causal: bool, *, heads: int, kv_heads: int, head_dim: int, act_bytes: int
) -> tuple[float, float, float, float]:
    """(executed FLOPs, grid steps, operand bytes × steps, masked logits) of one call's forward +
    backward, as the cost model prices them."""
    flops = 4.0 * q_len * kv_len * heads * head_dim * (1 + SPLASH_BACKWARD_OVER_FORWARD)
    if causal:
        flops *= float(causal_block_fraction(q_len, block))
    units = [
        float(
            sum(
                splash_step_costs(
                    heads,
                    kv_heads,
                    q_len,
                    kv_len,
                    head_dim=head_dim,
                    act_bytes=act_bytes,
                    block_q=block,
                    block_kv=block,
                    per_step_s=step,
                    per_step_byte_s=byte,
                    per_masked_element_s=masked,
                    causal=causal,
                )
            )
        )
        for step, byte, masked in np.eye(3)
    ]
    return (flops, *units)


def fit_attention(shapes, terms, times) -> AttentionFit:
    """The four attention costs (each ≥ 0) that best explain the times, in relative error so every shape
    weighs the same."""
    rows, seconds = np.asarray(terms, float), np.asarray(times, float)
    coef, _ = nnls(rows / seconds[:, None], np.ones(len(seconds)))
    fitted = rows @ coef
    return AttentionFit(
        *(float(c) for c in coef), tuple((*s, float(t), float(f)) for s, t, f in zip(shapes, seconds, fitted))
    )


def fit_host_collectives(points: dict, n: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """(kind → [bytes/s, latency s], kind → mean |fitted ÷ measured − 1|) on a host, each kind fitted
    to its own `points` (bytes per device, seconds) as `collectives.HOST_FORMULAS` charges it."""
    fitted, errors = {}, {}
    for kind, formula in collectives.HOST_FORMULAS.items():
        sizes = np.array([b for b, _ in points[kind]], dtype=float)
        seconds = np.array([t for _, t in points[kind]])
        volume = sizes * n if kind == "all_gather" else sizes
        unit = np.array([formula(v, n, 1.0, 0.0) for v in volume])  # seconds at 1 byte/s, no latency
        # relative error, so that small sizes (the plans' own) count as much
        (lat, per_byte), _ = nnls(
            np.stack([np.ones_like(unit), unit], axis=1) / seconds[:, None], np.ones_like(seconds)
        )
        if per_byte <= 0:  # too noisy to see the bandwidth: charge the largest size's time to it
            lat, per_byte = 0.0, seconds[-1] / unit[-1]
        bw = 1.0 / per_byte
        fitted[kind] = [float(bw), float(lat)]
        errors[kind] = float(np.mean([abs(formula(v, n, bw, lat) / t - 1) for v, t in zip(volume, seconds)]))
    return fitted, errors


def fit_links(topo: Topology, points: dict) -> tuple[float, float, dict[str, float]]:
    """(link bytes/s, hop latency s) that make the model's all-gather over all devices match `points`,
    and the other kinds' mean |predicted ÷ measured − 1| with them."""
    dims = topo.physical_dims
    segs = axis_segments((topo.num_devices,), tuple(d.size for d in dims))[0]
    unit = topo.links(segs)  # the model's figures with the row's current link values
    link = dims[segs[0].dim].link_bw_bytes_per_s
    latency = dims[0].hop_latency_s
    bw_per_link = unit.collective_bw_bytes_per_s / link
    lat_per_hop = unit.collective_latency_s / latency if latency else 0.0
    n = topo.num_devices
    gathered = np.array([b * n for b, _ in points["all_gather"]], dtype=float)
    seconds = np.array([t for _, t in points["all_gather"]])
    slope, intercept = np.polyfit(gathered * (n - 1) / n, seconds, 1)
    fitted_link = 1.0 / (slope * bw_per_link)
    fitted_hop = max(intercept, 0.0) / lat_per_hop if lat_per_hop else 0.0
    coll_bw, coll_lat = fitted_link * bw_per_link, fitted_hop * lat_per_hop
    ring_bw = unit.ring_bw_bytes_per_s / link * fitted_link
    ring_lat = unit.ring_latency_s / latency * fitted_hop if latency else 0.0
    predict = {
        "reduce_scatter": lambda b: collectives.reduce_scatter(b, n, coll_bw, coll_lat),
        "all_to_all": lambda b: collectives.all_to_all(b, n, coll_bw, coll_lat),
        "ppermute": lambda b: collectives.ppermute(b, ring_bw, ring_lat),
    }
    errors = {name: float(np.mean([abs(predict[name](b) / t - 1) for b, t in points[name]])) for name in predict}
    return fitted_link, fitted_hop, errors


NO_LINKS = "one device, so no links between devices to time"


def has_links(topo: Topology) -> bool:
    """Whether the devices of `topo` have links between them to time (one chip has none)."""
    return topo.num_devices > 1


def _measured_row(chip: Chip, measured: dict, topology: str) -> Chip:
    """`chip` with the `measured` fields, checked by `load_chip`'s rules now so that a disturbed timing
    is reported before the row is written."""
    origin = f"the row measured on {topology}"
    try:
        return Chip.from_dict({**chip.to_dict(), **measured}, origin=origin)
    except ChipRuleError as err:
        raise CpplanError(
            f"{origin}: {err.rule}. The measured figures disagree with each other, as they do when "
            f"other work took the cores during a timing or a fit is too noisy to hold its figure in "
            f"range: nothing was written. Run `cpplan calibrate` again on an idle machine, with more "
            f"--repeats."
        ) from None


def calibrate(
    topology: str,
    *,
    dtype: str = "float32",
    repeats: int = 5,
    matmul_size: int = 1024,
    attention_seq: int = 1024,
    attention_heads: int = 8,
    attention_kv_heads: int = 4,
    attention_head_dim: int = 32,
    model=None,
) -> Calibration:
    """Measures the devices present as `topology` and returns a chip row for them.

    On a host (kernels interpreted) the matmul, one attention fit and the memory pass are small, as below;
    on a chip that runs the kernels natively (a TPU) `validation.kernel_calibration` times the model's
    matmuls and splash's kernels at the sizes the plans run and fits the row's attention figures.

    Args:
        topology: e.g. ``cpu:8`` (jax must already have that many virtual devices).
        repeats: at least this many timings per figure (more below `MIN_TIMED_S`); the fastest is kept.
        matmul_size / attention_seq: a host's square matmul and attention length.
        attention_heads / attention_kv_heads / attention_head_dim: like the plans' per-device kernels (a host's).
        model: a `ModelSpec` whose shapes a TPU is timed at (default the 4-layer Llama-shaped benchmark model).
    Raises:
        CpplanError: the devices present do not form `topology`, or the figures measured break a
            chip row's rules (a disturbed timing).
    """
    from runtime import measure

    if dtype not in DTYPE_BYTES:
        raise CpplanError(
            f"calibrate dtype={dtype!r} is not one of {sorted(DTYPE_BYTES)} (the chip row's peak is a float matmul's)."
        )
    topo = get_topology(topology)
    mesh = measure.device_mesh(topo)
    chip = topo.chip
    when = time.strftime("%Y-%m-%d")
    how = f"measured by `cpplan calibrate --topology {topo.name}` on {when}, all {topo.num_devices} devices busy"
    if chip.kind.interprets_kernels:
        measured, compute_sources, raw = _host_figures(
            mesh,
            topo,
            dtype,
            repeats=repeats,
            how=how,
            matmul_size=matmul_size,
            attention_seq=attention_seq,
            heads=dict(heads=attention_heads, kv_heads=attention_kv_heads, head_dim=attention_head_dim),
        )
    else:
        from validation.kernel_calibration import ModelDims, native_figures

        dims = (
            ModelDims()
            if model is None
            else ModelDims(model.hidden, model.num_heads, model.num_kv_heads, model.head_dim, model.intermediate)
        )
        measured, compute_sources, raw = native_figures(mesh, topo, dtype, repeats=repeats, how=how, dims=dims)
    shares_cores = chip.kind.shares_cores
    linked = has_links(topo)
    points = measure.measure_collectives(mesh, COLLECTIVE_SIZES, repeats) if linked else {}
    link, hop, errors = fit_links(topo, points) if linked else (None, None, {})
    host, host_errors = fit_host_collectives(points, topo.num_devices) if shares_cores and linked else ({}, {})
    link_field = "core_link_bw_bytes_per_s" if shares_cores else "ici_link_bw_bytes_per_s"
    if not linked:  # the cited figures stay, each saying it was not measured here
        link = getattr(chip, link_field) or chip.ici_link_bw_bytes_per_s
        link_field = link_field if getattr(chip, link_field) else "ici_link_bw_bytes_per_s"
        hop, host = chip.ici_hop_latency_s, {kind: [bw, lat] for kind, bw, lat in chip.host_collectives}
    sources = {**chip.sources, **compute_sources}
    if linked:
        sources[link_field] = (
            f"{how}: fitted so the model's all-gather over all devices matches at "
            f"{list(COLLECTIVE_SIZES)} bytes per device; with it the model predicts "
            + ", ".join(f"{k} within {v:.0%}" for k, v in errors.items())
            + " on average"
        )
        sources["ici_hop_latency_s"] = f"{how}: the intercept of the same all-gather fit"
    else:
        unmeasured = f"not measured: `cpplan calibrate --topology {topo.name}` had {NO_LINKS}; kept from the cited row"
        for name in (link_field, "ici_hop_latency_s", *(("host_collectives",) if host else ())):
            sources[name] = f"{unmeasured} ({chip.sources.get(name, 'no source')})"
    if host and linked:
        sources["host_collectives"] = (
            f"{how}: each kind over all {topo.num_devices} devices at {list(COLLECTIVE_SIZES)} bytes per device, its "
            f"bandwidth and latency fitted to its own times (the virtual devices copy through shared memory, and XLA's "
            f"CPU collectives differ by kind); fit errors " + ", ".join(f"{k} {v:.0%}" for k, v in host_errors.items())
        )
    row = _measured_row(
        chip,
        dict(
            **measured,
            ici_hop_latency_s=hop,
            host_collectives=host,
            sources=sources,
            **{link_field: link},
        ),
        topology,
    )
    raw.update(
        {
            "collectives": points,
            "collective_model_errors": errors,
            "host_collective_errors": host_errors,
            "links_measured": linked,
        }
    )
    return Calibration(row, raw)


def _host_figures(mesh, topo, dtype: str, *, repeats: int, how: str, matmul_size: int, attention_seq: int, heads: dict):
    """(fields, sources, raw) of a host's compute: the peak is its square matmul's rate, and one fit of
    splash forward + backward in interpret mode (whose operand copies per grid step it prices) gives the
    attention figures."""
    import jax.numpy as jnp

    from runtime import measure

    per_chip = 1.0 / topo.num_chips
    matmul = measure.measure_matmul(mesh, dtype, matmul_size, repeats)
    shapes = [
        (attention_seq // q, attention_seq // kv, attention_seq // b, causal) for q, kv, b, causal in ATTENTION_SHAPES
    ]
    times = measure.time_attention(mesh, topo, dtype, shapes, repeats=repeats, **heads)
    terms = [splash_terms(*s, act_bytes=jnp.dtype(dtype).itemsize, **heads) for s in shapes]
    fit = fit_attention(shapes, terms, times)
    attention = mesh.devices.size / fit.per_flop_s  # executed FLOP/s of all devices together
    memory = measure.measure_memory(mesh, dtype, 2**22, repeats)
    sources = {
        "peak_bf16_flops_per_s": (
            f"{how}: {matmul_size}³ {dtype} matmuls, fastest of at least {repeats} (more where "
            f"{repeats} take under {measure.MIN_TIMED_S:g} s)"
        ),
        "matmul_efficiency": "1.0: the peak is the measured matmul throughput",
        "attention_efficiency": (
            f"{how}: splash forward + backward, {heads['heads']} query and "
            f"{heads['kv_heads']} kv heads × {heads['head_dim']}, (q, kv, block, causal) = "
            f"{[s[:4] for s in fit.shapes]}: the FLOP rate of the fit that, with a cost per grid "
            f"step, per operand byte per step and per masked logit, explains every time (mean "
            f"error {fit.mean_error:.1%}); relative to the matmul peak"
        ),
        "attention_block_overhead_s": f"{how}: the same fit; the fixed cost per grid step of each kernel",
        "attention_step_s_per_operand_byte": (
            f"{how}: the same fit; the cost per byte of a kernel's operand arrays "
            f"per grid step (interpret mode copies them at every step)"
        ),
        "attention_masked_element_s": (
            f"{how}: the same fit; the cost per logit of the blocks a causal mask cuts "
            f"through, per kernel (the mask rule is evaluated there)"
        ),
        "attention_backward_over_forward": (
            f"{how}: the fit prices the backward kernels at their FLOP ratio to the "
            f"forward ({SPLASH_BACKWARD_OVER_FORWARD}), its other costs per grid step"
        ),
        "attention_unfused_backward_factor": f"{how}: 1; the fit times the runtime's own backward kernels",
        "attention_operand_passes": f"{how}: 0; the fit's per-step operand cost holds what a call pays per byte",
        "attention_backward_operand_passes": f"{how}: 0, as for the forward",
        "hbm_bw_bytes_per_s": f"{how}: x*1.5+0.5 over 2^22 {dtype} values per device (one read, one write)",
    }
    measured = dict(
        peak_bf16_flops_per_s=matmul * per_chip,
        matmul_efficiency=1.0,
        attention_efficiency=attention / matmul,
        attention_block_overhead_s=fit.per_step_s,
        attention_step_s_per_operand_byte=fit.per_step_byte_s,
        attention_masked_element_s=fit.per_masked_element_s,
        attention_backward_over_forward=SPLASH_BACKWARD_OVER_FORWARD,
        attention_unfused_backward_factor=1.0,
        attention_operand_passes=0.0,
        attention_backward_operand_passes=0.0,
        hbm_bw_bytes_per_s=memory * per_chip,
    )
    raw = {
        "matmul_flops_per_s": matmul,
        "attention_flops_per_s": attention,
        "attention_fit": dataclasses.asdict(fit),
        "attention_fit_mean_error": fit.mean_error,
        "memory_bytes_per_s": memory,
    }
    return measured, sources, raw
