"""How far the memory price is from the compiler's figure, per target and chip, each way: the margins
around the HBM capacity within which `explain` calls a plan's fit, or its misfit, marginal
(`cost_models.accuracy.memory_band`).

cpplan's runtime: bench_memory's plans priced now against the HBM each step needs: the least cap it
compiles under where the row measured one (`bench_memory.py --least-hbm`: with HBM to spare the compiler
leaves gaps in its heap that it packs away under a cap), else its unconstrained figure, which is never
less. MaxText 0.2.5: the compiles of `validation.anchors` priced as `cpplan import` reads their flags, and
compiles of published runs' own flags (`PUBLISHED_RUN_COMPILES`) priced as the corpus reads them.
"""

from __future__ import annotations

import json
from pathlib import Path

from cost_models.units import GiB, MiB
from planner.estimate import estimate
from planner.plan import Plan
from validation.anchors import ANCHORS, reprice
from validation.anchors import SOURCE as ANCHORS_SOURCE
from validation.corpus import read_corpus

ROOT = Path(__file__).resolve().parents[1]
BENCH_MEMORY = ROOT / "benchmarks" / "results" / "bench_memory.json"
# MaxText 0.2.5's deviceless compiles of published runs' own flags (benchmarks/public_runs.csv): run id →
# HBM per device, GiB (docs/maxtext_offload.md, "Where the loop stops")
PUBLISHED_RUN_COMPILES = {"v6e-llama3.1-70b-v6e-128": 26.76}


def _band(triples: list[tuple[float, float, float]], source: str) -> dict:
    """{under, over, allocated, mape, rows, source} of (priced, needed, allocated) triples: `under` the most
    the compiler needed beyond the price, as a fraction of the price; `over` the most the price said beyond
    what the compiler needed, as a fraction of that; `allocated` the most a compile given the whole HBM
    allocated beyond the price, its heap's gaps with it (each 0 where it never happened)."""
    return {
        "under": max(0.0, max(needed / priced - 1 for priced, needed, _ in triples)),
        "over": max(0.0, max(priced / needed - 1 for priced, needed, _ in triples)),
        "allocated": max(0.0, max(allocated / priced - 1 for priced, _, allocated in triples)),
        "mape": sum(abs(priced / needed - 1) for priced, needed, _ in triples) / len(triples),
        "rows": len(triples),
        "source": source,
    }


def needed_bytes(row: dict) -> float:
    """The HBM a stored bench_memory compile needs: the least cap it compiled under where measured and
    verified, else what it held unconstrained."""
    least = row.get("least_hbm")
    if least and least.get("verified"):
        return float(least["cap_mib"] * MiB)
    return float(row["compiled_bytes"])


def memory_bands() -> dict[str, dict[str, dict]]:
    """target → chip → its band, from the stored compiles."""
    by_chip: dict[str, list] = {}
    for row in json.loads(BENCH_MEMORY.read_text()):
        plan = Plan.from_dict(row["plan"])
        by_chip.setdefault(plan.topology_spec.chip.name, []).append(
            (estimate(plan).hbm_bytes_per_device, needed_bytes(row), float(row["compiled_bytes"]))
        )
    ours = {
        chip: _band(
            pairs,
            "benchmarks/results/bench_memory.json: deviceless compiles of cpplan's step (the least HBM cap it "
            "compiles under where measured, else the unconstrained figure), priced now",
        )
        for chip, pairs in sorted(by_chip.items())
    }
    by_chip, sources = {}, {}
    for anchor in ANCHORS:
        row = reprice(anchor)
        chip = anchor.topology.split("-")[0]
        by_chip.setdefault(chip, []).append((row["priced_gib"] * GiB, *[row["compiled_gib"] * GiB] * 2))
        sources[chip] = ANCHORS_SOURCE
    for run in read_corpus(ROOT / "benchmarks" / "public_runs.csv"):
        if run.run_id in PUBLISHED_RUN_COMPILES:
            chip = run.plan.topology_spec.chip.name
            priced = estimate(run.plan, target="maxtext").hbm_bytes_per_device
            by_chip.setdefault(chip, []).append((priced, *[PUBLISHED_RUN_COMPILES[run.run_id] * GiB] * 2))
            sources[chip] = "; ".join(
                filter(None, [sources.get(chip), "docs/maxtext_offload.md, a published run's flags compiled"])
            )
    theirs = {chip: _band(pairs, sources[chip] + ", priced now") for chip, pairs in sorted(by_chip.items())}
    return {"cpplan": ours, "maxtext": theirs}
