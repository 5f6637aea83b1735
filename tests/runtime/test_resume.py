"""cpu_mesh tier: a run killed at random moments and run again continues exactly; SIGTERM and
Ctrl-C stop a run after the step in hand with a checkpoint and one line.

Each test starts `cpplan run` as a user would (no XLA_FLAGS: the command asks for its devices)
and reads what the run left on disk: metrics.jsonl (one line per step, written as it is made)
and the Orbax checkpoints.
"""

import json
import signal
from pathlib import Path

import pytest
from cli_process import PATIENCE_S, cpplan, finish, wait_until

jax = pytest.importorskip("jax")

from planner import api  # noqa: E402
from runtime import run  # noqa: E402
from validation.chaos import chaos_run, checkpoints, logged  # noqa: E402

# a resumed run's curve is compared with the uninterrupted one's bit for bit, as the runs are built for a chip
pytestmark = [pytest.mark.cpu_mesh, pytest.mark.full_optimisation]

ROOT = Path(__file__).resolve().parents[2]
PROSE = ROOT / "tests" / "testdata" / "prose.txt"  # real text: the loss falls and depends on every update
RUN = ("--model", "tiny", "--seq-len", "1k", "--topology", "cpu:8", "--data", str(PROSE))
CHAOS_STEPS = 24  # room for three kills, each up to a few steps after the last


@pytest.mark.release_repeat  # on MaxText's stack its saves, restores and steps are the signal and recovery tests'
def test_a_run_killed_at_random_moments_resumes_to_the_uninterrupted_curve(tmp_path):
    """Two SIGKILLs at moments drawn at random (a save, the start-up, the steps:
    validation/chaos.py; benchmarks/bench_chaos.py makes twenty), a restart after each, and the
    finished run's curve is the uninterrupted one's, each step logged once."""
    run_dir = tmp_path / "run"
    uninterrupted = list(run(api.plan("tiny", "1k", "cpu:8"), steps=CHAOS_STEPS, data=PROSE, seed=0).losses)
    report = chaos_run(
        list(RUN),
        run_dir,
        steps=CHAOS_STEPS,
        kills=2,
        seed=1,
        uninterrupted=uninterrupted,
        start=lambda argv: cpplan(*argv, cwd=tmp_path),
        ceiling_s=PATIENCE_S,
    )
    print(json.dumps(report.to_dict()))
    assert len(report.kills) == 2
    assert report.logged_steps == list(range(1, CHAOS_STEPS + 1))  # each step once
    assert report.curve == uninterrupted  # exactly, step for step
    last = report.kills[-1].checkpoints
    assert not last or f"resumed from the checkpoint at step {max(last)}" in report.last_stdout
    records = logged(run_dir)
    assert all(r["step_time_s"] > 0 and 0 < r["mfu"] < 1 and r["tokens_per_s_per_device"] > 0 for r in records)
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.parametrize(
    "signum",
    # on MaxText's stack SIGINT's case makes SIGTERM's jax calls (only the handler's signal differs)
    [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.release_repeat)],
    ids=["SIGTERM", "SIGINT"],
)
def test_a_signal_saves_a_checkpoint_and_stops_in_one_line(signum, tmp_path):
    run_dir = tmp_path / "run"
    proc = cpplan("run", *RUN, "--steps", "400", "--checkpoint-every", "0", "--run-dir", str(run_dir), cwd=tmp_path)
    wait_until(lambda: len(logged(run_dir)) >= 2, proc, "two logged steps")
    proc.send_signal(signum)
    stdout, stderr = finish(proc, "the stop after the signal")
    assert proc.returncode == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"cpplan: stopped by {signal.Signals(signum).name} after step "), last
    stopped_at = int(last.split("after step ")[1].split(";")[0])
    assert checkpoints(run_dir) == (stopped_at,) and len(logged(run_dir)) == stopped_at < 400
