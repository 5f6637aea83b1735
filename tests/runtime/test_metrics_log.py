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
