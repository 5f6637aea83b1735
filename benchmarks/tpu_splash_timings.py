"""Times jax's splash attention kernels on the TPU this runs on: the forward alone, and the forward with
its backward, fused (`use_fused_bwd_kernel=True`: one kernel forms dq, dk and dv) and separate (the dq
and dk/dv kernels), causal, bf16, over sequence lengths, head sizes and splash blocks. Each timing is
written to the output as soon as it is made (one JSON line per call shape), so a run cut short keeps
what it measured. The backward's time is the pair's less the forward's.

Run on a TPU VM (blocks of 2048 need the scoped VMEM limit raised before jax loads libtpu, which
this script does):

    python benchmarks/tpu_splash_timings.py --out benchmarks/results/kernels/v5e_splash.jsonl
    python benchmarks/tpu_splash_timings.py --quick --interpret --out out/t.jsonl  # a smoke run on a CPU
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's runtime, uninstalled

VMEM_FLAG = "--xla_tpu_scoped_vmem_limit_kib=98304"
WIDTH = 2048  # query heads × head size of every call: 16 × 128 or 8 × 256, one layer of a 2048-wide model
LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)
HEAD_DIMS = (128, 256)
BLOCKS = (512, 1024, 2048)


def shapes(quick: bool):
    """(seq, head_dim, block) of every call timed: blocks of 512 at the shorter lengths only (their grids
    grow fastest and their per-step cost is measured there already)."""
    if quick:
        return [(1024, d, 512) for d in HEAD_DIMS]
    return [
        (seq, d, block)
        for seq in LENGTHS
        for d in HEAD_DIMS
        for block in BLOCKS
        if block <= seq and not (block == 512 and seq > 32768)
    ]


def timed(fn, args, repeats: int) -> list[float]:
    """Seconds per call of `fn(*args)` after one warm-up (which compiles it), each waited for."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return times


def measure(seq: int, head_dim: int, block: int, *, interpret: bool, repeats: int) -> dict:
    """One call shape's forward, fused and separate forward-with-backward times."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

    from runtime.splash import KernelConfig  # imports jax: only once main has set the compiler's flags

    heads = WIDTH // head_dim
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (heads, seq, head_dim), jnp.bfloat16) for key in keys)
    mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((seq, seq))] * heads)
    row = {"seq": seq, "heads": heads, "head_dim": head_dim, "block": block, "causal": True, "dtype": "bfloat16"}
    # causal FLOPs of the forward: 4 · heads · d per query-key pair, half the pairs
    row["forward_flops"] = 4 * heads * head_dim * seq * seq / 2
    for name, fused in (("forward", None), ("fused", True), ("separate", False)):
        # the blocks cpplan's runtime gives splash (every kernel the same block; no dq blocks when fused)
        sizes = KernelConfig(block, block, interpret, fused_backward=bool(fused)).block_sizes(seq, seq)
        splash = kernel.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes, interpret=interpret)
        if fused is None:
            fn = jax.jit(splash)
        else:
            loss = lambda q, k, v, s=splash: jnp.sum(s(q, k, v).astype(jnp.float32))
            fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        try:
            times = timed(fn, (q, k, v), repeats)
        except Exception as err:  # a shape the chip refuses (VMEM, HBM): recorded, the next measured
            row[f"{name}_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            continue
        row[f"{name}_s"] = times
        row[f"{name}_median_s"] = statistics.median(times)
    for name in ("fused", "separate"):
        if f"{name}_median_s" in row and "forward_median_s" in row:
            row[f"{name}_backward_s"] = row[f"{name}_median_s"] - row["forward_median_s"]
            row[f"{name}_backward_over_forward"] = row[f"{name}_backward_s"] / row["forward_median_s"]
    if "forward_median_s" in row:
        row["forward_tflops"] = row["forward_flops"] / row["forward_median_s"] / 1e12
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON lines file, one call shape a line (appended)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per kernel after the warm-up")
    parser.add_argument("--quick", action="store_true", help="two small shapes (a smoke run)")
    parser.add_argument("--interpret", action="store_true", help="run the kernels interpreted (no TPU)")
    args = parser.parse_args(argv)
    os.environ["LIBTPU_INIT_ARGS"] = f"{os.environ.get('LIBTPU_INIT_ARGS', '')} {VMEM_FLAG}".strip()
    import jax

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    device = jax.devices()[0]
    header = {"device": device.device_kind, "platform": device.platform, "jax": jax.__version__}
    print(json.dumps(header), flush=True)
    for seq, head_dim, block in shapes(args.quick):
        row = header | measure(seq, head_dim, block, interpret=args.interpret, repeats=args.repeats)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        fwd = row.get("forward_median_s")
        print(
            f"{seq:7d} d{head_dim} b{block}: forward "
            + (f"{1e3 * fwd:8.3f} ms {row['forward_tflops']:6.1f} TFLOP/s" if fwd else row.get("forward_error", "?"))
            + "".join(
                f"  {n} bwd/fwd {row[f'{n}_backward_over_forward']:.2f}"
                for n in ("fused", "separate")
                if f"{n}_backward_over_forward" in row
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
