"""XLA's compiled programs kept between processes, and a count of the compiles a piece of work asks for.

`cpplan validate` spends most of its time compiling (on a TPU v5e chip about 50 s per plan's step against
seconds of steps), and runs the same plans again and again as the model is tuned; jax's persistent
compilation cache keeps each executable on disk under a key of the program, the devices and the compiler's
options, so a second run of a plan loads its step rather than compiling it. `count_compiles` says, for the
thread it runs in, how many programs were compiled and how many the cache answered (from jax's monitoring
events, which fire in the compiling thread).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CACHE_DIR_ENV = "JAX_COMPILATION_CACHE_DIR"  # jax's own setting: where a user has put the cache already
MIN_COMPILE_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"  # jax's: programs compiled faster are not kept
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # every compile, answered by the cache or not
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/cpplan/jax`, or `~/.cache/cpplan/jax` (the XDG default) where that is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cpplan" / "jax"


def use_compile_cache(enabled: bool = True) -> str:
    """Turns jax's persistent compilation cache on (in `$JAX_COMPILATION_CACHE_DIR` where set, else in
    `default_cache_dir()`; every program unless `$JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` says
    otherwise) or, `enabled` False, off, for the compiles from now on.

    Returns:
        A line for the user saying where the cache is, or that it is off.
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    # jax settles its cache at its first compile: start it again, with these settings, at the next
    compilation_cache.reset_cache()
    if not enabled:
        jax.config.update("jax_enable_compilation_cache", False)
        return "compilation cache: off (--no-compile-cache)"
    given = os.environ.get(CACHE_DIR_ENV)
    where = Path(given) if given else default_cache_dir()
    # jax reads its environment when it is imported, which may have been before the variable was set
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(where))
    if MIN_COMPILE_TIME_ENV not in os.environ:
        # every program, not only those over jax's default of a second: a plan's short ones too (its
        # initialisers on a host, what its trace computes), so that a second run compiles none at all
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    source = f"${CACHE_DIR_ENV}" if given else f"cpplan's default; ${CACHE_DIR_ENV} moves it"
    return f"compilation cache: {where} ({source}; --no-compile-cache turns it off)"


@dataclass
class Compiles:
    """Programs compiled in one thread while counted, and how many of them the persistent cache answered."""

    compiled: int = 0
    cache_hits: int = 0

    def describe(self) -> str:
        """'cache hit', 'cache miss', '1 of 2 from the cache', or 'no compile' (all found in memory)."""
        if not self.compiled:
            return "no compile"
        if self.cache_hits == self.compiled:
            return "cache hit"
        if not self.cache_hits:
            return "cache miss"
        return f"{self.cache_hits} of {self.compiled} from the cache"


_counting = threading.local()  # the `Compiles` being counted in each thread, if any
_listening_lock = threading.Lock()
_listening = False


def _on_event(event: str, *_args, **_kwargs) -> None:
    counts = getattr(_counting, "counts", None)
    if counts is None:
        return
    if event == COMPILE_EVENT:
        counts.compiled += 1
    elif event == CACHE_HIT_EVENT:
        counts.cache_hits += 1


@contextmanager
def count_compiles():
    """`with count_compiles() as counts:` counts the compiles of this thread in the block into `counts`."""
    import jax

    global _listening
    with _listening_lock:
        if not _listening:  # one listener for the process: jax keeps every listener it is given
            jax.monitoring.register_event_listener(_on_event)
            jax.monitoring.register_event_duration_secs_listener(_on_event)
            _listening = True
    outer = getattr(_counting, "counts", None)
    counts = _counting.counts = Compiles()
    try:
        yield counts
    finally:
        _counting.counts = outer
        if outer is not None:  # a count inside another adds to it
            outer.compiled += counts.compiled
            outer.cache_hits += counts.cache_hits
