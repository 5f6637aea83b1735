"""Plan a small model for this host's 8 virtual CPU devices, run the best plan, and compare
the measured step with the planner's prediction.

    python examples/run_cpu_best_plan.py --model tiny --seq-len 4096 --steps 4
"""

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq-len", default="4096")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--data", default=str(ROOT / "tests" / "testdata" / "prose.txt"), help="text to train on (byte tokens)"
    )
    args = parser.parse_args(argv)
    # virtual CPU devices must be requested before jax is imported
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.devices}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import planner
    from planner.estimate import estimate
    from runtime import run

    topology = f"cpu:{args.devices}"
    explanation = planner.explain(args.model, args.seq_len, topology)
    plan = explanation.best
    if plan is None:
        print(explanation)
        return 1
    print(explanation)
    predicted = estimate(plan)
    report = run(plan, steps=args.steps, data=args.data)
    print(f"\nmeasured: {report}")
    print(
        f"predicted step {predicted.step_time_s * 1e3:.1f} ms, measured {report.step_time_s * 1e3:.1f} ms "
        f"(ratio {report.step_time_s / predicted.step_time_s:.2f}); predicted MFU {predicted.mfu:.1%}, "
        f"measured {report.mfu:.1%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
