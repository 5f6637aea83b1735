"""Re-price every plan `benchmarks/tpu_v5e.sh` measured on the TPU v5e chip with today's price, and print
the step-time targets measured beside them, without the chip:

    python benchmarks/reprice_tpu_v5e.py     # writes results/tpu_v5e/report.{md,json}

It reads each `results/tpu_v5e/*.measurements.jsonl` (validate's records, the plan with its measured
fastest step); a plan measured in several files keeps the last file's figure. Beside the report it
prints each length's mean error and Spearman, and, for each plan measured with both attention
backwards, the measured MFU with splash's fused kernel against the dq and dK/dV kernels.
"""

import dataclasses
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.estimate import estimate  # noqa: E402
from planner.plan import Plan  # noqa: E402
from validation.report import StepResult, StepTimeReport  # noqa: E402
from validation.stats import spearman  # noqa: E402
from validation.steptime import measured_mfu  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "tpu_v5e"
TARGETS = {"plans": 20, "mape": 0.05, "bias": 0.05, "spearman": 0.95, "regret": 1.0}


def measured_plans(folder: Path) -> dict[str, tuple[Plan, float, float | None]]:
    """(plan, measured fastest step, median) by plan, over every measurements file in `folder`."""
    out = {}
    for path in sorted(folder.glob("*.measurements.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("measured_step_s"):
                plan = Plan.from_dict(row["plan"])
                out[json.dumps(plan.to_dict(), sort_keys=True)] = (
                    plan,
                    row["measured_step_s"],
                    row.get("measured_median_s"),
                )
    return out


def report_of(plans) -> StepTimeReport:
    report = StepTimeReport("cpplan on one TPU v5e chip: every plan measured, priced by today's v5e row")
    for plan, step_s, median_s in plans.values():
        predicted = estimate(plan)
        mfu = measured_mfu(predicted, step_s)
        report.results.append(StepResult(plan, predicted, step_s, mfu, measured_median_s=median_s))
    return report


def fused_pairs(report: StepTimeReport) -> list[tuple[StepResult, StepResult]]:
    """(fused, separate) results of the same plan but its attention backward."""
    by_plan = {json.dumps(r.plan.to_dict(), sort_keys=True): r for r in report.measured}
    pairs = []
    for r in report.measured:
        if r.plan.fused_attention_backward:
            twin = dataclasses.replace(r.plan, fused_attention_backward=False)
            other = by_plan.get(json.dumps(twin.to_dict(), sort_keys=True))
            if other is not None:
                pairs.append((r, other))
    return pairs


def main():
    report = report_of(measured_plans(RESULTS))
    report.write(RESULTS, plots=False)
    s = report.summary()
    by_len = report.by_seq_len()
    # a plan is chosen for one model: each model's plans are ranked, and its regret read, apart
    models = defaultdict(lambda: StepTimeReport(report.title))
    for result in report.results:
        models[result.plan.model.name].results.append(result)
    per_model = dict(sorted(models.items()))
    regret = max(r.summary()["regret"] for r in per_model.values())
    print(report.title)
    print(f"plans measured {s['plans_measured']:>8}   target ≥ {TARGETS['plans']}")
    print(f"MAPE           {s['mape']:>8.1%}   target ≤ {TARGETS['mape']:.0%}")
    bias = {n: sum(r.error for r in g) / len(g) for n, g in by_len.items()}
    worst = max(bias.values(), key=abs)
    print(f"worst bias     {worst:>+8.1%}   target within ±{TARGETS['bias']:.0%} at every length")
    print(f"Spearman       {s['spearman']:>8.3f}   target ≥ {TARGETS['spearman']}")
    print(f"regret         {regret:>8.3f}   target {TARGETS['regret']:.2f} at every length, each model's plans")
    print("\nby length: plans, mean error")
    for n, g in by_len.items():
        print(f"  {n:>7}: {len(g):>2}, {bias[n]:+.1%}")
    for name, model_report in per_model.items():
        measured = model_report.measured
        mape = sum(abs(r.error) for r in measured) / len(measured)
        print(f"{name}: {len(measured)} plans, MAPE {mape:.1%}; by length: plans, Spearman, regret")
        regrets = model_report.summary()["regret_per_seq_len"]
        for n, g in model_report.by_seq_len().items():
            steps = [r.predicted.step_time_s for r in g], [r.measured_step_s for r in g]
            shown = f"{spearman(*steps):.3f}" if len(g) > 2 else "n/a (under 3 plans)"
            print(f"  {n:>7}: {len(g):>2}, {shown}, {regrets[n]:.3f}")
    print("\nthe fused backward, measured MFU beside the same plan with the dq and dK/dV kernels")
    for fused, separate in fused_pairs(report):
        p = fused.plan
        print(
            f"  {p.model.name} {p.seq_len:>6} {p.remat.value:<21} blocks {p.block_q}: "
            f"{separate.measured_mfu:.1%} -> {fused.measured_mfu:.1%} "
            f"({separate.measured_step_s / fused.measured_step_s - 1:+.1%} faster; priced "
            f"{separate.predicted.step_time_s / fused.predicted.step_time_s - 1:+.1%})"
        )
    print(f"\nwrote {RESULTS.name}/report.md and report.json")


if __name__ == "__main__":
    main()
