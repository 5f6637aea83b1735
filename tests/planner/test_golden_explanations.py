"""Golden explanations: a change of plan or of its reasons shows up as a reviewed diff.

Regenerate on purpose with CPPLAN_REGENERATE_GOLDEN=1 pytest tests/planner/test_golden_explanations.py.
"""

import os
from pathlib import Path

import pytest

import planner

pytestmark = pytest.mark.pure
DATA = Path(__file__).resolve().parents[1] / "testdata"
CASES = {
    "llama3.1-8b_4M_v5p-256": ("llama3.1-8b", "4M", "v5p-256", {}),
    "llama3.1-8b_1M_tpu7x-128": ("llama3.1-8b", "1M", "tpu7x-128", {}),
    "llama3.1-8b_128k_v5p-16_one_sequence": ("llama3.1-8b", "128k", "v5p-16", {"global_batch_tokens": "128k"}),
    "llama3.1-70b_4M_v5p-16_nothing_fits": ("llama3.1-70b", "4M", "v5p-16", {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_explanation(name):
    model, seq_len, topology, options = CASES[name]
    text = str(planner.explain(model, seq_len, topology, **options)) + "\n"
    path = DATA / f"explain_{name}.txt"
    if os.environ.get("CPPLAN_REGENERATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path.name}; run with CPPLAN_REGENERATE_GOLDEN=1 once"
    assert text == path.read_text()
