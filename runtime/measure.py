"""The measurement harness: times matmuls, splash attention, memory passes and collectives with every
device busy at once (`validation.calibration` chooses the shapes and fits the chip row). Other work on
a shared host only adds time, so each figure is the fastest of its repeats (timeit's rule).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cost_models.chips import ChipKind
from cost_models.errors import CpplanError
from cost_models.topology import Topology

MIN_TIMED_S = 0.2  # timeit's autorange target: short calls are timed until this much time is covered
BATCH_S = 0.02  # a timing of short calls dispatches this much of them back to back


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


def best_time(fn, *args, repeats: int, back_to_back: bool = True) -> float:
    """Seconds of one call of `fn(*args)`: the fastest of at least `repeats` timings after a warm-up, and
    of as many more as fill `MIN_TIMED_S` (one preemption outlasts a call of a few milliseconds).

    A timing dispatches calls back to back until they cover `BATCH_S` and waits once: jax dispatches
    asynchronously, so the host's launch of each call overlaps the device's run of the one before, as the
    ops of a step run back to back in one program. A lone call's timing also holds the host's dispatch
    latency (docs/provenance/strategies_and_validation.md#calibration says how much on a v5e chip).
    `back_to_back=False` times one call at a time (`time_on`: a host's devices)."""
    import jax

    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    calls = max(1, math.ceil(BATCH_S / max(time.perf_counter() - start, 1e-9))) if back_to_back else 1
    times, timed = [], 0.0
    while len(times) < repeats or timed < MIN_TIMED_S:
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)  # the one before is released unread: a device runs its calls in order
        jax.block_until_ready(out)
        elapsed = time.perf_counter() - start
        times.append(elapsed / calls)
        timed += elapsed
    return min(times)


def time_on(mesh, fn, *args, repeats: int) -> float:
    """`best_time` of `fn(*args)` on `mesh`'s devices: back to back, but on a host's virtual devices, which
    run on the host's own cores and whose collectives abort with several programs' rendezvous in flight."""
    return best_time(
        fn, *args, repeats=repeats, back_to_back=mesh.devices.flat[0].platform != ChipKind.CPU.jax_platform
    )


def per_device_call(mesh, fn, *shapes_dtypes, outputs: int = 1):
    """`fn` run on every device at once on per-device arrays of the given (shape, dtype); `outputs`:
    how many arrays it returns (a tuple where more than one)."""
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
        jax.shard_map(
            fn,
            mesh=mesh,
            in_specs=tuple(P("d") for _ in arrays),
            out_specs=P("d") if outputs == 1 else (P("d"),) * outputs,
            check_vma=False,
        )
    )  # pallas kernels (splash) do not annotate varying axes
    return mapped, arrays


def measure_matmul(mesh, dtype: str, size: int, repeats: int) -> float:
    """FLOP/s of all devices together, each multiplying two size×size matrices."""
    mapped, arrays = per_device_call(mesh, lambda a, b: a @ b, ((size, size), dtype), ((size, size), dtype))
    return mesh.devices.size * 2 * size**3 / time_on(mesh, mapped, *arrays, repeats=repeats)


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

        mapped, arrays = per_device_call(
            mesh,
            fwd_bwd,
            ((1, heads, q_len, head_dim), dtype),
            ((1, kv_heads, kv_len, head_dim), dtype),
            ((1, kv_heads, kv_len, head_dim), dtype),
        )
        times.append(time_on(mesh, mapped, *arrays, repeats=repeats))
    return times


def measure_matmuls(mesh, dtype: str, shapes: Sequence[tuple[int, int, int]], repeats: int) -> list[float]:
    """Seconds of one `[m, k] @ [k, n]` product per device (all devices busy) at each `(m, k, n)`."""
    times = []
    for m, k, n in shapes:
        mapped, arrays = per_device_call(mesh, lambda a, b: a @ b[0], ((m, k), dtype), ((1, k, n), dtype))
        times.append(time_on(mesh, mapped, *arrays, repeats=repeats))
    return times


