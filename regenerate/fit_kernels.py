"""Writes the TPU chip rows' kernel figures from tokamax's measured kernel timings
(`validation.kernel_fits`), prints model against measured, and saves the comparison.

Files are looked up in the tokamax package (the importable one, or `--tokamax`) first, then in
each `--data` checkout of the tokamax repository, in order: the first readable, non-empty copy of a
file is used. Releases carry different timings, so `--only` writes just the named figures, and
`--out` keeps each run's comparison apart. The TPU rows hold the attention figures of a tokamax
checkout at 783ea95 (the installed 0.0.12 has no TPU attention timings) and the matmul efficiency
of the tokamax 0.0.17 package (MaxText 0.2.5's, with the new grouped-matmul kernel):

    python regenerate/fit_kernels.py --data /path/to/tokamax-checkout [--write [--only FIELD ...]]
    python regenerate/fit_kernels.py --tokamax /path/to/site-packages/tokamax \
        --out benchmarks/results/kernels/tokamax-0.0.17 [--write --only matmul_efficiency]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# this checkout's rows, whatever cpplan the interpreter has installed: --write edits them
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from validation.kernel_fits import RESULTS_DIR, derive, installed_dir, report, write_rows  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        type=Path,
        action="append",
        default=[],
        help="a checkout of github.com/openxla/tokamax (repeatable; read after the installed package)",
    )
    parser.add_argument(
        "--tokamax",
        type=Path,
        help="a tokamax package folder (.../site-packages/tokamax) to read instead of the importable one",
    )
    parser.add_argument("--write", action="store_true", help="write the figures into cost_models/data/chips/*.json")
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR,
        help=f"where to save comparison.txt and figures.json (default {RESULTS_DIR})",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="FIELD",
        help="with --write, the figures to write (e.g. matmul_efficiency); the rest stay as they are",
    )
    args = parser.parse_args()
    derived = derive(args.data, installed_dir(args.tokamax))
    text = report(derived)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "comparison.txt").write_text(text)
    (args.out / "figures.json").write_text(
        json.dumps({name: {"figures": d["figures"], "sources": d["sources"]} for name, d in derived.items()}, indent=2)
        + "\n"
    )
    if args.write:
        write_rows(derived, only=args.only)


if __name__ == "__main__":
    main()
