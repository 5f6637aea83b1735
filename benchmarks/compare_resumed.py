"""Compares the losses of an uninterrupted `cpplan run --json` with those of the same run stopped after
a checkpoint and resumed (two `--json` outputs), and prints each run's measured step time and MFU
beside the prediction.

    python benchmarks/compare_resumed.py FULL.json FIRST.json RESUMED.json

Exit status 0 when the resumed losses equal the uninterrupted ones exactly, 1 when they differ, 2 when
an output is missing or is not a run's report.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def read_run(path: str) -> dict:
    """A `cpplan run --json` report, or exits with status 2 saying why it cannot be read."""
    text = Path(path).read_text() if Path(path).is_file() else ""
    try:
        report = json.loads(text)
    except json.JSONDecodeError:
        report = None
    if not isinstance(report, dict) or "losses" not in report:
        sys.exit(f"compare_resumed: {path} is not a finished run's --json report (see the run's log beside it)")
    return report


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    full, first, resumed = (read_run(p) for p in argv)
    if resumed["first_step"] != first["first_step"] + len(first["losses"]):
        print(
            f"the resumed run started at step {resumed['first_step']}, not where the first stopped "
            f"({first['first_step'] + len(first['losses'])}): it did not resume from its checkpoint"
        )
        return 1
    joined = first["losses"] + resumed["losses"]
    steps = min(len(joined), len(full["losses"]))
    diffs = [abs(a - b) for a, b in zip(full["losses"][:steps], joined[:steps])]
    equal = len(joined) == len(full["losses"]) and all(d == 0 for d in diffs)
    print(
        f"losses over {len(full['losses'])} steps, resumed at step {resumed['first_step']}: "
        + ("equal" if equal else f"differ (largest difference {max(diffs, default=0.0):.3g})")
    )
    print(f"  uninterrupted: first {full['losses'][:3]}, last {full['losses'][-3:]}")
    print(f"  resumed:       first {joined[:3]}, last {joined[-3:]}")
    for name, run in (("uninterrupted", full), ("first part", first), ("resumed", resumed)):
        p, m = run["predicted"], run["measured"]
        print(
            f"  {name}: step {m['step_time_s'] * 1e3:.1f} ms measured (median), {p['step_time_s'] * 1e3:.1f} ms "
            f"predicted; MFU {m['mfu']:.1%} measured, {p['mfu']:.1%} predicted"
        )
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
