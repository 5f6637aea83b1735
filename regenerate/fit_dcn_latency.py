"""Fits the DCN latency of the chip rows (`dcn_collective_latency_s`, `..._per_slice_s`) to how much the
published v5e runs' steps grow from one slice to N, and checks the fit on the other chips' multi-slice runs.

    python regenerate/fit_dcn_latency.py | tee benchmarks/results/dcn_latency_fit.txt

The runs of benchmarks/public_runs.csv that are published on 1 and on N slices with the same flags (MaxText's
v5e table: four models over 2-32 slices of v5e-256) isolate what crossing DCN costs: the growth of the step
from one slice. Priced as the line rate alone it is 5-10× too small and grows with the layers, not the bytes
(docs/multislice.md). MaxText's compiled step all-reduces the gradients across the slices in
`pricing.communication.data_all_reduces` calls (4 a layer, 7 more), each a reduce-scatter and an all-gather
across the slices, each waiting the latency `base + per_slice · N`; the growth left unpriced by the line rate
is fitted as calls · 2 · (base + per_slice · N) by non-negative least squares over those runs (scipy's nnls).
The v5p runs of the same table and the v6e runs of benchmarks/public_multislice_runs.csv are not fitted to:
their growth is printed beside the fit's, as a test. So is the growth of the families of
benchmarks/public_slice_scaling_runs.csv, published on several slice counts but not on one (MLPerf's GPT-3 175B
over 4, 8 and 12 v6e-256 slices), from their fewest slices.
"""

import csv
import statistics
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cost_models.models import ModelSpec  # noqa: E402
from cost_models.pricing.communication import data_all_reduces  # noqa: E402
from cost_models.topology import get_topology  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from validation.corpus import DCN_FITTED_CHIP as FITTED_CHIP  # noqa: E402
from validation.corpus import compare_corpus, read_corpus, slice_growth  # noqa: E402

CORPORA = (ROOT / "benchmarks" / "public_runs.csv", ROOT / "benchmarks" / "public_multislice_runs.csv")
SCALING = ROOT / "benchmarks" / "public_slice_scaling_runs.csv"
COLLECTIVES_PER_ALL_REDUCE = 2  # a reduce-scatter and an all-gather across the slices
# the scaling families' models, as MaxText's config gives them (configs/models/gpt3-175b.yml of the MLPerf
# v4.1 fork: 96 layers, embed 12288, 96 heads of 128, MLP 49152 of gelu, vocabulary 50304, logits via the
# embedding); priced in bf16 (the runs' int8 matmuls change the step, not what crosses the slices)
SCALING_MODELS = {
    "mlperf41-gpt3-175b-v6e": ModelSpec(
        "gpt3-175b", 96, 12288, 96, 96, 128, 49152, 50304, tie_embeddings=True, mlp_activations=("gelu",)
    ),
}


def growth_rows() -> list[dict]:
    """Every multi-slice run with its one-slice twin: its growth, published and priced, and the DCN latency
    the price holds in it now (so the fit reads the growth the line rate leaves, whatever the rows say)."""
    rows = []
    for path in CORPORA:
        runs = read_corpus(path)
        by_id = {r.run_id: r for r in runs}
        predicted = {r.run_id: r.predicted.step_time_s for r in compare_corpus(runs).measured}
        for g in slice_growth(runs, predicted):
            plan = by_id[g["run"]].plan
            chip = plan.topology_spec.chip
            calls = data_all_reduces(plan.model) * COLLECTIVES_PER_ALL_REDUCE
            held = calls * chip.dcn_latency_s(g["slices"]) if plan.dcn_data > 1 else 0.0
            rows.append(g | {"chip": chip.name, "calls": calls, "line_rate_growth_s": g["priced_growth_s"] - held})
    return rows


