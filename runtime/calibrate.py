"""Measure the devices of a topology and write a chip row in the cited rows' JSON format.

`cpplan calibrate --topology cpu:8` runs on the devices present (8 virtual CPU devices here, a
real TPU or GPU slice elsewhere — the same code) and measures, with every device busy at once:

- matmul throughput (the row's peak; its matmul efficiency is then 1.0 by definition);
- causal splash attention forward + backward at two block sizes: the row's attention
  efficiency (FLOP/s relative to that peak) and its fixed cost per grid step visited;
- memory-bound throughput (an elementwise pass over large arrays): the row's HBM bandwidth;
- all-gather, reduce-scatter, all-to-all and ppermute over all devices at several sizes. The
  link bandwidth and per-hop latency are fitted so that the cost model's own all-gather formula
  on this topology reproduces the all-gather times; the other three are then predicted with
  those two figures and their errors recorded in the row, so a reader sees how far they hold.

The row records how each figure was measured. Calibration never touches an efficiency to make
an end-to-end step time come out right.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cost_models import collectives
from cost_models.chips import Chip
from cost_models.compute import SPLASH_BACKWARD_OVER_FORWARD, causal_block_fraction, splash_step_costs
from cost_models.errors import CpplanError
from cost_models.placement import axis_segments
from cost_models.topology import Topology, get_topology

COLLECTIVE_SIZES = (2**16, 2**18, 2**20, 2**22)  # bytes per device


@dataclass(frozen=True)
class Calibration:
    """A measured chip row and the raw figures behind it."""

    chip: Chip
    raw: dict

    def write(self, path: "str | Path") -> Path:
        path = Path(path)
        if path.suffix != ".json":
            path = path / f"{self.chip.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.chip.to_dict(), indent=2) + "\n")
        return path


def _best_time(fn, *args, repeats: int) -> float:
    """The fastest of `repeats` timed runs (after a warm-up): on a shared host other work only
    ever adds time, so the fastest run is the machine's own speed (timeit's rule)."""
    import jax

    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return min(times)


def _mesh(topo: Topology):
    import jax
    from jax.sharding import Mesh

    devices = jax.devices()
    if len(devices) != topo.num_devices:
        raise CpplanError(f"{topo.name} has {topo.num_devices} devices but {len(devices)} are present; for cpu:N set "
                          f"XLA_FLAGS=--xla_force_host_platform_device_count=N before jax is imported.")
    return Mesh(np.array(devices), ("d",))


def _per_device(mesh, fn, *shapes_dtypes):
    """`fn` run on every device at once on per-device arrays of the given (shape, dtype)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    n = mesh.devices.size
    arrays = [jax.device_put(jnp.ones((n * shape[0], *shape[1:]), dtype) * 0.01, NamedSharding(mesh, P("d")))
              for shape, dtype in shapes_dtypes]
    mapped = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=tuple(P("d") for _ in arrays), out_specs=P("d"),
                                   check_vma=False))  # pallas kernels (splash) do not annotate varying axes
    return mapped, arrays


def measure_matmul(mesh, dtype: str, size: int, repeats: int) -> float:
    """FLOP/s of all devices together, each multiplying two size×size matrices."""
    mapped, arrays = _per_device(mesh, lambda a, b: a @ b, ((size, size), dtype), ((size, size), dtype))
    return mesh.devices.size * 2 * size**3 / _best_time(mapped, *arrays, repeats=repeats)


# seq ÷ (q_len, kv_len, block), and whether the mask is causal
ATTENTION_SHAPES = ((4, 4, 4, False), (4, 4, 8, False), (4, 1, 4, False), (2, 2, 4, False), (8, 1, 8, False),
                    (1, 1, 4, True), (2, 2, 4, True))


