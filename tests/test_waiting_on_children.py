"""The tests that wait on a child process wait for its event or its exit, however slow the host: a
slow event is waited for, a child that ends first is reported at once with what it printed, and
only a hang (past a bound no loaded host reaches) is given up on, with what the child left."""

import select
import subprocess
import sys

import pytest
from cli_process import PATIENCE_S, finish, wait_until

pytestmark = pytest.mark.pure


class _Clock:
    """A monotonic clock that jumps `step_s` at every sleep: a host as slow as a test likes."""

    def __init__(self, step_s: float):
        self.now, self.step_s = 0.0, step_s

    def monotonic(self) -> float:
        return self.now

    def sleep(self, _seconds: float) -> None:
        self.now += self.step_s


@pytest.fixture
def slow_host(monkeypatch):
    import cli_process

    clock = _Clock(step_s=30.0)
    monkeypatch.setattr(cli_process.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(cli_process.time, "sleep", clock.sleep)
    return clock


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_an_event_a_loaded_host_makes_late_is_waited_for(slow_host):
    # a busy host once took 28 minutes over what an idle one does in 10: the bound is beyond that
    assert PATIENCE_S >= 15 * 60
    proc = _child("import time; time.sleep(3600)")
    try:
        wait_until(lambda: slow_host.now >= 12 * 60, proc, "the first measurement")
        assert proc.poll() is None and slow_host.now >= 12 * 60
    finally:
        proc.kill()
        proc.communicate()


def test_a_child_that_ends_first_is_reported_at_once_with_what_it_printed(slow_host):
    proc = _child("import sys; print('compiling'); sys.exit('cpplan: error: no devices')")
    proc.wait()
    with pytest.raises(pytest.fail.Exception) as failed:
        wait_until(lambda: False, proc, "the first measurement")
    message = str(failed.value)
    assert "the first measurement did not happen: the process ended first, after 0 s" in message
    assert "exit status 1" in message and "compiling" in message and "no devices" in message


def test_a_hang_is_given_up_on_after_the_bound_and_the_child_killed(slow_host):
    proc = _child("import sys, time; print('stuck', file=sys.stderr, flush=True); time.sleep(3600)")
    assert select.select([proc.stderr], [], [], 60)[0]  # it has spoken (in real time) before the clock runs
    with pytest.raises(pytest.fail.Exception) as failed:
        wait_until(lambda: False, proc, "the first measurement")
    assert proc.poll() is not None  # killed, not left behind
    message = str(failed.value)
    assert f"still waiting past the {PATIENCE_S} s a hang is called at; killed" in message and "stuck" in message
    assert slow_host.now > PATIENCE_S


def test_finish_returns_the_output_of_a_child_that_exits():
    assert finish(_child("print('done')"), "the run") == ("done\n", "")


def test_finish_gives_up_on_a_child_that_never_exits_saying_so():
    proc = _child("import time; time.sleep(3600)")
    gave_up = "the run did not happen: no exit by the 1 s a hang is called at; killed"
    with pytest.raises(pytest.fail.Exception, match=gave_up):
        finish(proc, "the run", patience_s=1)
    assert proc.poll() is not None