def scaling_plan(row: dict) -> Plan:
    """A scaling run's plan as its flags lay it out: fsdp over each slice, the slices splitting the batch."""
    slices, chips = int(row["slices"]), get_topology(row["topology"]).num_devices
    return Plan(
        model=SCALING_MODELS[row["family"]],
        topology=get_topology(row["topology"], num_slices=slices).name,
        seq_len=int(row["seq_len"]),
        global_batch=int(row["per_device_batch"]) * chips * slices,
        mesh=make_mesh(data=slices, fsdp=chips),
        dcn_data=slices,
        remat="full",
        loss_chunk_tokens=0,
    )


def print_scaling_families(per_slice: float) -> None:
    """Each scaling family's growth from its fewest slices: published (the median of its runs) and priced."""
    with open(SCALING, newline="") as f:
        rows = list(csv.DictReader(f))
    for family in dict.fromkeys(r["family"] for r in rows):
        runs = [r for r in rows if r["family"] == family]
        by_slices = {
            n: statistics.median(float(r["step_s"]) for r in runs if int(r["slices"]) == n)
            for n in sorted({int(r["slices"]) for r in runs})
        }
        plans = {n: scaling_plan(next(r for r in runs if int(r["slices"]) == n)) for n in by_slices}
        priced = {n: estimate(plan, target="maxtext").step_time_s for n, plan in plans.items()}
        first = min(by_slices)
        calls = data_all_reduces(plans[first].model) * COLLECTIVES_PER_ALL_REDUCE
        print(f"held out, {family} (no one-slice run; growth from {first} slices, {calls} collectives a step):")
        for n in by_slices:
            latency = calls * per_slice * (n - first)
            print(
                f"  {n:>2} slices: published {by_slices[n]:.3f} s, growth {by_slices[n] - by_slices[first]:+.3f} s; "
                f"priced growth {priced[n] - priced[first]:+.3f} s, of it the fitted latency's {latency:+.3f} s"
            )


def main() -> None:
    rows = growth_rows()
    fitted = [r for r in rows if r["chip"] == FITTED_CHIP]
    design = np.array([[r["calls"], r["calls"] * r["slices"]] for r in fitted])
    unpriced = np.array([r["published_growth_s"] - r["line_rate_growth_s"] for r in fitted])
    (base, per_slice), _ = nnls(design, unpriced)
    print(
        f"fitted to the {len(fitted)} {FITTED_CHIP} runs with a one-slice twin: one collective across N slices "
        f"waits {base * 1e3:.3f} ms + {per_slice * 1e3:.4f} ms × N beyond its bytes' line-rate time"
    )
    print(
        f"{'run':34} {'chip':5} {'N':>3} {'calls':>6} {'published':>10} {'line rate':>10} {'with latency':>13} "
        f"{'step error then → now':>22}"
    )
    errors = {"fitted": ([], []), "held out": ([], [])}
    for r in rows:
        latency = r["calls"] * (base + per_slice * r["slices"])
        priced = r["line_rate_growth_s"] + latency
        before = (r["twin_priced_s"] + r["line_rate_growth_s"]) / r["published_s"] - 1
        after = (r["twin_priced_s"] + priced) / r["published_s"] - 1
        which = "fitted" if r["chip"] == FITTED_CHIP else "held out"
        errors[which][0].append(abs(before))
        errors[which][1].append(abs(after))
        print(
            f"{r['run']:34} {r['chip']:5} {r['slices']:>3} {r['calls']:>6} {r['published_growth_s']:>+9.3f}s "
            f"{r['line_rate_growth_s']:>+9.3f}s {priced:>+12.3f}s {before:>+10.1%} → {after:>+6.1%}"
            f"{'' if which == 'fitted' else '  (held out)'}"
        )
    for which, (before, after) in errors.items():
        if before:
            print(
                f"{which}: {len(before)} multi-slice steps, MAPE {np.mean(before):.1%} → {np.mean(after):.1%}, "
                f"largest {max(before):.1%} → {max(after):.1%} (each step priced as its one-slice twin's price "
                f"plus the growth)"
            )
    print_scaling_families(per_slice)


if __name__ == "__main__":
    main()