@dataclass(frozen=True)
class AttentionFit:
    """Splash forward + backward as the cost model prices it, fitted on several shapes.

    Attributes:
        per_flop_s: seconds per executed FLOP.
        per_step_s: fixed seconds per grid step of each kernel.
        per_step_byte_s: seconds per operand byte per grid step (interpreted kernels copy
            their operand arrays at every step; 0 where they do not).
        per_masked_element_s: seconds per logit of a block the causal mask cuts through.
        shapes: (q_len, kv_len, block, causal, measured s, fitted s) of every run.
    """

    per_flop_s: float
    per_step_s: float
    per_step_byte_s: float
    per_masked_element_s: float
    shapes: tuple

    @property
    def mean_error(self) -> float:
        return float(np.mean([abs(fit / t - 1) for *_, t, fit in self.shapes]))


def _splash_terms(q_len, kv_len, block, heads, kv_heads, head_dim, act_bytes, causal):
    """(executed FLOPs, step units, byte units, masked-logit units) of one call's forward + backward:
    the factors of the four costs, exactly as the cost model prices them."""
    flops = 4.0 * q_len * kv_len * heads * head_dim * (1 + SPLASH_BACKWARD_OVER_FORWARD)
    if causal:
        flops *= float(causal_block_fraction(q_len, block))
    shape = (heads, kv_heads, q_len, kv_len, head_dim, act_bytes, block, block)
    units = [float(sum(splash_step_costs(*shape, *unit, causal=causal))) for unit in np.eye(3)]
    return (flops, *units)


