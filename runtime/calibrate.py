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
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cost_models import collectives
from cost_models.chips import Chip
from cost_models.compute import SPLASH_BACKWARD_GRIDS, SPLASH_BACKWARD_OVER_FORWARD, causal_block_fraction
from cost_models.errors import CpplanError
from cost_models.placement import axis_segments
from cost_models.topology import Topology, get_topology

COLLECTIVE_SIZES = (2**18, 2**20, 2**22)  # bytes per device


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


def _median_time(fn, *args, repeats: int) -> float:
    import jax

    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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
    return mesh.devices.size * 2 * size**3 / _median_time(mapped, *arrays, repeats=repeats)


def measure_attention(mesh, topo: Topology, dtype: str, seq: int, heads: int, head_dim: int, blocks: tuple[int, int],
                      repeats: int) -> tuple[float, float]:
    """Causal splash forward + backward on every device: (seconds per executed FLOP, per grid step).

    The same shape runs with two block sizes: the smaller visits many more grid steps (forward,
    dq and dk/dv grids) for about the same FLOPs. Two times, two unknowns. Times are per device
    (all devices run at once).
    """
    import jax
    import jax.numpy as jnp

    from runtime.splash import KernelConfig, attend, causal_kernel

    shape = ((1, heads, seq, head_dim), dtype)
    full_forward = 4.0 * seq * seq * heads * head_dim
    times, flops, steps = [], [], []
    for block in blocks:
        config = KernelConfig(block, block, interpret=topo.chip.kind != "tpu", smem_bytes=topo.chip.smem_bytes)

        def fwd_bwd(q, k, v, config=config):
            kernel = causal_kernel(seq, seq, config)
            loss = lambda q, k, v: jnp.sum(attend(kernel, q[0], k[0], v[0]).astype(jnp.float32))
            return jnp.stack(jax.grad(loss, argnums=(0, 1, 2))(q, k, v))

        mapped, arrays = _per_device(mesh, fwd_bwd, shape, shape, shape)
        times.append(_median_time(mapped, *arrays, repeats=repeats))
        flops.append(full_forward * float(causal_block_fraction(seq, block)) * (1 + SPLASH_BACKWARD_OVER_FORWARD))
        steps.append((1 + SPLASH_BACKWARD_GRIDS) * heads * (seq // block) ** 2)
    # t = steps·per_step + flops·per_flop for both runs
    det = steps[0] * flops[1] - steps[1] * flops[0]
    per_step = (times[0] * flops[1] - times[1] * flops[0]) / det
    per_flop = (steps[0] * times[1] - steps[1] * times[0]) / det
    if per_step < 0 or per_flop <= 0:  # too noisy to separate: charge everything to the FLOPs
        return times[-1] / flops[-1], 0.0
    return per_flop, per_step


def measure_memory(mesh, dtype: str, values: int, repeats: int) -> float:
    """Bytes/s of all devices together streaming through an elementwise pass (one read, one write)."""
    import jax.numpy as jnp

    mapped, arrays = _per_device(mesh, lambda x: x * 1.5 + 0.5, ((values,), dtype))
    moved = 2 * values * jnp.dtype(dtype).itemsize
    return mesh.devices.size * moved / _median_time(mapped, *arrays, repeats=repeats)


def measure_collectives(mesh, repeats: int) -> dict[str, list[tuple[int, float]]]:
    """(bytes per device, seconds) of each collective over all devices, at several sizes."""
    import jax

    n = mesh.devices.size
    ops = {
        "all_gather": lambda x: jax.lax.all_gather(x, "d", tiled=True)[: x.shape[0]],
        "reduce_scatter": lambda x: jax.lax.psum_scatter(x, "d", tiled=True).repeat(n, axis=0),
        "all_to_all": lambda x: jax.lax.all_to_all(x, "d", 0, 0, tiled=True),
        "ppermute": lambda x: jax.lax.ppermute(x, "d", [(i, (i + 1) % n) for i in range(n)]),
    }
    out: dict[str, list[tuple[int, float]]] = {}
    for name, op in ops.items():
        points = []
        for nbytes in COLLECTIVE_SIZES:
            values = nbytes // 4
            mapped, arrays = _per_device(mesh, op, ((values,), "float32"))
            points.append((nbytes, _median_time(mapped, *arrays, repeats=repeats)))
        out[name] = points
    return out


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
              attention_seq: int = 1024, attention_blocks: tuple[int, int] = (128, 512), attention_heads: int = 4,
              attention_head_dim: int = 64) -> Calibration:
    """Measures the devices present as `topology` and returns a chip row for them.

    Args:
        topology: the topology the devices form, e.g. ``cpu:8``.
        dtype: the compute dtype measured (float32 on a CPU host, bfloat16 on a TPU).
        repeats: timed repetitions per figure (the median is kept).
        matmul_size / attention_*: the shapes measured (choose attention shapes like the
            per-device kernels of the plans to be priced: the efficiency is measured, not derived).
    Raises:
        CpplanError: the devices present do not form `topology`.
    """
    topo = get_topology(topology)
    mesh = _mesh(topo)
    chip = topo.chip
    per_chip = 1.0 / topo.num_chips
    matmul = measure_matmul(mesh, dtype, matmul_size, repeats)
    per_flop, per_step = measure_attention(mesh, topo, dtype, attention_seq, attention_heads, attention_head_dim,
                                           attention_blocks, repeats)
    attention = mesh.devices.size / per_flop  # executed FLOP/s of all devices together
    memory = measure_memory(mesh, dtype, 2**22, repeats)
    points = measure_collectives(mesh, repeats)
    link, hop, errors = _fit_links(topo, points)
    when = time.strftime("%Y-%m-%d")
    how = f"measured by `cpplan calibrate --topology {topo.name}` on {when}, all {topo.num_devices} devices busy"
    link_field = "core_link_bw_bytes_per_s" if chip.kind == "cpu" else "ici_link_bw_bytes_per_s"
    sources = dict(chip.sources)
    sources.update({
        "peak_bf16_flops_per_s": f"{how}: {matmul_size}³ {dtype} matmuls, median of {repeats}",
        "matmul_efficiency": "1.0: the peak is the measured matmul throughput",
        "attention_efficiency": (f"{how}: causal splash attention forward + backward, {attention_heads} heads × "
                                 f"{attention_seq} tokens × {attention_head_dim}, at blocks {attention_blocks[0]} and "
                                 f"{attention_blocks[1]}: the FLOP rate that, with a fixed cost per grid step, "
                                 f"explains both times; relative to the matmul peak"),
        "attention_block_overhead_s": (f"{how}: the same two runs; the fixed cost per grid step visited "
                                       f"(forward, dq and dk/dv grids)"),
        "hbm_bw_bytes_per_s": f"{how}: x*1.5+0.5 over 2^22 {dtype} values per device (one read, one write)",
        link_field: (f"{how}: fitted so the model's all-gather over all devices matches at "
                     f"{[b for b in COLLECTIVE_SIZES]} bytes per device; with it the model predicts "
                     + ", ".join(f"{k} within {v:.0%}" for k, v in errors.items()) + " on average"),
        "ici_hop_latency_s": f"{how}: the intercept of the same all-gather fit",
    })
    row = dataclasses.replace(
        chip, peak_bf16_flops_per_s=matmul * per_chip, matmul_efficiency=1.0,
        attention_efficiency=attention / matmul, attention_block_overhead_s=per_step,
        hbm_bw_bytes_per_s=memory * per_chip,
        ici_hop_latency_s=hop, sources=sources, **{link_field: link})
    raw = {"matmul_flops_per_s": matmul, "attention_flops_per_s": attention, "attention_grid_step_s": per_step,
           "memory_bytes_per_s": memory,
           "collectives": points, "collective_model_errors": errors}
    return Calibration(row, raw)
