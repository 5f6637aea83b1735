"""A bound on the work a call does, counted in Python lines run rather than in seconds, so that a test
of "answers at once" gives the same verdict on a fast machine and on a loaded one (imported by pure
tests; tests/conftest.py puts tests/ on the path)."""

import sys
from contextlib import contextmanager


class TooMuchWork(BaseException):
    """Raised inside the code under test once it passes the bound: a BaseException, so that no
    `except Exception` there swallows it, and no `pytest.raises(SomeError)` around it takes it."""


@contextmanager
def at_most_lines(limit: int):
    """Fails the code run inside once it has run more than `limit` lines of Python (every function
    it calls, every loop iteration); the body's own lines in the caller's frame are not counted."""
    count = 0
    previous = sys.gettrace()

    def trace(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
            if count > limit:
                raise TooMuchWork(f"more than {limit} lines of Python run")
        return trace

    sys.settrace(trace)
    try:
        yield
    finally:
        sys.settrace(previous)
