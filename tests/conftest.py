"""Test set-up: the shared helpers importable from every folder, and 8 virtual CPU devices, set before
anything imports jax (the cpu_mesh tier).

The tests live in one folder per layer (cost_models/, planner/, runtime/, validation/, cli/); the
helpers they share (small_candidates.py, runtime_steps.py, bounded_work.py) and testdata/ stay
here, and this directory goes on sys.path so that a test imports a helper by its module name
(`from small_candidates import one_candidate`) from any folder.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

from runtime.compile import COMPILER_ARGS_VARIABLES  # noqa: E402  (imports no jax)

TPU_COMPILING_MODULES = pytest.StashKey[set]()
# the TPU compiler flags the test run started with (each in-process compile adds cpplan's own to the process's)
STARTING_COMPILER_ARGS = {name: os.environ.get(name) for name in COMPILER_ARGS_VARIABLES}


def pytest_collection_modifyitems(config, items):
    config.stash[TPU_COMPILING_MODULES] = {
        item.module.__name__ for item in items if item.get_closest_marker("tpu_compile")
    }


@pytest.fixture(scope="module", autouse=True)
def cpu_programs_at_lowest_optimisation(request):
    """A module of the cpu_mesh tier that compiles nothing for a TPU runs its programs as XLA builds them at
    its lowest optimisation level (`jax_disable_most_optimizations`): the same computation, built in a fifth to
    a third less time on the tests' small shapes, where XLA's optimisation passes are most of a program's
    wall time. A module compiling for a TPU keeps the compiler's full passes (their programs' memory and
    schedule are what its tests read), and so does one marked full_optimisation (a resumed run compared bit
    for bit with an uninterrupted one: at the lowest level the curves parted after a restart). Module-scoped
    and autouse, so set before the module's own fixtures."""
    jax = sys.modules.get("jax")
    cpu_only = (
        request.node.get_closest_marker("cpu_mesh")
        and not request.node.get_closest_marker("full_optimisation")
        and request.module.__name__ not in request.config.stash.get(TPU_COMPILING_MODULES, set())
    )
    if jax is None or not cpu_only:
        yield
        return
    # the module's child processes (`cpplan run` and the like) build theirs alike: a test comparing their
    # losses with this process's exactly needs the same programs
    before = jax.config.read("jax_disable_most_optimizations")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")  # jax's environment variable for the option
        jax.config.update("jax_disable_most_optimizations", True)
        try:
            yield
        finally:
            jax.config.update("jax_disable_most_optimizations", before)


@pytest.fixture(autouse=True)
def compiler_flags_as_the_run_started(monkeypatch):
    """Each test starts with LIBTPU_INIT_ARGS and cpplan's record of them as the test run started, whatever
    chip an earlier test of its worker compiled for in-process (which writes them), and leaves them so: a
    child compile or a test reading the flags sees its own set-up only."""
    for name, value in STARTING_COMPILER_ARGS.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