@dataclass(frozen=True)
class SplashTimes:
    """One splash call's kernels timed on every device at once: the forward (with the log-sum-exp the
    backward reads), and the backward as the fused kernel and as the dq and dK/dV kernels (None where
    it was not timed, `errors` saying why)."""

    forward_s: float | None
    backward_fused_s: float | None
    backward_separate_s: float | None
    errors: dict = field(default_factory=dict)


def time_splash(
    mesh,
    topo: Topology,
    dtype: str,
    shape: tuple[int, int, int, bool],
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    repeats: int,
    skip_fused: str = "",
) -> SplashTimes:
    """Times splash's forward and both backwards at `(q_len, kv_len, block, causal)`, square blocks;
    `skip_fused` (a reason) leaves the fused backward untimed. A kernel that fails to compile or run
    (scoped VMEM, HBM) is recorded in `errors` and the others are still timed."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec

    from runtime.splash import KernelConfig, attend_bwd, attend_with_lse, causal_kernel, full_kernel

    q_len, kv_len, block, causal = shape
    make = causal_kernel if causal else full_kernel
    config = KernelConfig(block, block, interpret=topo.chip.kind.interprets_kernels, smem_bytes=topo.chip.smem_bytes)
    kernel = make(q_len, kv_len, config)
    kv_size = ((1, kv_heads, kv_len, head_dim), dtype)
    sizes = (((1, heads, q_len, head_dim), dtype), kv_size, kv_size)
    errors: dict = {}

    def timed(name, fn, *arrays):
        try:
            return time_on(mesh, fn, *arrays, repeats=repeats)
        except Exception as err:  # a kernel that cannot run here is a gap in the timings, not the end
            errors[name] = f"{type(err).__name__}: {next(iter(str(err).strip().splitlines()), '')}"[:300]
            return None

    def forward(q, k, v):
        out, lse = attend_with_lse(kernel, q[0], k[0], v[0])
        return out[None], lse[None]

    fwd, (q, k, v) = per_device_call(mesh, forward, *sizes, outputs=2)
    forward_s = timed("forward", fwd, q, k, v)
    out, lse = fwd(q, k, v) if forward_s is not None else (None, None)

    def backward_with(bwd_kernel):
        def backward(q, k, v, out, lse, d_out):
            return tuple(g[None] for g in attend_bwd(bwd_kernel, q[0], k[0], v[0], out[0], lse[0], d_out[0]))

        spec = PartitionSpec("d")
        return jax.jit(jax.shard_map(backward, mesh=mesh, in_specs=(spec,) * 6, out_specs=spec, check_vma=False))

    times = {}
    for name, fused in (("backward_fused", True), ("backward_separate", False)):
        if out is None or (fused and skip_fused):
            if fused and skip_fused:
                errors[name] = f"not timed: {skip_fused}"
            times[name] = None
            continue
        bwd_kernel = make(q_len, kv_len, dataclasses.replace(config, fused_backward=fused))
        times[name] = timed(name, backward_with(bwd_kernel), q, k, v, out, lse, jnp.ones_like(out))
    del out, lse
    return SplashTimes(forward_s, times["backward_fused"], times["backward_separate"], errors)


def measure_memory(mesh, dtype: str, values: int, repeats: int) -> float:
    """Bytes/s of all devices together streaming through an elementwise pass (one read, one write)."""
    import jax.numpy as jnp

    mapped, arrays = per_device_call(mesh, lambda x: x * 1.5 + 0.5, ((values,), dtype))
    moved = 2 * values * jnp.dtype(dtype).itemsize
    return mesh.devices.size * moved / time_on(mesh, mapped, *arrays, repeats=repeats)


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
            mapped, arrays = per_device_call(mesh, op, ((nbytes // 4,), "float32"))
            points.append((nbytes, time_on(mesh, mapped, *arrays, repeats=repeats)))
        out[name] = points
    return out
