"""`cpplan` in a child process as a terminal runs it, for the tests that signal, kill or resume it."""

import os
import subprocess
import sys
from pathlib import Path

# Ctrl-C as in a terminal, even where the test runner's parent ignores SIGINT (a background job);
# the child restores it itself, so the runner (with jax's threads) spawns rather than forks
_AS_FROM_A_TERMINAL = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv = ['cpplan', *sys.argv[1:]]; runpy.run_module('cli', run_name='__main__')"
)


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
