"""XLA's compiled programs kept between processes, and a count of the compiles a piece of work asks for.

`cpplan validate` spends most of its time compiling (on a TPU v5e chip about 50 s per plan's step against
seconds of steps), and runs the same plans again and again as the model is tuned; jax's persistent
compilation cache keeps each executable on disk under a key of the program, the devices and the compiler's
options, so a second run of a plan loads its step rather than compiling it. `prune` keeps the directory to a
bound between runs. `count_compiles` says, for the thread it runs in, how many programs were compiled and how
many the cache answered (from jax's monitoring events, which fire in the compiling thread).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cost_models.errors import CpplanError

CACHE_DIR_ENV = "JAX_COMPILATION_CACHE_DIR"  # jax's own setting: where a user has put the cache already
MIN_COMPILE_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"  # jax's: programs compiled faster are not kept
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # every compile, answered by the cache or not
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
MAX_SIZE_ENV = "JAX_COMPILATION_CACHE_MAX_SIZE"  # jax's: the bytes the cache may hold, -1 for no bound
# jax keeps every program unless told a bound, and each validate adds its plans' steps; a round figure,
# not a measured one ($JAX_COMPILATION_CACHE_MAX_SIZE sets another)
DEFAULT_MAX_SIZE_BYTES = 10 * 2**30
# jax's names for an entry's program and, where jax bounds the cache itself, its last read (jax/_src/lru_cache.py)
_PROGRAM_SUFFIX, _READ_TIME_SUFFIX = "-cache", "-atime"


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/cpplan/jax`, or `~/.cache/cpplan/jax` (the XDG default) where that is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cpplan" / "jax"


def use_compile_cache(enabled: bool = True) -> str:
    """Turns jax's persistent compilation cache on (in `$JAX_COMPILATION_CACHE_DIR` where set, else in
    `default_cache_dir()`; every program unless `$JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` says
    otherwise; pruned to `max_size_bytes()`) or, `enabled` False, off, for the compiles from now on.

    Returns:
        A line for the user saying where the cache is, or that it is off.
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    max_size = max_size_bytes() if enabled else -1  # a bad bound is refused before any setting changes
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
    removed, freed = prune(where, max_size)
    jax.config.update("jax_compilation_cache_max_size", -1)  # the bound is `prune`'s (its docstring says why)
    source = f"${CACHE_DIR_ENV}" if given else f"cpplan's default; ${CACHE_DIR_ENV} moves it"
    if max_size < 0:
        bound = f"no bound (${MAX_SIZE_ENV}=-1)"
    else:
        bound = f"kept to {max_size / 2**30:.3g} GiB at each start, the programs read least recently removed first"
        bound += f" (${MAX_SIZE_ENV})" if MAX_SIZE_ENV in os.environ else f" (${MAX_SIZE_ENV} changes it)"
        if removed:
            bound += f": {removed} removed now, {freed / 2**30:.2f} GiB"
    return f"compilation cache: {where} ({source}; {bound}; --no-compile-cache turns it off)"


def max_size_bytes() -> int:
    """The cache's bound: `$JAX_COMPILATION_CACHE_MAX_SIZE` where set (-1 for none), else `DEFAULT_MAX_SIZE_BYTES`."""
    given = os.environ.get(MAX_SIZE_ENV)
    if given is None:
        return DEFAULT_MAX_SIZE_BYTES
    try:
        size = int(given)
    except ValueError:
        size = None
    if size is None or size < -1:
        raise CpplanError(
            f"${MAX_SIZE_ENV}={given!r} is not a size: it is the bytes the compilation cache may hold, a whole "
            f"number (-1 for no bound); set one, or unset it for cpplan's {DEFAULT_MAX_SIZE_BYTES / 2**30:g} GiB"
        )
    return size


def prune(where: Path, max_size: int) -> tuple[int, int]:
    """Removes the cache's programs read least recently (by the file's access or modification time, whichever is later)
    until the rest hold at most `max_size` bytes; -1 removes none.

    At the start of a run rather than by jax's own bound (`jax_compilation_cache_max_size`): jax's bound
    fails every write to a directory holding a program that a process without the bound wrote (it finds no
    record of that program's last read), and MaxText's runs, the tests' and a user's own jax share it.

    Returns:
        How many programs were removed, and their bytes.
    """
    if max_size < 0 or not where.is_dir():
        return 0, 0
    programs = []
    for path in where.glob(f"*{_PROGRAM_SUFFIX}"):
        try:
            status = path.stat()
        except FileNotFoundError:  # removed by another process meanwhile
            continue
        programs.append((max(status.st_atime, status.st_mtime), status.st_size, path))
    held = sum(size for _, size, _ in programs)
    removed = freed = 0
    for _, size, path in sorted(programs):
        if held <= max_size:
            break
        path.unlink(missing_ok=True)
        path.with_name(path.name.removesuffix(_PROGRAM_SUFFIX) + _READ_TIME_SUFFIX).unlink(missing_ok=True)
        held -= size
        removed += 1
        freed += size
    return removed, freed


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
