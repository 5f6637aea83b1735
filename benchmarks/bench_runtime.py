"""Step time of every strategy on this host's 8 virtual CPU devices at a few lengths, and its
ratio to the one-device step that does the same total work.

    python benchmarks/bench_runtime.py --seq-lens 2048,4096 --steps 3   # ~15 min here

fp32 throughout (the CPU has no fast bf16). The virtual devices share the host's cores, so the
ratio shows the strategies' overheads (collectives, masking, imbalance), not a speed-up.
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

LAYOUTS = [  # strategy, mesh, load balancing
    ("all_gather", dict(context=8), "zigzag"),
    ("ulysses", dict(context_ulysses=8), "none"),
    ("ring", dict(context=8), "zigzag"),
    ("ring", dict(context=8), "none"),
    ("usp", dict(context=4, context_ulysses=2), "zigzag"),
    ("usp", dict(context=2, context_ulysses=4), "zigzag"),
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--seq-lens", default="2048,4096")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    import jax

    from cost_models.models import get_model
    from planner.plan import Plan, make_mesh
    from runtime import run

    model = get_model(args.model)
    common = dict(
        model=model,
        global_batch=1,
        block_q=128,
        block_kv=128,
        loss_chunk_tokens=0,
        param_dtype="float32",
        compute_dtype="float32",
    )
    print(f"{args.model}, {jax.device_count()} CPU devices; median step of {args.steps - 1} after the first")
    print(f"{'seq':>6} {'layout':<26} {'step ms':>9} {'vs 1 device':>12} {'tokens/s':>10}", flush=True)
    for seq_len in (int(s) for s in args.seq_lens.split(",")):
        single = run(
            Plan(topology="cpu:1", seq_len=seq_len, mesh=make_mesh(), **common),
            steps=args.steps,
            devices=jax.devices()[:1],
        )
        base = single.step_time_s
        print(f"{seq_len:>6} {'one device':<26} {base * 1e3:9.1f} {1.0:12.2f} {single.tokens_per_s:10.0f}", flush=True)
        for strategy, mesh, balance in LAYOUTS:
            plan = Plan(
                topology="cpu:8",
                seq_len=seq_len,
                mesh=make_mesh(**mesh),
                cp_strategy=strategy,
                load_balance=balance,
                **common,
            )
            report = run(plan, steps=args.steps)
            label = f"{strategy} {'x'.join(str(v) for v in mesh.values())} {balance}"
            print(
                f"{seq_len:>6} {label:<26} {report.step_time_s * 1e3:9.1f} {report.step_time_s / base:12.2f} "
                f"{report.tokens_per_s:10.0f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
