"""Compile Llama 3.1 8B deviceless at the configurations of docs/measurements.md and print
cpplan's HBM per device and compile time next to MaxText 0.2.5's.

    python benchmarks/bench_compile.py                 # all rows (about 20 minutes here)
    python benchmarks/bench_compile.py --only ring     # rows whose strategy matches

Same model and conditions as the MaxText rows: one sequence per step, full remat, fp32 weights
and AdamW state, bf16 activations, all devices on the context axes. cpplan's own choices: a
chunked cross-entropy, splash blocks per row, zigzag balancing for ring / all-gather / USP.
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

K = 1024
# topology, strategy, context, context_ulysses, seq_len, MaxText GiB (None: does not fit), MaxText note
ROWS = [
    ("v5p:2x2x2", "all_gather", 8, 1, 128 * K, 26.1, "77 s"),
    ("v5p:2x2x2", "all_gather", 8, 1, 256 * K, 38.2, "228 s"),
    ("v5p:2x2x2", "all_gather", 8, 1, 512 * K, 62.4, "868 s"),
    ("v5p:2x2x2", "ring", 8, 1, 128 * K, 35.0, "51 s"),
    ("v5p:2x2x2", "ring", 8, 1, 256 * K, 70.7, "50 s"),
    ("v5p:2x2x2", "ring", 8, 1, 512 * K, None, "189 G of temporaries"),
    ("v5p:2x2x2", "ulysses", 1, 8, 128 * K, 26.2, "84 s"),
    ("v5p:2x2x2", "usp", 4, 2, 128 * K, 42.9, "57 s"),
    ("v5p:2x2x2", "usp", 4, 2, 512 * K, None, "317 G"),
    ("v5p:2x2x2", "ring", 8, 1, 1024 * K, None, "MaxText: 512K at most"),
    ("tpu7x:2x2x2", "all_gather", 16, 1, 128 * K, 15.7, "107 s"),
    ("tpu7x:2x2x2", "ring", 16, 1, 128 * K, 16.7, "~60 s"),
    ("tpu7x:2x2x2", "ring", 16, 1, 256 * K, 29.4, "~60 s"),
    ("tpu7x:2x2x2", "ring", 16, 1, 512 * K, 63.8, "~60 s"),
    ("tpu7x:2x2x2", "usp", 8, 2, 512 * K, None, "95.9 G > 94.7 G"),
]


def make_plan(topology, strategy, context, ulysses, seq_len, *, block, loss_chunk):
    from cost_models.models import get_model
    from planner.plan import Plan, make_mesh

    return Plan(
        model=get_model("llama3.1-8b"),
        topology=topology,
        seq_len=seq_len,
        global_batch=1,
        mesh=make_mesh(context=context, context_ulysses=ulysses),
        cp_strategy=strategy,
        load_balance="none" if strategy == "ulysses" else "zigzag",
        remat="full",
        block_q=block,
        block_kv=block,
        loss_chunk_tokens=loss_chunk,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run rows whose strategy contains this text")
    parser.add_argument("--block", type=int, default=1024, help="splash block_q = block_kv")
    parser.add_argument("--loss-chunk", type=int, default=2048, help="cross-entropy chunk (tokens per device)")
    args = parser.parse_args(argv)
    from cost_models.units import GiB
    from planner.estimate import estimate
    from runtime import compile_for

    print(
        f"{'topology':12} {'strategy':10} {'cp':>5} {'seq':>6} | {'predicted':>9} {'cpplan GiB':>10} {'compile':>8} | "
        f"{'MaxText GiB':>11} {'MaxText note':<24} | verdict",
        flush=True,
    )
    for topology, strategy, context, ulysses, seq_len, maxtext, note in ROWS:
        if args.only and args.only not in strategy:
            continue
        plan = make_plan(topology, strategy, context, ulysses, seq_len, block=args.block, loss_chunk=args.loss_chunk)
        predicted = estimate(plan).hbm_bytes_per_device / GiB
        start = time.perf_counter()
        report = compile_for(plan)
        wall = time.perf_counter() - start
        ours = (
            f"{report.required_gib:10.1f}"
            if report.fits
            else f"{'no (' + format(report.required_gib, '.0f') + ')':>10}"
        )
        theirs = f"{maxtext:11.1f}" if maxtext is not None else f"{'no':>11}"
        if not report.fits:
            verdict = "does not fit"
        elif maxtext is None:
            verdict = "fits where MaxText does not"
        else:
            verdict = f"{maxtext - report.required_gib:.1f} GiB less" if report.required_gib < maxtext else "MORE"
        cp = f"{context}x{ulysses}" if strategy == "usp" else str(context * ulysses)
        print(
            f"{topology:12} {strategy:10} {cp:>5} {seq_len // K:>5}K | {predicted:9.1f} {ours} {wall:7.0f}s | {theirs} "
            f"{note:<24} | {verdict}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
