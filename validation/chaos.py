"""A training run killed with SIGKILL at random moments and restarted each time: the promise that
a run survives any kill (a step, a checkpoint save, the start-up and compile) and ends with the
loss curve of an uninterrupted run, step for step, checked by running it.

A kill's moment is drawn at random and named by what the run was seen doing when it landed:
writing a checkpoint (Orbax's temporary folder present), before its first step (start-up,
restore or compile), or between and within steps.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cost_models.errors import CpplanError
from runtime.checkpoint import CHECKPOINT_DIR
from runtime.metrics import METRICS_FILE

POLL_S = 0.005  # how often the run's files are looked at while waiting for a moment
SAVING = "writing a checkpoint"
STARTING = "before its first step"
STEPPING = "between or within steps"


@dataclass(frozen=True)
class Kill:
    """One SIGKILL: what the run was doing, the steps logged and the checkpoints complete after it."""

    moment: str
    steps_logged: int
    checkpoints: tuple[int, ...]


@dataclass
class ChaosReport:
    """The kills, the resumed run's logged curve and the uninterrupted one."""

    steps: int
    kills: list[Kill] = field(default_factory=list)
    logged_steps: list[int] = field(default_factory=list)
    curve: list[float] = field(default_factory=list)
    uninterrupted: list[float] = field(default_factory=list)
    last_stdout: str = ""  # what the start that finished printed

    @property
    def same_curve(self) -> bool:
        """Every step logged once, in order, with exactly the uninterrupted run's loss."""
        return self.logged_steps == list(range(1, self.steps + 1)) and self.curve == self.uninterrupted

    def moments(self) -> dict[str, int]:
        """How many kills landed in each kind of moment."""
        counts = {SAVING: 0, STARTING: 0, STEPPING: 0}
        for kill in self.kills:
            counts[kill.moment] += 1
        return counts

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "kills": len(self.kills),
            "moments": self.moments(),
            "same_curve": self.same_curve,
            "each_kill": [
                {"moment": k.moment, "steps_logged": k.steps_logged, "checkpoints": list(k.checkpoints)}
                for k in self.kills
            ],
            "curve": self.curve,
            "uninterrupted": self.uninterrupted,
        }


def logged(run_dir: Path) -> list[dict]:
    """The run's step records (`metrics.jsonl`), the last line left out if a kill cut it short."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


def checkpoints(run_dir: Path) -> tuple[int, ...]:
    """Steps of the complete checkpoints (Orbax renames a finished one into place)."""
    folder = run_dir / CHECKPOINT_DIR
    return tuple(sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())) if folder.exists() else ()


def saving(run_dir: Path) -> bool:
    """Whether a checkpoint is being written (Orbax's temporary folder is there)."""
    folder = run_dir / CHECKPOINT_DIR
    return folder.exists() and any(not p.name.isdigit() and "tmp" in p.name for p in folder.iterdir())


def start_cli(argv: list[str]) -> subprocess.Popen:
    """`cpplan ARGV...` in a child process."""
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen, ceiling_s: float) -> bool:
    """Waits for `condition` while the run lives; False if it ended first or `ceiling_s` passed."""
    deadline = time.monotonic() + ceiling_s
    while proc.poll() is None and time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(POLL_S)
    return False


def _kill_at_a_random_moment(proc: subprocess.Popen, run_dir: Path, rng: random.Random, ceiling_s: float) -> str | None:
    """Kills the run at a moment drawn at random; the moment's name, or None if the run ended first."""
    before = len(logged(run_dir))
    aim = rng.choice((SAVING, STARTING, STEPPING))
    if aim == SAVING:  # a save too quick to be seen: the third step on
        wait_for(
            lambda: (len(logged(run_dir)) > before and saving(run_dir)) or len(logged(run_dir)) >= before + 3,
            proc,
            ceiling_s,
        )
    elif aim == STARTING:
        wait_for(lambda: False, proc, rng.uniform(0.0, 3.0))
    else:
        target = before + rng.randint(1, 3)
        wait_for(lambda: len(logged(run_dir)) >= target, proc, ceiling_s)
        wait_for(lambda: False, proc, rng.uniform(0.0, 0.2))
    if proc.poll() is not None:
        return None
    moment = SAVING if saving(run_dir) else STARTING if len(logged(run_dir)) == before else STEPPING
    proc.kill()
    proc.communicate()
    return moment


def chaos_run(
    run_argv: list[str],
    run_dir: Path,
    *,
    steps: int,
    kills: int,
    seed: int,
    uninterrupted: list[float],
    start: Callable[[list[str]], subprocess.Popen] = start_cli,
    ceiling_s: float = 600.0,
) -> ChaosReport:
    """Runs `cpplan run RUN_ARGV --steps STEPS --checkpoint-every 1 --run-dir RUN_DIR`, killing it
    with SIGKILL `kills` times at random moments (drawn from `seed`) and restarting it each time,
    then lets the last start finish; `uninterrupted` is the same run's loss curve without kills.

    Raises:
        CpplanError: a start that fails by itself, or a run that ends before `kills` kills.
    """
    argv = ["run", *run_argv, "--steps", str(steps), "--checkpoint-every", "1", "--run-dir", str(run_dir)]
    rng = random.Random(seed)
    report = ChaosReport(steps, uninterrupted=list(uninterrupted))
    while len(report.kills) < kills:
        proc = start(argv)
        moment = _kill_at_a_random_moment(proc, run_dir, rng, ceiling_s)
        if moment is None:
            _, stderr = proc.communicate()
            raise CpplanError(
                f"the run ended (exit {proc.returncode}) before kill {len(report.kills) + 1} of {kills}: "
                f"give it more than steps={steps}; its stderr ends: {stderr[-1000:]}"
            )
        report.kills.append(Kill(moment, len(logged(run_dir)), checkpoints(run_dir)))
    proc = start(argv)
    try:
        stdout, stderr = proc.communicate(timeout=ceiling_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise CpplanError(f"the last restart did not finish within {ceiling_s:g} s") from None
    if proc.returncode != 0:
        raise CpplanError(f"the last restart failed (exit {proc.returncode}); its stderr ends: {stderr[-1000:]}")
    report.last_stdout = stdout
    records = logged(run_dir)
    report.logged_steps = [r["step"] for r in records]
    report.curve = [r["loss"] for r in records]
    return report
