"""The validation targets, measured: step time on cpu:8 and HBM against the XLA TPU compiler.

Run: python benchmarks/bench_validation.py [steps|memory|all] [--out benchmarks/results]
- steps: calibrate this host, then run ≥12 plans spanning all four strategies on cpu:8 and
  print MAPE, Spearman and regret (targets: ≤10%, ≥0.9, ≤1.10).
- memory: compile the best plan of each strategy deviceless on v5p-16 and tpu7x-16 (Llama 3.1 8B,
  one sequence of 512K tokens), and the least-memory plan at 2M on v5p-16 (fits nothing),
  and print how many are within
  10% of the compiler and the fit / no-fit agreement (targets: ≥10 plans, 100%).
Writes report.md / report.json / plots (steps) and memory.md / memory.json under --out.
"""

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one

OUT = Path("benchmarks/results")  # --out


def steps() -> None:
    from validation.calibration import calibrate
    from validation.steptime import validate_step_times

    chip_dir = OUT / "chips"
    # attention measured with the validated plans' heads: 'small' has 8 query and 4 kv heads of 32
    row = calibrate("cpu:8", attention_seq=1024, attention_heads=8, attention_kv_heads=4, attention_head_dim=32).write(
        chip_dir
    )
    os.environ["CPPLAN_CHIP_DIR"] = str(chip_dir)
    print(f"calibrated: {row}", flush=True)
    report = validate_step_times(
        "small", [2048, 4096], "cpu:8", sequences=1, max_plans=8, top=2, steps=5, compute_dtype="float32"
    )
    report.write(OUT / "steps")
    s = report.summary()
    print(
        f"step time over {s['plans_measured']} plans ({', '.join(s['strategies'])}): MAPE {s['mape']:.1%} "
        f"(target ≤ 10%), Spearman {s['spearman']:.3f} (≥ 0.9), regret {s['regret']:.3f} (≤ 1.10)"
    )


def memory() -> None:
    from validation.memory import validate_memory

    # the full 32 layers (a scanned layer compiles once, so depth costs little compile time);
    # 2M tokens on 8 v5p chips fits no plan: the compiler must refuse the least-memory one too
    report = validate_memory("llama3.1-8b", [524288], ["v5p:2x2x2", "tpu7x:2x2x2"], layers=32)
    report.results += validate_memory("llama3.1-8b", [2097152], ["v5p:2x2x2"], layers=32).results
    report.write(OUT / "memory")
    s = report.summary()
    print(report.markdown())
    print(
        f"memory: {s['within_10pct']} of {s['compared']} plans within 10% of the compiler (target ≥ 10), "
        f"fit agreement {s['fit_agreement']:.0%} (target 100%)"
    )


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=["steps", "memory", "all"], default="all")
    parser.add_argument("--out", type=Path, default=OUT, help="where the reports go (default %(default)s)")
    args = parser.parse_args()
    OUT = args.out
    if args.what in ("steps", "all"):
        steps()
    if args.what in ("memory", "all"):
        memory()
