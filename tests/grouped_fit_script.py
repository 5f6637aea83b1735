"""regenerate/fit_grouped_matmul.py loaded as a module (a script, not a package's), for the tests that check
its fit and the chip rows it writes."""

import importlib.util
import sys
from pathlib import Path


def grouped_fit_script():
    """The grouped-matmul fit script as a module."""
    path = Path(__file__).resolve().parents[1] / "regenerate" / "fit_grouped_matmul.py"
    spec = importlib.util.spec_from_file_location("fit_grouped_matmul", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
