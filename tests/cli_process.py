"""`cpplan` in a child process as a terminal runs it, for the tests that signal, kill or resume it, and
waiting on such a child: for its event or its exit, never for a fixed time an idle machine needs."""

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

# Ctrl-C as in a terminal, even where the test runner's parent ignores SIGINT (a background job);
# the child restores it itself, so the runner (with jax's threads) spawns rather than forks
_AS_FROM_A_TERMINAL = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv = ['cpplan', *sys.argv[1:]]; runpy.run_module('cli', run_name='__main__')"
)

# How long a test waits for a child's event or exit before it calls the child stuck. An idle host
# needs seconds to a few minutes; a host shared with other CPU-bound work has needed three times
# that and more, so the bound is one no loaded machine reaches: it catches a hang, not a slow host.
PATIENCE_S = 20 * 60
_POLL_S = 0.2


def cpplan(*argv: str, cwd: Path) -> subprocess.Popen:
    """Starts `cpplan ARGV...` in `cwd` with a user's environment (no test-set XLA flags or platform)."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    return subprocess.Popen(
        [sys.executable, "-c", _AS_FROM_A_TERMINAL, *argv],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _gave_up(proc: subprocess.Popen, what: str, started: float, why: str) -> None:
    """Fails the test with what the child left: its exit status, and the tails of its output."""
    if proc.poll() is None:
        proc.kill()
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except (subprocess.TimeoutExpired, ValueError):  # pipes already read, or a child that will not die
        stdout, stderr = "", ""
    pytest.fail(
        f"{what} did not happen: {why}, after {time.monotonic() - started:.0f} s (exit status {proc.returncode}); "
        f"stdout ends: {(stdout or '')[-1500:]!r}; stderr ends: {(stderr or '')[-2500:]!r}"
    )


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen, what: str, *, patience_s: float = PATIENCE_S):
    """Waits until `condition()` holds, while `proc` lives.

    Fails the test, saying what it saw, when the child exits first or `patience_s` passes (then the
    child is killed).
    """
    started = time.monotonic()
    while not condition():
        if proc.poll() is not None:
            if condition():  # it happened just before the exit
                return
            _gave_up(proc, what, started, "the process ended first")
        if time.monotonic() - started > patience_s:
            _gave_up(proc, what, started, f"still waiting past the {patience_s:.0f} s a hang is called at; killed")
        time.sleep(_POLL_S)


def finish(proc: subprocess.Popen, what: str, *, patience_s: float = PATIENCE_S) -> tuple[str, str]:
    """The child's (stdout, stderr) once it exits; fails the test, saying what it saw, if it has
    not exited after `patience_s` (then it is killed)."""
    started = time.monotonic()
    try:
        return proc.communicate(timeout=patience_s)
    except subprocess.TimeoutExpired:
        _gave_up(proc, what, started, f"no exit by the {patience_s:.0f} s a hang is called at; killed")
        raise AssertionError("unreachable: pytest.fail raises") from None


def run(argv: list[str], what: str, **popen) -> subprocess.CompletedProcess:
    """`subprocess.run(argv, capture_output=True, text=True, **popen)` that waits for the exit as
    `finish` does, and says what the child left if it never comes."""
    proc = subprocess.Popen(argv, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    stdout, stderr = finish(proc, what)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
