"""tpu_compile tier: a model with a full (non-causal) mask compiles deviceless for a TPU slice with the
all-gather strategy (each device's 1024 queries against all 4096 keys), and fits. The kernel calls'
masks are checked on the CPU mesh (tests/test_full_mask_runtime.py)."""
import dataclasses

import pytest

pytest.importorskip("jax")
pytest.importorskip("libtpu")

from cost_models.models import get_model  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from runtime.compile import compile_for  # noqa: E402

pytestmark = pytest.mark.tpu_compile


def test_full_mask_all_gather_compiles_for_tpu():
    encoder = dataclasses.replace(get_model("tiny"), name="tiny-encoder", causal=False)
    plan = Plan(model=encoder, topology="v5p:2x2x1", seq_len=4096, global_batch=1, mesh=make_mesh(context=4),
                cp_strategy="all_gather", block_q=256, block_kv=256, loss_chunk_tokens=256)
    report = compile_for(plan)
    assert report.fits and report.temp_bytes > 0
