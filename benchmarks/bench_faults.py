"""The fault and bad-input corpus counted: every case of the tests that feed cpplan bad flags,
configs, chip rows, plans, measured CSVs, MaxText logs and flags, unusable run directories,
unreachable coordinators, signals, kills and damaged checkpoints, run once; each case asserts its
exit status (1 or 2, or what the command promises) and its one line with no traceback. Prints the
cases by kind, how many passed and the slowest.

    python benchmarks/bench_faults.py   # about 5 min here

Writes benchmarks/results/faults.txt. The target: at least 120 run, import and CSV cases, each
refusal answered within 30 s (the signal and kill scenarios, which train or measure before their
fault, handled as the command promises); no traceback, hang or crash.
"""

import argparse
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "faults.txt"
FILES = [
    "tests/cli/test_bad_input.py",
    "tests/cli/test_faults.py",
    "tests/runtime/test_checkpoint_recovery.py",
    "tests/runtime/test_preflight.py",
    "tests/runtime/test_resume.py",
]
CEILING_S = 30.0  # for a refusal; the scenarios below train or measure before their fault
SCENARIOS = ("mid_validation", "killed_at_random_moments")
# a case's kind, by the words of its test's name (the first that matches)
KINDS = [
    ("CSV", ("csv",)),
    ("import", ("maxtext", "flags_file", "exported_flags")),
    (
        "run",
        (
            "coordinator",
            "run_directory",
            "join_timeout",
            "devices",
            "signal",
            "outputs",
            "journal",
            "symlink",
            "checkpoint",
            "preflight",
            "memory_moves",
            "resume",
            "killed",
            "interrupt",
            "run_json",
            "nan",
        ),
    ),
    ("CLI flags", ("flags_are_refused",)),
    ("model config", ("config", "model_names")),
    ("chip row", ("chip",)),
    ("plan and API", ("plan_json", "api", "sequence_length", "mesh_text")),
]


def kind_of(test_name: str) -> str:
    """A case's kind; a CLI flag case is its command's (`run` and `import` are counted as such)."""
    name, _, case = test_name.partition("[")
    name = name.lower()
    if "flags_are_refused" in name and case.split(" ")[0] in ("run", "import"):
        return case.split(" ")[0]
    return next((kind for kind, words in KINDS if any(w in name for w in words)), "other")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "cases.xml"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-n",
                "auto",
                f"--junitxml={junit}",
                *FILES,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        cases = ET.parse(junit).getroot().iter("testcase")
        rows = []
        for case in cases:
            failed = case.find("failure") is not None or case.find("error") is not None
            skipped = case.find("skipped") is not None
            rows.append((kind_of(case.get("name")), case.get("name"), float(case.get("time")), failed, skipped))
    ran = [r for r in rows if not r[4]]
    kinds = Counter(r[0] for r in ran)
    failed = [r for r in ran if r[3]]
    slow = [r for r in ran if r[2] > CEILING_S and not any(w in r[1] for w in SCENARIOS)]
    counted = sum(kinds[k] for k in ("run", "import", "CSV"))
    lines = [
        f"# python benchmarks/bench_faults.py: {len(ran)} cases run ({len(rows) - len(ran)} skipped)",
        *(f"{kind:14s} {n:4d}" for kind, n in kinds.most_common()),
        f"run, import and CSV cases: {counted} (target ≥ 120)",
        f"failed: {len(failed)}" + "".join(f"\n  {r[1]}" for r in failed),
        f"over {CEILING_S:g} s (scenarios that run or measure first left out): {len(slow)}"
        + "".join(f"\n  {r[1]} {r[2]:.1f} s" for r in slow),
        "slowest: " + ", ".join(f"{r[1]} {r[2]:.1f} s" for r in sorted(ran, key=lambda r: -r[2])[:3]),
    ]
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if counted >= 120 and not failed and not slow else 1


if __name__ == "__main__":
    sys.exit(main())
