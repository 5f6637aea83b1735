"""The planner's examples run as a new user runs them."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure
ROOT = Path(__file__).resolve().parents[1]
# the scripts import this checkout's packages, not whichever copy is installed
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize("script, words", [
    ("explain_long_context.py", ["v5p-256", "tpu7x-128", "8M", "MFU"]),
    ("strategy_crossover.py", ["seq_len", "ring", "nothing fits"]),
    ("maxtext_config.py", ["your config", "cpplan's plan", "ici_context_parallelism="]),
])
def test_example_runs(script, words):
    out = subprocess.run([sys.executable, str(ROOT / "examples" / script)], capture_output=True, text=True,
                         check=True, cwd=ROOT, env=ENV).stdout
    for w in words:
        assert w in out
