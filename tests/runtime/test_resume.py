"""cpu_mesh tier: a run killed after a checkpoint and run again continues exactly; SIGTERM and
Ctrl-C stop a run after the step in hand with a checkpoint and one line.

Each test starts `cpplan run` as a user would (no XLA_FLAGS: the command asks for its devices)
and reads what the run left on disk: metrics.jsonl (one line per step, written as it is made)
and the Orbax checkpoints.
"""

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_process import cpplan

jax = pytest.importorskip("jax")

from planner import api  # noqa: E402
from runtime import run  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

ROOT = Path(__file__).resolve().parents[2]
PROSE = ROOT / "tests" / "testdata" / "prose.txt"  # real text: the loss falls and depends on every update
RUN = ("--model", "tiny", "--seq-len", "1k", "--topology", "cpu:8", "--data", str(PROSE))
STEPS = 12


def _steps_logged(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _checkpoints(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints (Orbax renames a finished one into place)."""
    folder = run_dir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else []


def _wait(condition, proc: subprocess.Popen, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if condition():
            return
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"{what} did not happen in {timeout_s} s; stderr: {proc.communicate()[1][-2000:]}")


def test_killed_run_resumes_exactly(tmp_path):
    run_dir = tmp_path / "run"
    argv = (*RUN, "--steps", str(STEPS), "--checkpoint-every", "2", "--run-dir", str(run_dir))
    proc = cpplan("run", *argv, cwd=tmp_path)
    _wait(lambda: _checkpoints(run_dir) and len(_steps_logged(run_dir)) >= 3, proc, 240, "a checkpoint")
    proc.kill()  # SIGKILL: nothing of the run's own runs after this
    proc.communicate()
    before = _steps_logged(run_dir)
    assert len(before) < STEPS, "the run ended before it was killed"
    resumed_from = max(_checkpoints(run_dir))
    again = cpplan("run", *argv, cwd=tmp_path)
    stdout, stderr = again.communicate(timeout=240)
    assert again.returncode == 0, stderr[-3000:]
    assert f"resumed from the checkpoint at step {resumed_from}" in stdout
    logged = _steps_logged(run_dir)
    # each step once: the killed run's lines up to its checkpoint, then the resumed run's
    assert [r["step"] for r in logged] == list(range(1, STEPS + 1))
    assert logged[:resumed_from] == before[:resumed_from]
    curve = {r["step"]: r["loss"] for r in logged}
    plan = api.plan("tiny", "1k", "cpu:8")
    uninterrupted = run(plan, steps=STEPS, data=PROSE, seed=0).losses
    print(
        json.dumps(
            {
                "uninterrupted": uninterrupted,
                "killed_then_resumed": [curve[s] for s in sorted(curve)],
                "killed_after_step": len(before),
                "resumed_from": resumed_from,
            }
        )
    )
    assert [curve[s] for s in range(1, STEPS + 1)] == list(uninterrupted)  # exactly, step for step
    assert all(curve[r["step"]] == r["loss"] for r in before)  # the steps run again gave the same loss
    assert all(r["step_time_s"] > 0 and 0 < r["mfu"] < 1 and r["tokens_per_s_per_device"] > 0 for r in logged)
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_a_checkpoint_and_stops_in_one_line(signum, tmp_path):
    run_dir = tmp_path / "run"
    proc = cpplan("run", *RUN, "--steps", "400", "--checkpoint-every", "0", "--run-dir", str(run_dir), cwd=tmp_path)
    _wait(lambda: len(_steps_logged(run_dir)) >= 2, proc, 240, "two steps")
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"cpplan: stopped by {signal.Signals(signum).name} after step "), last
    stopped_at = int(last.split("after step ")[1].split(";")[0])
    assert _checkpoints(run_dir) == [stopped_at] and len(_steps_logged(run_dir)) == stopped_at < 400
