"""MaxText 0.2.5's compiles of docs/measurements.md priced by `cpplan import` under the MaxText
target (`validation.anchors`): priced against compiled HBM per device, their ratio and both fit
verdicts; the target is every row within 10% with the same verdict.

Run from the repository root (a second, jax-free):

    python benchmarks/reprice_anchors.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from validation.anchors import ANCHORS, SOURCE, TOLERANCE, reprice  # noqa: E402


def main() -> int:
    print(f"# {SOURCE}: priced by cpplan import (--target maxtext) against MaxText 0.2.5's compiles")
    print(f"{'compile':<44} {'priced':>8} {'compiled':>9} {'ratio':>6}  verdicts (priced / compiled)")
    rows = [reprice(anchor) for anchor in ANCHORS]
    for row in rows:
        priced = ("fits" if row["priced_fits"] else "no") + (" (marginal)" if row["priced_marginal"] else "")
        verdicts = f"{priced} / {'fits' if row['compiled_fits'] else 'no'}"
        mark = "" if row["ok"] else "   <- off by more than 10% or the verdict"
        print(
            f"{row['name']:<44} {row['priced_gib']:8.1f} {row['compiled_gib']:9.1f} {row['ratio']:6.3f}  "
            f"{verdicts}{mark}"
        )
    ok = sum(row["ok"] for row in rows)
    print(f"{ok} of {len(rows)} within {TOLERANCE:.0%} with the same verdict (a marginal one claims neither)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
