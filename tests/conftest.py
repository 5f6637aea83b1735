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
