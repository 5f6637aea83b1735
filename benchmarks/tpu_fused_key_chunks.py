"""Times one attention layer's forward and backward through cpplan's runtime (`runtime.splash.attend`) on the
TPU this runs on: splash's dq and dK/dV kernels, and its fused backward over 1, 2, 4, … chunks of the keys
(`compute.fused_backward_key_chunks`, forced here by the HBM the kernel is told of), causal, bf16, 16 heads
(8 KV heads) × 128. Each timing is printed as it is made; the backward is the pair's time less the forward's.

Run on a TPU VM:

    python benchmarks/tpu_fused_key_chunks.py > benchmarks/results/tpu_v5e/fused_key_chunks.txt
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's runtime, uninstalled

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 8, 128, 2048
LENGTHS = (32768, 65536, 131072)
CHUNKS = (1, 2, 4, 8, 16)
HELD_BYTES = 10 * 2**30  # the most dq partials timed at once on a 16 GiB chip


def main() -> None:
    from cost_models.chips import get_chip
    from cost_models.compute import DQ_PARTIALS_HBM_SHARE, scoped_vmem_flag
    from runtime.compile import use_compiler_flags

    chip = get_chip("v5e")  # blocks of 2048 need its raised scoped VMEM limit, set before jax starts libtpu
    use_compiler_flags(chip.name, scoped_vmem_flag(chip.scoped_vmem_max_bytes // 1024))

    import jax
    import jax.numpy as jnp

    from runtime import splash
    from runtime.measure import best_time

    interpret = jax.devices()[0].platform != "tpu"
    print(f"{'tokens':>7} {'backward':<22} {'forward ms':>10} {'backward ms':>11}", flush=True)
    for length in LENGTHS:
        keys = jax.random.split(jax.random.PRNGKey(length), 4)
        rows = (HEADS, KV_HEADS, KV_HEADS, HEADS)
        q, k, v, d_out = (jax.random.normal(key, (r, length, HEAD_DIM), jnp.bfloat16) for key, r in zip(keys, rows))
        partials = (length // BLOCK) * q.size * q.dtype.itemsize
        kinds = [("dq and dK/dV kernels", False, 0)] + [
            (f"fused, {c} key chunk{'s' if c > 1 else ''}", True, partials / c / DQ_PARTIALS_HBM_SHARE)
            for c in CHUNKS
            if partials / c <= HELD_BYTES and c <= length // BLOCK
        ]
        for label, fused, hbm in kinds:
            config = splash.KernelConfig(BLOCK, BLOCK, interpret, fused_backward=fused, hbm_bytes=int(hbm))
            kernel = splash.causal_kernel(length, length, config)
            forward = jax.jit(lambda q, k, v: splash.attend(kernel, q, k, v))
            both = jax.jit(jax.grad(lambda q, k, v: jnp.vdot(splash.attend(kernel, q, k, v), d_out).real, (0, 1, 2)))
            try:
                fwd_s = best_time(forward, q, k, v, repeats=3)
                both_s = best_time(both, q, k, v, repeats=3)
            except Exception as error:  # noqa: BLE001 - a shape that does not fit is reported and the next timed
                print(f"{length:>7} {label:<22} failed: {str(error).splitlines()[0][:120]}", flush=True)
                continue
            print(f"{length:>7} {label:<22} {fwd_s * 1e3:>10.2f} {(both_s - fwd_s) * 1e3:>11.2f}", flush=True)


if __name__ == "__main__":
    main()
