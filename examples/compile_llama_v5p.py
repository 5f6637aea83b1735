"""Plan Llama 3.1 8B for a v5p slice and compile the plan's training step deviceless (libtpu),
printing the compiler's memory per device next to the planner's prediction.

    python examples/compile_llama_v5p.py --seq-len 256k --topology v5p:2x2x2
    python examples/compile_llama_v5p.py --seq-len 16k --layers 1   # a quick look
"""

import argparse
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3.1-8b")
    parser.add_argument("--seq-len", default="128k")
    parser.add_argument("--topology", default="v5p:2x2x2")
    parser.add_argument(
        "--global-batch-tokens",
        help="tokens per step (default: one sequence, as in MaxText's runs in docs/measurements.md)",
    )
    parser.add_argument("--layers", type=int, help="compile only this many layers (quicker; memory per layer scales)")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # abstract TPU devices need no TPU runtime

    import planner
    from cost_models.units import GiB
    from planner.estimate import estimate
    from runtime import compile_for

    plan = planner.plan(
        args.model, args.seq_len, args.topology, global_batch_tokens=args.global_batch_tokens or args.seq_len
    )
    if args.layers:
        plan = dataclasses.replace(plan, model=dataclasses.replace(plan.model, num_layers=args.layers))
    predicted = estimate(plan)
    print(plan.to_json())
    report = compile_for(plan)
    print(report)
    print(
        f"predicted {predicted.hbm_bytes_per_device / GiB:.2f} GiB per device, compiler {report.required_gib:.2f} GiB"
    )
    return 0 if report.fits else 1


if __name__ == "__main__":
    sys.exit(main())
