"""The `cpplan` executable's exit: a process whose compile-ahead threads still compile ends without Python's
teardown (which would abort it under XLA's compiler), its output flushed and its status kept; any other process
ends as Python ends one."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parents[2]
# a stand-in for an interrupted validation: `main` answers and returns 130; a thread named as validate's
# compile-ahead threads are, blocked as a compile is, is alive or not; the teardown says when it runs
PROCESS = """
import atexit, importlib, sys, threading
from validation.steptime import COMPILE_AHEAD_THREAD

command = importlib.import_module("cli.main")  # the module (the package's `cli.main` is its function)

atexit.register(lambda: print("teardown ran", flush=True))
if sys.argv[1] == "compiling":
    threading.Thread(target=threading.Event().wait, name=COMPILE_AHEAD_THREAD, daemon=True).start()
command.main = lambda: print("the answer") or 130
command.console()
"""


@pytest.mark.parametrize("threads", ["compiling", "done"])
def test_a_process_with_compiles_in_flight_ends_without_teardown(threads):
    done = subprocess.run(
        [sys.executable, "-c", PROCESS, threads], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 130, done.stderr
    # the answer is printed (flushed before the exit) in both; the teardown runs only with no compile in flight
    want = "the answer\n" + ("" if threads == "compiling" else "teardown ran\n")
    assert done.stdout == want and done.stderr == ""
