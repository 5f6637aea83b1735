"""One thread at a time traces and lowers jax programs.

`cpplan validate` compiles plans ahead in threads beside the plan in hand. jax's tracing and lowering are not
safe in two threads at once (a plan compiled ahead failed once with "dictionary changed size during iteration",
the error jax-ml/jax#10107 reports from concurrent lowering), while what the threads gain by overlapping is
XLA's compile, which lets go of the GIL. So tracing and lowering hold `TRACING`, and `Lowered.compile` runs
outside it (`lowered_then_compiled`); a thread holding it waits on no other lock of cpplan's (re-entrant, for a
trace inside a trace).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

TRACING = threading.RLock()


def lowered_then_compiled(lower: Callable, compiler_options: dict | None = None):
    """`lower()` (a `jax.stages.Lowered`) under `TRACING`, then its `compile(compiler_options)` outside it."""
    with TRACING:
        lowered = lower()
    return lowered.compile(compiler_options)
