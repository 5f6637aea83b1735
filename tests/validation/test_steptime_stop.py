"""A SIGTERM that lands once a plan's requested steps have all run leaves that plan measured: it was
recorded "abandoned: interrupted after 3 of 3 steps" when the stop flag, polled after the last step,
was taken for a stop before it."""

import json
import signal

import pytest

from cli.signals import INTERRUPTS

pytestmark = pytest.mark.cpu_mesh


def test_a_sigterm_after_the_last_step_leaves_the_plan_measured(tmp_path):
    pytest.importorskip("jax")
    from validation.steptime import choose_plans, validate_step_times

    steps = 3
    plans = choose_plans("tiny", [1024], "cpu:8", max_plans=1, top=1, strategies=["ring"], compute_dtype="float32")
    polls = []

    def stop() -> bool:
        """The flag the CLI polls after each step; the notice arrives when the last step is done."""
        polls.append(len(polls) + 1)
        if polls[-1] == steps:
            signal.raise_signal(signal.SIGTERM)
            while not INTERRUPTS.stopped:  # the handler runs at the interpreter's next check: wait for it
                pass
        return INTERRUPTS.stopped

    journal = tmp_path / "measurements.jsonl"
    with INTERRUPTS.handled(), INTERRUPTS.deferred():
        report = validate_step_times("tiny", [1024], "cpu:8", steps=steps, plans=plans[:1], stop=stop, journal=journal)
        assert INTERRUPTS.received == [signal.SIGTERM]
    assert polls[:steps] == [1, 2, 3]  # asked after each step (and once more after the plan)
    (result,) = report.results
    assert result.failure is None, result.failure
    assert 0 < result.measured_step_s <= result.measured_median_s
    assert not report.interrupted  # nothing was left unmeasured
    (record,) = [json.loads(line) for line in journal.read_text().splitlines()]
    assert record["failure"] is None and record["measured_step_s"] == result.measured_step_s
