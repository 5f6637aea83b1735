"""Re-price bench_maxtext's exported plans with today's `--target maxtext` price against the MaxText
compiles it stored, without compiling again (MaxText's compiles take minutes each).

    python benchmarks/reprice_maxtext.py                # every stored plan
    python benchmarks/reprice_maxtext.py --only ring    # plans whose name contains the text

Each plan is chosen and exported as `bench_maxtext.py` does it (`exported`), and its flags are checked
against those its compile ran with (the `== name` blocks of results/bench_maxtext.txt): a plan whose
export changed is named and priced as its compile ran it, read back from those flags. Re-run
`bench_maxtext.py` after a change to the export to compile what it writes now.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_maxtext import PLANS, TOLERANCE, command_line, exported  # noqa: E402
from reprice_memory import stored_results  # noqa: E402

from cost_models.units import GiB  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from planner.maxtext import read_maxtext  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "bench_maxtext.json"
LOG = RESULTS.with_suffix(".txt")


def compiled_flags(log: str) -> dict[str, str]:
    """The flags each plan of a bench_maxtext log was compiled with, by plan name (the line after
    its `== name`)."""
    lines = log.splitlines()
    return {line[3:]: lines[i + 1].strip() for i, line in enumerate(lines[:-1]) if line.startswith("== ")}


def main():
    only, rows_stored = stored_results(__doc__, RESULTS, "bench_maxtext.py")
    stored = {r["name"]: r for r in rows_stored if "compiled_gib" in r}
    ran = compiled_flags(LOG.read_text()) if LOG.exists() else {}
    plans = [p for p in PLANS if p[0] in stored and (not only or only in p[0])]
    width = max((len(p[0]) for p in plans), default=0)
    print(f"{'plan':<{width}} {'MaxText':>8} {'stored':>8} {'now':>8} {'ratio stored → now':>19}  fits now/MaxText")
    good = 0
    for name, topology, seq_len, strategy, mesh, extra in plans:
        export = exported(topology, seq_len, strategy, mesh, extra)
        flags = command_line(export)
        same_flags = ran.get(name) == flags
        # a plan whose export changed is priced as its compile ran it, read back from the flags it ran with
        plan = export.plan if same_flags or name not in ran else read_maxtext(ran[name]).plan
        now, old = estimate(plan, target="maxtext"), stored[name]
        ratio = now.hbm_bytes_per_device / GiB / old["compiled_gib"]
        good += abs(ratio - 1) <= TOLERANCE and now.fits == old["compiled_fits"] and name in ran
        print(
            f"{name:<{width}} {old['compiled_gib']:>7.1f}G {old['predicted_gib']:>7.1f}G "
            f"{now.hbm_bytes_per_device / GiB:>7.1f}G {old['ratio']:>8.3f} → {ratio:.3f}  "
            f"{'fits' if now.fits else 'no'}/{'fits' if old['compiled_fits'] else 'no'}"
        )
        print(
            f"{'':<{width}}   {flags}"
            + ("" if same_flags else f"\n{'':<{width}}   the export changed; priced as compiled: {ran.get(name)}")
        )
    print(f"\n{good} of {len(plans)} within {TOLERANCE:.0%} with the same verdict, priced as their compiles ran")


if __name__ == "__main__":
    main()
