"""Mapping a pure function over a few large items in processes, one per free core."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool


def free_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def map_in_processes(function: Callable, items: Sequence) -> list:
    """`function` of each item, in order: in a process per free core where there are several items and cores,
    else in this one. `function` must be pure (the answer is then the same either way) and picklable.

    The processes are spawned, not forked: a caller may hold threads (an accelerator runtime's) that a fork
    would copy mid-work. Where they cannot start, or one dies, the items run here.
    """
    workers = min(len(items), free_cores())
    if workers > 1:
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                return list(pool.map(function, items))
        except (OSError, BrokenProcessPool):
            pass
    return [function(item) for item in items]
