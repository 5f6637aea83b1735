"""The HBM rate of the elementwise passes a training step runs, on the chip this runs on: each pass over
`VALUES` values per array, timed as `runtime.measure.best_time` times (calls back to back), and its rate
as the bytes it must read and write over the time. `cpplan calibrate` prices every elementwise pass at
one rate; this shows how far the kinds of pass a step runs are from each other and from that one.

    python benchmarks/tpu_hbm_passes.py [TOPOLOGY]   # on a TPU VM (default v5e:1x1); a line per pass
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's runtime, uninstalled

VALUES = 2**27


def passes():
    """(name, function, input dtypes, bytes moved per value): reads of every input and one output."""
    import jax.numpy as jnp

    def rms_norm(x):
        x32 = x.astype(jnp.float32).reshape(-1, 2048)
        scaled = x32 * jnp.reciprocal(jnp.sqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6))
        return scaled.astype(x.dtype).reshape(-1)

    return [
        ("bf16 x*1.5+0.5 (calibrate's pass)", lambda x: x * 1.5 + 0.5, ("bfloat16",), 4),
        ("f32 x*1.5+0.5", lambda x: x * 1.5 + 0.5, ("float32",), 8),
        ("bf16 x+y (residual add)", lambda x, y: x + y, ("bfloat16", "bfloat16"), 6),
        ("bf16 silu(x)*y (MLP gate)", lambda x, y: (x * jnp.reciprocal(1 + jnp.exp(-x))) * y, ("bfloat16",) * 2, 6),
        ("bf16 -> f32 (upcast)", lambda x: x.astype(jnp.float32), ("bfloat16",), 6),
        ("bf16 RMS norm over rows of 2048", rms_norm, ("bfloat16",), 4),
    ]


def main() -> None:
    from cost_models.topology import get_topology
    from runtime import measure

    topo = get_topology(sys.argv[1] if len(sys.argv) > 1 else "v5e:1x1")
    mesh = measure.device_mesh(topo)
    for name, fn, dtypes, moved in passes():
        mapped, arrays = measure.per_device_call(mesh, fn, *(((VALUES,), d) for d in dtypes))
        seconds = measure.best_time(mapped, *arrays, repeats=5)
        rate = mesh.devices.size * moved * VALUES / seconds
        print(f"{name:36s} {seconds * 1e3:7.3f} ms  {rate / 1e9:6.0f} GB/s")


if __name__ == "__main__":
    main()
