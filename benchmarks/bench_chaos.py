"""A tiny run on this host's 8 virtual CPU devices killed with SIGKILL at random moments (steps,
checkpoint saves, start-up and compile) and restarted each time; prints the kills by moment and
whether the final loss curve equals an uninterrupted run's, step for step.

    python benchmarks/bench_chaos.py --kills 20 --steps 80   # about 5 min here

Writes benchmarks/results/chaos.json. The target: at least 20 kills, every restart resumes, and the
same curve.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

RESULTS = ROOT / "benchmarks" / "results" / "chaos.json"
PROSE = ROOT / "tests" / "testdata" / "prose.txt"
MODEL, SEQ, TOPOLOGY = "tiny", "1k", "cpu:8"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from planner import api
    from runtime import run
    from validation.chaos import chaos_run

    plan = api.plan(MODEL, SEQ, TOPOLOGY)
    uninterrupted = list(run(plan, steps=args.steps, data=PROSE, seed=0).losses)
    run_argv = ["--model", MODEL, "--seq-len", SEQ, "--topology", TOPOLOGY, "--data", str(PROSE)]
    with tempfile.TemporaryDirectory() as tmp:
        report = chaos_run(
            run_argv, Path(tmp) / "run", steps=args.steps, kills=args.kills, seed=args.seed, uninterrupted=uninterrupted
        )
    RESULTS.write_text(json.dumps({"command": " ".join(sys.argv), **report.to_dict()}, indent=1) + "\n")
    moments = ", ".join(f"{n} {moment}" for moment, n in report.moments().items())
    print(f"{len(report.kills)} kills (target ≥ {args.kills}): {moments}")
    print(
        f"every restart resumed; final curve {'equals' if report.same_curve else 'DIFFERS from'} the uninterrupted one"
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0 if report.same_curve and len(report.kills) >= args.kills else 1


if __name__ == "__main__":
    sys.exit(main())