def measure_attention(mesh, topo: Topology, dtype: str, seq: int, heads: int, kv_heads: int, head_dim: int,
                      repeats: int) -> AttentionFit:
    """Splash forward + backward on every device at several shapes, fitted as the model prices it.

    The calls of `ATTENTION_SHAPES` vary the FLOPs, the grid steps, the operand sizes and the
    masked blocks independently; the four costs (per FLOP, per step, per operand byte per step,
    per masked logit) are the non-negative least-squares fit in relative error. Times are per
    device (all devices busy).
    """
    import jax
    import jax.numpy as jnp

    from runtime.splash import KernelConfig, attend, causal_kernel, full_kernel

    act_bytes = jnp.dtype(dtype).itemsize
    rows, times, shapes = [], [], []
    for q_div, kv_div, block_div, causal in ATTENTION_SHAPES:
        q_len, kv_len, block = seq // q_div, seq // kv_div, seq // block_div
        config = KernelConfig(block, block, interpret=topo.chip.kind != "tpu", smem_bytes=topo.chip.smem_bytes)

        def fwd_bwd(q, k, v, config=config, q_len=q_len, kv_len=kv_len, causal=causal):
            kernel = (causal_kernel if causal else full_kernel)(q_len, kv_len, config)
            loss = lambda q, k, v: jnp.sum(attend(kernel, q[0], k[0], v[0]).astype(jnp.float32))
            dq, dk, dv = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
            return dq + (jnp.sum(dk) + jnp.sum(dv)).astype(dq.dtype)

        mapped, arrays = _per_device(mesh, fwd_bwd, ((1, heads, q_len, head_dim), dtype),
                                     ((1, kv_heads, kv_len, head_dim), dtype), ((1, kv_heads, kv_len, head_dim), dtype))
        times.append(_best_time(mapped, *arrays, repeats=repeats))
        rows.append(_splash_terms(q_len, kv_len, block, heads, kv_heads, head_dim, act_bytes, causal))
        shapes.append((q_len, kv_len, block, causal))
    a = np.array(rows) / np.array(times)[:, None]  # relative residuals: every shape weighs the same
    coef = _nonnegative_lstsq(a, np.ones(len(times)))
    fitted = np.array(rows) @ coef
    return AttentionFit(*(float(c) for c in coef), tuple((*s, t, float(f)) for s, t, f in zip(shapes, times, fitted)))


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient ≥ 0: the best over the subsets of free coefficients."""
    from itertools import combinations

    best, best_err = np.zeros(a.shape[1]), float(np.sum(b**2))
    for k in range(1, a.shape[1] + 1):
        for cols in combinations(range(a.shape[1]), k):
            sol, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if (sol < 0).any():
                continue
            full = np.zeros(a.shape[1])
            full[list(cols)] = sol
            err = float(np.sum((a @ full - b) ** 2))
            if err < best_err:
                best, best_err = full, err
    return best


def measure_memory(mesh, dtype: str, values: int, repeats: int) -> float:
    """Bytes/s of all devices together streaming through an elementwise pass (one read, one write)."""
    import jax.numpy as jnp

    mapped, arrays = _per_device(mesh, lambda x: x * 1.5 + 0.5, ((values,), dtype))
    moved = 2 * values * jnp.dtype(dtype).itemsize
    return mesh.devices.size * moved / _best_time(mapped, *arrays, repeats=repeats)


def measure_collectives(mesh, repeats: int) -> dict[str, list[tuple[int, float]]]:
    """(bytes per device before the collective, seconds) of each kind over all devices, at several sizes."""
    import jax

    n = mesh.devices.size
    ops = {
        "all_gather": lambda x: jax.lax.all_gather(x, "d", tiled=True),
        "reduce_scatter": lambda x: jax.lax.psum_scatter(x, "d", tiled=True),
        "all_to_all": lambda x: jax.lax.all_to_all(x, "d", 0, 0, tiled=True),
        "ppermute": lambda x: jax.lax.ppermute(x, "d", [(i, (i + 1) % n) for i in range(n)]),
    }
    out: dict[str, list[tuple[int, float]]] = {}
    for name, op in ops.items():
        points = []
        for nbytes in COLLECTIVE_SIZES:
            values = nbytes // 4
            mapped, arrays = _per_device(mesh, op, ((values,), "float32"))
            points.append((nbytes, _best_time(mapped, *arrays, repeats=repeats)))
        out[name] = points
    return out


def fit_host_collectives(points: dict, n: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Each kind's (bytes/s, latency) on a host, fitted to its own times, and the fits' mean errors.

    The volume is what the model's formula for that kind charges (`collectives.HOST_FORMULAS`):
    gathered bytes for an all-gather, the array before the collective for the others.
    """
    fitted, errors = {}, {}
    for kind, formula in collectives.HOST_FORMULAS.items():
        sizes = np.array([b for b, _ in points[kind]], dtype=float)
        seconds = np.array([t for _, t in points[kind]])
        volume = sizes * n if kind == "all_gather" else sizes
        unit = np.array([formula(v, n, 1.0, 0.0) for v in volume])  # seconds at 1 byte/s, no latency
        # t = latency + unit / bw, in relative error so that small sizes (the plans' own) count as much
        lat, per_byte = _nonnegative_lstsq(np.stack([np.ones_like(unit), unit], axis=1) / seconds[:, None],
                                           np.ones_like(seconds))
        if per_byte <= 0:  # too noisy to see the bandwidth: charge the largest size's time to it
            lat, per_byte = 0.0, seconds[-1] / unit[-1]
        bw = 1.0 / per_byte
        fitted[kind] = [float(bw), float(lat)]
        errors[kind] = float(np.mean([abs(formula(v, n, bw, lat) / t - 1) for v, t in zip(volume, seconds)]))
    return fitted, errors


def _fit_links(topo: Topology, points: dict) -> tuple[float, float, dict[str, float]]:
    """Link bandwidth and hop latency that make the model's all-gather match, and the others' errors."""
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


