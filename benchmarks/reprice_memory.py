"""Re-price bench_memory's plans with the current memory price against the compiler figures it
stored, without compiling again (seconds instead of an hour on a 2-core machine).

    python benchmarks/reprice_memory.py                # every stored row
    python benchmarks/reprice_memory.py --only tpu7x   # rows whose label contains the text

The compiler figures are only as current as the runtime that produced them: re-run
`bench_memory.py` after a change to the runtime, re-price after a change to the price. Where a row
stores the least HBM cap it compiled under (`bench_memory.py --least-hbm`), two more columns give
that cap and today's price against it; where it stores its heap (`heap`), two more give the heap's
gaps and today's price against the live peak. The errors counted are those against the unconstrained
figure.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_memory import RESULTS, ROWS, TARGET_ERROR, plan_of  # noqa: E402

from cost_models.errors import CpplanError  # noqa: E402
from cost_models.units import GiB, MiB  # noqa: E402
from planner.estimate import estimate  # noqa: E402


def live_columns(stored: dict, now) -> str:
    """The heap's gaps a stored row's compile left (share of its temporary allocation) and today's
    price against the compiler's figure less them (what the step held live at its peak, with its
    arguments and code), or blanks where the row stores no heap."""
    heap = stored.get("heap")
    if not heap:
        return f"{'':>6} {'':>9}"
    gaps = heap["temp_bytes"] - heap["live_peak_bytes"]
    live = stored["compiled_bytes"] - gaps
    return f"{gaps / heap['temp_bytes']:>6.1%} {now.hbm_bytes_per_device / live - 1:>+9.1%}"


def least_columns(stored: dict, now) -> str:
    """The least HBM cap a stored row compiled under and today's price against it, or "" where
    the row stores none."""
    least = stored.get("least_hbm")
    if not least:
        return ""
    cap = least["cap_mib"] * MiB
    return f"  {cap / GiB:>7.2f}G {now.hbm_bytes_per_device / cap - 1:>+9.1%}"


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
    within = agree = 0
    for row in rows:
        old, now = stored[row[0]], estimate(plan_of(row))
        error = now.hbm_bytes_per_device / old["compiled_bytes"] - 1
        within += abs(error) <= TARGET_ERROR
        agree += now.fits == old["compiled_fits"]
        print(
            f"{row[0]:<{width}} {old['compiled_bytes'] / GiB:>7.2f}G {old['predicted_bytes'] / GiB:>7.2f}G "
            f"{now.hbm_bytes_per_device / GiB:>7.2f}G {old['error']:>+9.1%} → {error:>+7.1%}  "
            f"{'fits' if now.fits else 'no'}/{'fits' if old['compiled_fits'] else 'no'}"
            f"{'':>3}{live_columns(old, now)}{least_columns(old, now)}"
        )
    print(f"\n{within} of {len(rows)} within {TARGET_ERROR:.0%}; fit verdicts agree on {agree} of {len(rows)}")


if __name__ == "__main__":
    main()
