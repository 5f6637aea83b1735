"""The measurement harness: time matmuls, splash attention, memory passes and collectives on
the devices present, every device busy at once.

It only measures; `validation.calibration` chooses the shapes, fits the cost model's figures to
the times and writes the chip row. On a shared host other work only ever adds time, so every
figure here is the fastest of its repeats (timeit's rule), and a call of a few milliseconds is
repeated until `MIN_TIMED_S` have been timed: one preemption is longer than such a call, so a
fastest of one or two would often be a disturbed one.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from cost_models.errors import CpplanError
from cost_models.topology import Topology

MIN_TIMED_S = 0.2  # timeit's autorange target: short calls are timed until this much time is covered


def device_mesh(topo: Topology):
    """A one-axis mesh (`"d"`) over all of jax's devices.

    Args:
        topo: the topology the devices should form.
    Returns:
        A `jax.sharding.Mesh`.
    Raises:
        CpplanError: the device count is not the topology's.
    """
    import jax
    from jax.sharding import Mesh

    devices = jax.devices()
    if len(devices) != topo.num_devices:
        raise CpplanError(f"{topo.name} has {topo.num_devices} devices but {len(devices)} are present; for cpu:N set "
                          f"XLA_FLAGS=--xla_force_host_platform_device_count=N before jax is imported (the cpplan "
                          f"command does it for you).")
    return Mesh(np.array(devices), ("d",))


def best_time(fn, *args, repeats: int) -> float:
    """The fastest of at least `repeats` timed calls of `fn(*args)`, and of as many more as fill
    `MIN_TIMED_S`, after one call to compile and warm up."""
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
    return mesh.devices.size * 2 * size**3 / best_time(mapped, *arrays, repeats=repeats)


def time_attention(mesh, topo: Topology, dtype: str, shapes: Sequence[tuple[int, int, int, bool]], *, heads: int,
                   kv_heads: int, head_dim: int, repeats: int) -> list[float]:
    """Seconds of one splash forward + backward per device (all devices busy) at each shape.

    Args:
        mesh: from `device_mesh`.
        topo: the topology (whether kernels run interpreted, and the SMEM they may use).
        dtype: the activations' dtype.
        shapes: (q_len, kv_len, block, causal) of each call; blocks are square.
        heads / kv_heads / head_dim: the kernel's heads.
        repeats: timed calls per shape.
    Returns:
        The fastest time of each shape, in order.
    """
    import jax
    import jax.numpy as jnp

    from runtime.splash import KernelConfig, attend, causal_kernel, full_kernel

    times = []
    for q_len, kv_len, block, causal in shapes:
        config = KernelConfig(block, block, interpret=topo.chip.kind.interprets_kernels,
                              smem_bytes=topo.chip.smem_bytes)

        def fwd_bwd(q, k, v, config=config, q_len=q_len, kv_len=kv_len, causal=causal):
            kernel = (causal_kernel if causal else full_kernel)(q_len, kv_len, config)
            loss = lambda q, k, v: jnp.sum(attend(kernel, q[0], k[0], v[0]).astype(jnp.float32))
            dq, dk, dv = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
            return dq + (jnp.sum(dk) + jnp.sum(dv)).astype(dq.dtype)

        mapped, arrays = _per_device(mesh, fwd_bwd, ((1, heads, q_len, head_dim), dtype),
                                     ((1, kv_heads, kv_len, head_dim), dtype), ((1, kv_heads, kv_len, head_dim), dtype))
        times.append(best_time(mapped, *arrays, repeats=repeats))
    return times


def measure_memory(mesh, dtype: str, values: int, repeats: int) -> float:
    """Bytes/s of all devices together streaming through an elementwise pass (one read, one write)."""
    import jax.numpy as jnp

    mapped, arrays = _per_device(mesh, lambda x: x * 1.5 + 0.5, ((values,), dtype))
    moved = 2 * values * jnp.dtype(dtype).itemsize
    return mesh.devices.size * moved / best_time(mapped, *arrays, repeats=repeats)


def measure_collectives(mesh, sizes: Sequence[int], repeats: int) -> dict[str, list[tuple[int, float]]]:
    """Times of each collective kind over all devices.

    Args:
        mesh: from `device_mesh`.
        sizes: float32 bytes per device before the collective.
        repeats: timed calls per size.
    Returns:
        For all_gather, reduce_scatter, all_to_all and ppermute: (bytes per device, seconds) per size.
    """
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