def calibrate(topology: str, *, dtype: str = "float32", repeats: int = 5, matmul_size: int = 1024,
              attention_seq: int = 1024, attention_heads: int = 8, attention_kv_heads: int = 4,
              attention_head_dim: int = 32) -> Calibration:
    """Measures the devices present as `topology` and returns a chip row for them.

    Args:
        topology: the topology the devices form, e.g. ``cpu:8``.
        dtype: the compute dtype measured (float32 on a CPU host, bfloat16 on a TPU).
        repeats: timed repetitions per figure (the fastest is kept).
        matmul_size / attention_*: the shapes measured (choose attention heads like the
            per-device kernels of the plans to be priced; `attention_seq` sets the lengths of
            `ATTENTION_SHAPES`: the efficiency is measured, not derived).
    Raises:
        CpplanError: the devices present do not form `topology`.
    """
    topo = get_topology(topology)
    mesh = _mesh(topo)
    chip = topo.chip
    per_chip = 1.0 / topo.num_chips
    matmul = measure_matmul(mesh, dtype, matmul_size, repeats)
    fit = measure_attention(mesh, topo, dtype, attention_seq, attention_heads, attention_kv_heads, attention_head_dim,
                            repeats)
    attention = mesh.devices.size / fit.per_flop_s  # executed FLOP/s of all devices together
    memory = measure_memory(mesh, dtype, 2**22, repeats)
    points = measure_collectives(mesh, repeats)
    link, hop, errors = _fit_links(topo, points)
    host, host_errors = fit_host_collectives(points, topo.num_devices) if chip.kind == "cpu" else ({}, {})
    when = time.strftime("%Y-%m-%d")
    how = f"measured by `cpplan calibrate --topology {topo.name}` on {when}, all {topo.num_devices} devices busy"
    link_field = "core_link_bw_bytes_per_s" if chip.kind == "cpu" else "ici_link_bw_bytes_per_s"
    sources = dict(chip.sources)
    sources.update({
        "peak_bf16_flops_per_s": f"{how}: {matmul_size}³ {dtype} matmuls, fastest of {repeats}",
        "matmul_efficiency": "1.0: the peak is the measured matmul throughput",
        "attention_efficiency": (f"{how}: splash forward + backward, {attention_heads} query and "
                                 f"{attention_kv_heads} kv heads × {attention_head_dim}, (q, kv, block, causal) = "
                                 f"{[s[:4] for s in fit.shapes]}: the FLOP rate of the fit that, with a cost per grid "
                                 f"step, per operand byte per step and per masked logit, explains every time (mean "
                                 f"error {fit.mean_error:.1%}); relative to the matmul peak"),
        "attention_block_overhead_s": f"{how}: the same fit; the fixed cost per grid step of each kernel",
        "attention_step_s_per_operand_byte": (f"{how}: the same fit; the cost per byte of a kernel's operand arrays "
                                              f"per grid step (interpret mode copies them at every step)"),
        "attention_masked_element_s": (f"{how}: the same fit; the cost per logit of the blocks a causal mask cuts "
                                       f"through, per kernel (the mask rule is evaluated there)"),
        "hbm_bw_bytes_per_s": f"{how}: x*1.5+0.5 over 2^22 {dtype} values per device (one read, one write)",
        link_field: (f"{how}: fitted so the model's all-gather over all devices matches at "
                     f"{[b for b in COLLECTIVE_SIZES]} bytes per device; with it the model predicts "
                     + ", ".join(f"{k} within {v:.0%}" for k, v in errors.items()) + " on average"),
        "ici_hop_latency_s": f"{how}: the intercept of the same all-gather fit",
    })
    if host:
        sources["host_collectives"] = (
            f"{how}: each kind over all {topo.num_devices} devices at {list(COLLECTIVE_SIZES)} bytes per device, its "
            f"bandwidth and latency fitted to its own times (the virtual devices copy through shared memory, and XLA's "
            f"CPU collectives differ by kind); fit errors " + ", ".join(f"{k} {v:.0%}" for k, v in host_errors.items()))
    row = dataclasses.replace(
        chip, peak_bf16_flops_per_s=matmul * per_chip, matmul_efficiency=1.0,
        attention_efficiency=attention / matmul, attention_block_overhead_s=fit.per_step_s,
        attention_step_s_per_operand_byte=fit.per_step_byte_s, attention_masked_element_s=fit.per_masked_element_s,
        hbm_bw_bytes_per_s=memory * per_chip,
        ici_hop_latency_s=hop, host_collectives=host, sources=sources, **{link_field: link})
    raw = {"matmul_flops_per_s": matmul, "attention_flops_per_s": attention, "attention_fit": dataclasses.asdict(fit),
           "memory_bytes_per_s": memory,
           "collectives": points, "collective_model_errors": errors, "host_collective_errors": host_errors}
    return Calibration(row, raw)
