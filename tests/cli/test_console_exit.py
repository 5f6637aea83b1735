"""The `cpplan` executable's exit: a process whose compile-ahead threads still compile ends without Python's
teardown (which would abort it under XLA's compiler), its output flushed and its status kept, whether `main`
answered, lost its reader or raised; any other process ends as Python ends one."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parents[2]
# a stand-in for an interrupted validation: a thread named as validate's compile-ahead threads are, blocked as a
# compile is, is alive or not; `main` answers and returns 130, or closes stderr as it does when its reader is gone
# and returns 0, or raises; the teardown says when it runs
PROCESS = """
import atexit, importlib, sys, threading
from validation.steptime import COMPILE_AHEAD_THREAD

command = importlib.import_module("cli.main")  # the module (the package's `cli.main` is its function)

def answer():
    print("the answer")
    if sys.argv[2] == "reader-gone":
        sys.stderr.close()
        return 0
    if sys.argv[2] == "error":
        raise RuntimeError("unexpected")
    return 130

atexit.register(lambda: print("teardown ran", flush=True))
if sys.argv[1] == "compiling":
    threading.Thread(target=threading.Event().wait, name=COMPILE_AHEAD_THREAD, daemon=True).start()
command.main = answer
command.console()
"""
STATUS = {"answered": 130, "reader-gone": 0, "error": 1}


@pytest.mark.parametrize("ending", list(STATUS))
@pytest.mark.parametrize("threads", ["compiling", "done"])
def test_a_process_with_compiles_in_flight_ends_without_teardown(threads, ending):
    done = subprocess.run(
        [sys.executable, "-c", PROCESS, threads, ending], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == STATUS[ending], done.stderr
    # the answer is printed (flushed before the exit) in each; the teardown runs only with no compile in flight
    assert done.stdout == "the answer\n" + ("" if threads == "compiling" else "teardown ran\n")
    if ending == "error":  # the error is printed either way, by the exit or by Python
        assert "RuntimeError: unexpected" in done.stderr
    else:
        assert done.stderr == ""
