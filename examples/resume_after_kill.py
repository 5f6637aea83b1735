"""Kill a run with SIGKILL after a checkpoint, run the same command again, and compare its loss
curve with an uninterrupted run's, step for step.

    python examples/resume_after_kill.py --steps 12 --checkpoint-every 2
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def losses(run_dir: Path) -> dict[int, float]:
    """Each step's loss from metrics.jsonl (a step run twice: the later line)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def checkpoints(run_dir: Path) -> list[int]:
    folder = run_dir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else []


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq-len", default="1k")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument(
        "--data",
        default=str(ROOT / "tests" / "testdata" / "prose.txt"),
        help="text to train on (byte tokens), so that the loss moves",
    )
    args = parser.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    work = Path(tempfile.mkdtemp(prefix="cpplan-resume-"))

    def command(run_dir: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "cli",
            "run",
            "--model",
            args.model,
            "--seq-len",
            args.seq_len,
            "--topology",
            f"cpu:{args.devices}",
            "--steps",
            str(args.steps),
            "--checkpoint-every",
            str(args.checkpoint_every),
            "--data",
            args.data,
            "--run-dir",
            str(run_dir),
        ]

    killed = work / "killed"
    proc = subprocess.Popen(command(killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None and not (checkpoints(killed) and len(losses(killed)) > checkpoints(killed)[0]):
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    done = len(losses(killed))
    print(f"killed (SIGKILL) after step {done}; checkpoints at steps {checkpoints(killed)}")
    quiet = dict(env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(command(killed), **quiet)
    whole = work / "uninterrupted"
    subprocess.run(command(whole), **quiet)
    resumed, reference = losses(killed), losses(whole)
    print(f"{'step':>4}  {'uninterrupted':>14}  {'killed+resumed':>14}")
    for step in sorted(reference):
        print(
            f"{step:>4}  {reference[step]:>14.6f}  {resumed[step]:>14.6f}"
            f"{'' if resumed[step] == reference[step] else '  differs'}"
        )
    same = resumed == reference
    print("the curves are equal step for step" if same else "the curves differ")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
