"""The HTML reports' size and drawing time, each beside its target (under 5 MB, drawn in under 2 s).

Run: python benchmarks/bench_report.py [--out DIR]   (needs the report extra: pip install -e '.[report]')

Builds the five target reports: explain for llama3.1-8b at 4M on v5p-256, at 1M on tpu7x-128 and at
1M on two v5p-128 slices, the sweep 128K–4M on tpu7x:2x2x4, and the host validate (the saved
report.json of `cpplan validate --model tiny --seq-lens 1k,2k --topology cpu:8 --max-plans 4 --top 1`
in tests/testdata/). Each is made by its `cpplan` command with `--html` (timed in all: planning and
drawing), and then drawn again from its `--json` output by `cpplan report` (timed: the drawing alone).
Prints a table and writes it to benchmarks/results/bench_report.txt; the HTML files go to --out.
"""

import argparse
import contextlib
import io
import shutil
import tempfile
import time
from pathlib import Path

from cli.main import main as cpplan

ROOT = Path(__file__).resolve().parents[1]
VALIDATE_JSON = ROOT / "tests" / "testdata" / "validate_tiny_cpu8_report.json"
MAX_BYTES, MAX_DRAW_S = 5_000_000, 2.0
LLAMA = ["--model", "llama3.1-8b"]
CASES = [
    ("explain 4M v5p-256", ["explain", *LLAMA, "--seq-len", "4M", "--topology", "v5p-256"]),
    ("explain 1M tpu7x-128", ["explain", *LLAMA, "--seq-len", "1M", "--topology", "tpu7x-128"]),
    ("explain 1M 2 × v5p-128", ["explain", *LLAMA, "--seq-len", "1M", "--topology", "v5p-128", "--num-slices", "2"]),
    ("sweep 128K-4M tpu7x:2x2x4", ["sweep", *LLAMA, "--topology", "tpu7x:2x2x4", "--seq-lens", "128k,512k,1M,4M"]),
]


def run(argv: list[str]) -> tuple[float, str]:
    """One cpplan command in this process: seconds taken, and what it printed."""
    out = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = cpplan(argv)
    assert status == 0, f"cpplan {' '.join(argv)} exited {status}"
    return time.perf_counter() - start, out.getvalue()


def measure(name: str, argv: list[str] | None, out: Path) -> str:
    slug = "-".join(name.replace("×", "x").split()).replace(":", "-")
    html, saved = out / f"{slug}.html", out / "saved.json"
    if argv is None:  # validate: its report.json, as `cpplan validate` writes it
        shutil.copy(VALIDATE_JSON, saved)
        whole = None
    else:
        whole, _ = run([*argv, "--html", str(html)])
        saved.write_text(run([*argv, "--json"])[1])
    drawn, _ = run(["report", str(saved), "--html", str(html)])
    size = html.stat().st_size
    verdict = "ok" if size < MAX_BYTES and drawn < MAX_DRAW_S else "MISSED"
    command = f"{whole:>8.2f}" if whole is not None else f"{'(saved)':>8}"
    return f"{name:<28} {size:>10,} {size / 1e6:>6.2f} {drawn:>7.2f} {command}  {verdict}  {html.name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for the HTML files (default: a temporary one)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="cpplan-reports-"))
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        f"targets: under {MAX_BYTES / 1e6:.0f} MB (10^6 bytes), drawn in under {MAX_DRAW_S:.0f} s; 'drawn' is "
        f"`cpplan report` from the saved JSON, 'command' the whole `cpplan ... --html` (planning too)",
        f"{'report':<28} {'bytes':>10} {'MB':>6} {'drawn s':>7} {'command s':>8}",
    ]
    for name, argv in [*CASES, ("validate tiny cpu:8", None)]:
        lines.append(measure(name, argv, out))
        print(lines[-1] if len(lines) > 3 else "\n".join(lines), flush=True)
    lines.append(f"HTML files in {out}")
    print(lines[-1])
    (ROOT / "benchmarks" / "results" / "bench_report.txt").write_text("\n".join(lines[:-1]) + "\n")


if __name__ == "__main__":
    main()
