"""Calibrate this host's 8 virtual CPU devices, then run a handful of plans and write a report
of predicted against measured step time (markdown, JSON and two plots).

    python examples/validate_cpu_plans.py --model small --seq-lens 2048,4096 --max-plans 4 --out validation-report

The chip row written under OUT/chips is what the predictions use; the report is OUT/steps.
"""

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--seq-lens", default="2048,4096")
    parser.add_argument("--max-plans", type=int, default=4, help="plans per sequence length")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="validation-report")
    args = parser.parse_args(argv)
    # virtual CPU devices must be requested before jax is imported
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    from cost_models.chips import CHIP_DIR_ENV
    from cost_models.models import get_model
    from validation.calibration import calibrate
    from validation.steptime import validate_step_times

    out = Path(args.out)
    model = get_model(args.model)
    # attention is measured with the model's own heads: the kernels the plans will run
    row = calibrate(
        "cpu:8",
        attention_heads=model.num_heads,
        attention_kv_heads=model.num_kv_heads,
        attention_head_dim=model.head_dim,
    ).write(out / "chips")
    os.environ[CHIP_DIR_ENV] = str(row.parent)
    print(f"calibrated this host: {row}")
    report = validate_step_times(
        model,
        args.seq_lens.split(","),
        "cpu:8",
        max_plans=args.max_plans,
        top=2,
        steps=args.steps,
        compute_dtype="float32",
    )
    paths = report.write(out / "steps")
    print(report.markdown())
    print("wrote", ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
