"""The measurement harness: times matmuls, splash attention, memory passes and collectives with every
device busy at once (`validation.calibration` chooses the shapes and fits the chip row). Other work on
a shared host only adds time, so each figure is the fastest of its repeats (timeit's rule).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from cost_models.errors import CpplanError
from cost_models.topology import Topology

MIN_TIMED_S = 0.2  # timeit's autorange target: short calls are timed until this much time is covered


def device_mesh(topo: Topology):
    """A one-axis mesh (`"d"`) over all of jax's devices, which should form `topo`.

    Raises:
        CpplanError: the device count is not the topology's.
    """
    import jax
    from jax.sharding import Mesh

    devices = jax.devices()
    if len(devices) != topo.num_devices:
        raise CpplanError(
            f"{topo.name} has {topo.num_devices} devices but {len(devices)} are present; for cpu:N set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count=N before jax is imported (the cpplan "
            f"command does it for you)."
        )
    return Mesh(np.array(devices), ("d",))


def best_time(fn, *args, repeats: int) -> float:
    """The fastest of at least `repeats` timed calls of `fn(*args)` after a warm-up, and of as many more
    as fill `MIN_TIMED_S`: one preemption outlasts a call of a few milliseconds."""
    import jax

    jax.block_until_ready(fn(*args))
    times, timed = [], 0.0
    while len(times) < repeats or timed < MIN_TIMED_S:
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
        timed += times[-1]
    return min(times)


def _per_device(mesh, fn, *shapes_dtypes):
    """`fn` run on every device at once on per-device arrays of the given (shape, dtype)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n = mesh.devices.size
    arrays = [
        jax.device_put(jnp.ones((n * shape[0], *shape[1:]), dtype) * 0.01, NamedSharding(mesh, P("d")))
        for shape, dtype in shapes_dtypes
    ]
    mapped = jax.jit(
        jax.shard_map(fn, mesh=mesh, in_specs=tuple(P("d") for _ in arrays), out_specs=P("d"), check_vma=False)
    )  # pallas kernels (splash) do not annotate varying axes
    return mapped, arrays


def measure_matmul(mesh, dtype: str, size: int, repeats: int) -> float:
    """FLOP/s of all devices together, each multiplying two size×size matrices."""
    mapped, arrays = _per_device(mesh, lambda a, b: a @ b, ((size, size), dtype), ((size, size), dtype))
    return mesh.devices.size * 2 * size**3 / best_time(mapped, *arrays, repeats=repeats)


def time_attention(
    mesh,
    topo: Topology,
    dtype: str,
    shapes: Sequence[tuple[int, int, int, bool]],
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    repeats: int,
) -> list[float]:
    """Seconds of one splash forward + backward per device (all devices busy) at each `(q_len, kv_len,
    block, causal)` shape, blocks square; `topo` says whether kernels run interpreted, and their SMEM."""
    import jax
    import jax.numpy as jnp

    from runtime.splash import KernelConfig, attend, causal_kernel, full_kernel

    times = []
    for q_len, kv_len, block, causal in shapes:
        config = KernelConfig(
            block, block, interpret=topo.chip.kind.interprets_kernels, smem_bytes=topo.chip.smem_bytes
        )

        def fwd_bwd(q, k, v, config=config, q_len=q_len, kv_len=kv_len, causal=causal):
            kernel = (causal_kernel if causal else full_kernel)(q_len, kv_len, config)
            loss = lambda q, k, v: jnp.sum(attend(kernel, q[0], k[0], v[0]).astype(jnp.float32))
            dq, dk, dv = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
            return dq + (jnp.sum(dk) + jnp.sum(dv)).astype(dq.dtype)

        mapped, arrays = _per_device(
            mesh,
            fwd_bwd,
            ((1, heads, q_len, head_dim), dtype),
            ((1, kv_heads, kv_len, head_dim), dtype),
            ((1, kv_heads, kv_len, head_dim), dtype),
        )
        times.append(best_time(mapped, *arrays, repeats=repeats))
    return times


def measure_memory(mesh, dtype: str, values: int, repeats: int) -> float:
    """Bytes/s of all devices together streaming through an elementwise pass (one read, one write)."""
    import jax.numpy as jnp

    mapped, arrays = _per_device(mesh, lambda x: x * 1.5 + 0.5, ((values,), dtype))
    moved = 2 * values * jnp.dtype(dtype).itemsize
    return mesh.devices.size * moved / best_time(mapped, *arrays, repeats=repeats)


def measure_collectives(mesh, sizes: Sequence[int], repeats: int) -> dict[str, list[tuple[int, float]]]:
    """`(bytes per device, seconds)` of all_gather, reduce_scatter, all_to_all and ppermute over all
    devices, per float32 size in `sizes` (bytes per device before the collective)."""
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
        for nbytes in sizes:
            mapped, arrays = _per_device(mesh, op, ((nbytes // 4,), "float32"))
            points.append((nbytes, best_time(mapped, *arrays, repeats=repeats)))
        out[name] = points
    return out
