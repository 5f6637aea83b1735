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
their growth is printed beside the fit's, as a test.
"""

import sys
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cost_models.pricing.communication import data_all_reduces  # noqa: E402
from validation.corpus import DCN_FITTED_CHIP as FITTED_CHIP  # noqa: E402
from validation.corpus import compare_corpus, read_corpus, slice_growth  # noqa: E402

CORPORA = (ROOT / "benchmarks" / "public_runs.csv", ROOT / "benchmarks" / "public_multislice_runs.csv")
COLLECTIVES_PER_ALL_REDUCE = 2  # a reduce-scatter and an all-gather across the slices


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


if __name__ == "__main__":
    main()
