"""SIGTERM and Ctrl-C: recorded, turned into KeyboardInterrupt, or left for a loop to notice.

A preemption notice (SIGTERM) is handled as Ctrl-C is: keep what was done, write it, exit with
128 + the signal. Where a command measures or trains it asks not to be interrupted at once and
stops after the step in hand instead, because a KeyboardInterrupt raised inside jax (its
garbage-collection callback, say) is swallowed with a traceback on stderr.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
from collections.abc import Iterator


class Interrupts:
    """The signals that reached this process during a command, and how they are delivered."""

    def __init__(self):
        self.received: list[int] = []
        self.raise_at_once = True

    @property
    def stopped(self) -> bool:
        """Whether a signal asked the command to stop."""
        return bool(self.received)

    def exit_status(self, default: int = signal.SIGINT) -> int:
        """128 + the last signal received (or `default`)."""
        return 128 + (self.received[-1] if self.received else default)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Within it a signal is only recorded: the loop in hand checks `stopped` and ends cleanly."""
        self.raise_at_once = False
        try:
            yield
        finally:
            self.raise_at_once = True

    @contextlib.contextmanager
    def handled(self) -> Iterator[None]:
        """Installs the handler for SIGTERM and SIGINT (unless the parent ignores SIGINT) for one command.

        Ctrl-C gets the same handler as SIGTERM, so that every interrupt is recorded even where a
        library swallows the KeyboardInterrupt it raises.
        """
        self.received.clear()
        ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        handled = [signal.SIGTERM] + ([] if ignored else [signal.SIGINT])
        in_main = threading.current_thread() is threading.main_thread()
        previous = {s: signal.signal(s, self._handle) for s in handled} if in_main else {}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _handle(self, signum: int, frame) -> None:
        self.received.append(signum)
        if not self.raise_at_once:
            return
        if _in_gc_callback(frame):
            # Python swallows what a garbage-collection callback raises (jax registers one): send
            # the signal again once the callback has returned
            self._deliver_again(signum)
            return
        raise KeyboardInterrupt

    def _deliver_again(self, signum: int) -> None:
        """Sends `signum` to this process again shortly, from another thread, so that its handler
        runs at the main thread's next instruction outside the callback."""
        threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()


def _in_gc_callback(frame) -> bool:
    """Whether `frame` runs inside one of the garbage collector's callbacks (`gc.callbacks`)."""
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks:
            return True
        frame = frame.f_back
    return False


INTERRUPTS = Interrupts()
