"""Re-price bench_memory's plans with the current memory price against the compiler figures it
stored, without compiling again (seconds instead of an hour on a 2-core machine).

    python benchmarks/reprice_memory.py                # every stored row
    python benchmarks/reprice_memory.py --only tpu7x   # rows whose label contains the text

The compiler figures are only as current as the runtime that produced them: re-run
`bench_memory.py` after a change to the runtime, re-price after a change to the price. Where a row
stores the least HBM cap it compiled under (`bench_memory.py --least-hbm`), two more columns give
that cap and today's price against it; where it stores its heap (`heap`), two more give the heap's
gaps and today's price against the live peak. The last lines count the rows within the target against
each figure a row stores: the unconstrained one, the live peak, the least cap, and the HBM the step
needs (`validation.memory_bands.needed_bytes`: the least cap where measured, else the unconstrained
figure; what the memory bands are measured against).
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_memory import RESULTS, ROWS, TARGET_ERROR, gap_share, plan_of  # noqa: E402

from cost_models.errors import CpplanError  # noqa: E402
from cost_models.units import GiB, MiB  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from validation.memory_bands import needed_bytes  # noqa: E402


def live_bytes(stored: dict) -> float | None:
    """The compiler's figure less the heap's gaps its compile left (what the step held live at its peak,
    with its arguments and code), or None where the row stores no heap."""
    heap = stored.get("heap")
    return stored["compiled_bytes"] - heap["temp_bytes"] + heap["live_peak_bytes"] if heap else None


def least_bytes(stored: dict) -> float | None:
    """The least HBM cap the row compiled under, or None where it stores none."""
    least = stored.get("least_hbm")
    return least["cap_mib"] * MiB if least else None


def live_columns(stored: dict, now) -> str:
    """The heap's gaps (share of the temporary allocation) and today's price against the live peak, or blanks."""
    live = live_bytes(stored)
    if live is None:
        return f"{'':>6} {'':>9}"
    return f"{gap_share(stored['heap']):>6.1%} {now.hbm_bytes_per_device / live - 1:>+9.1%}"


def least_columns(stored: dict, now) -> str:
    """The least HBM cap a stored row compiled under and today's price against it, or "" where
    the row stores none."""
    cap = least_bytes(stored)
    if cap is None:
        return ""
    return f"  {cap / GiB:>7.2f}G {now.hbm_bytes_per_device / cap - 1:>+9.1%}"


def summary(name: str, errors: list[tuple[float, bool]]) -> str:
    """How many of the (error, priced to fit) pairs are within the target, and how many that fit are
    priced more than half the target under."""
    within = sum(abs(e) <= TARGET_ERROR for e, _ in errors)
    under = sum(e < -TARGET_ERROR / 2 for e, fits in errors if fits)
    return (
        f"against {name}: {within} of {len(errors)} within {TARGET_ERROR:.0%}, "
        f"{under} fitting under by more than {TARGET_ERROR / 2:.0%}"
    )


def stored_results(doc: str, results: Path, bench: str) -> tuple[str | None, list[dict]]:
    """A re-pricing script's `--only` text and the rows a bench stored, refusing a missing file.

    Args:
        doc: the script's docstring (its help).
        results: the bench's results file.
        bench: the bench that writes it (named in the error).
    Returns:
        The `--only` text (None: every row) and the stored rows.
    """
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="rows whose name contains this text")
    args = parser.parse_args()
    if not results.exists():
        raise CpplanError(f"{results} holds no compiler figures yet; run benchmarks/{bench} first.")
    return args.only, json.loads(results.read_text())


def main():
    only, rows_stored = stored_results(__doc__, RESULTS, "bench_memory.py")
    stored = {r["label"]: r for r in rows_stored}
    rows = [r for r in ROWS if r[0] in stored and (not only or only in r[0])]
    width = max(len(r[0]) for r in rows)
    print(
        f"{'plan':<{width}} {'XLA':>8} {'stored':>8} {'now':>8} {'error stored → now':>20}  fits now/XLA"
        f" {'gaps':>6} {'now/live':>9}{'least':>9} {'now/least':>10}"
    )
    agree = 0
    errors = {"the compiler": [], "the live peak": [], "the least cap": [], "what it needs": []}
    for row in rows:
        old, now = stored[row[0]], estimate(plan_of(row))
        error = now.hbm_bytes_per_device / old["compiled_bytes"] - 1
        agree += now.fits == old["compiled_fits"]
        references = (old["compiled_bytes"], live_bytes(old), least_bytes(old), needed_bytes(old))
        for name, reference in zip(errors, references):
            if reference is not None:
                errors[name].append((now.hbm_bytes_per_device / reference - 1, now.fits))
        print(
            f"{row[0]:<{width}} {old['compiled_bytes'] / GiB:>7.2f}G {old['predicted_bytes'] / GiB:>7.2f}G "
            f"{now.hbm_bytes_per_device / GiB:>7.2f}G {old['error']:>+9.1%} → {error:>+7.1%}  "
            f"{'fits' if now.fits else 'no'}/{'fits' if old['compiled_fits'] else 'no'}"
            f"{'':>3}{live_columns(old, now)}{least_columns(old, now)}"
        )
    print(f"\nfit verdicts agree on {agree} of {len(rows)}")
    for name, pairs in errors.items():
        print(summary(name, pairs))


if __name__ == "__main__":
    main()
