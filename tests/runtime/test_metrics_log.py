"""The run's metrics log: one record per step, also across a resume."""

import json

import pytest

from runtime.metrics import _keep_steps_up_to

pytestmark = pytest.mark.pure


def test_a_resumed_run_logs_each_step_once(tmp_path):
    """The steps a killed run logged after its last checkpoint are replayed on resume: the log keeps
    only those the checkpoint holds (and drops a line the kill cut short)."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 7)) + '{"step": 7, "lo')
    _keep_steps_up_to(path, 4)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4]


def _log(path, steps) -> None:
    path.write_text("".join(json.dumps({"step": s, "loss": float(s)}) + "\n" for s in steps))


def _steps(path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_the_steps_a_resume_runs_again_are_kept_aside_not_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _log(path, range(1, 7))
    assert _keep_steps_up_to(path, 4) is None
    assert _steps(path) == [1, 2, 3, 4] and _steps(tmp_path / "metrics.replayed.jsonl") == [5, 6]
    _log(path, [1, 2, 3, 4, 5])  # killed again after step 5, resumed from 4 again
    _keep_steps_up_to(path, 4)
    assert _steps(tmp_path / "metrics.replayed.jsonl") == [5, 6, 5]  # appended, as first logged


def test_a_start_from_step_one_over_an_earlier_run_keeps_its_log_and_says_so(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _log(path, range(1, 4))
    line = _keep_steps_up_to(path, 0)
    assert line == (
        f"starting from step 1 over an earlier run in {tmp_path} (no checkpoint of it to resume from): "
        "its log of 3 step(s), to step 3, is kept as metrics.1.jsonl"
    )
    assert not path.exists() and _steps(tmp_path / "metrics.1.jsonl") == [1, 2, 3]
    _log(path, [1, 2])  # and again: the first log stays where it was
    assert _keep_steps_up_to(path, 0).endswith("is kept as metrics.2.jsonl")
    assert _steps(tmp_path / "metrics.1.jsonl") == [1, 2, 3] and _steps(tmp_path / "metrics.2.jsonl") == [1, 2]


@pytest.mark.runtime_extra
def test_a_step_log_from_step_one_starts_its_own_file_beside_the_earlier_one(tmp_path):
    pytest.importorskip("tensorboardX")  # the log writes TensorBoard scalars too (the runtime extra)
    from runtime.metrics import StepLog

    _log(tmp_path / "metrics.jsonl", range(1, 6))
    log = StepLog(
        tmp_path,
        model_flops=1e9,
        tokens_per_step=1024,
        num_devices=1,
        peak_flops_per_device=1e12,
        total_steps=2,
        first_step=0,
        leader=True,
    )
    log.step(1, loss=2.0, seconds=0.5)
    log.close()
    assert log.kept_aside.endswith("its log of 5 step(s), to step 5, is kept as metrics.1.jsonl")
    assert _steps(tmp_path / "metrics.jsonl") == [1] and _steps(tmp_path / "metrics.1.jsonl") == [1, 2, 3, 4, 5]
