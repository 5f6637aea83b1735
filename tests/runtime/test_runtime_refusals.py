"""cpplan's runtime refuses, by name, plans it would otherwise run as something else: fp8 matmuls, gradients
cast from the parameters' dtype, a one-hot embedding lookup, and MaxText's dense capacity path."""

import dataclasses

import pytest

pytest.importorskip("jax")

from cost_models.errors import CpplanError  # noqa: E402
from planner import explain  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from runtime.train import Trainer  # noqa: E402

pytestmark = pytest.mark.cpu_mesh


@pytest.mark.parametrize(
    "change, says",
    [
        ({"quantization": "fp8_full"}, "quantization=fp8_full"),
        ({"grad_dtype": "bfloat16"}, "grad_dtype='bfloat16'"),
        ({"one_hot_embedding": True}, "one_hot_embedding=True"),
    ],
)
def test_plans_the_runtime_would_run_otherwise_are_refused(change, says):
    plan = dataclasses.replace(explain("tiny", "1k", "cpu:8").best, **change)
    with pytest.raises(CpplanError, match=says) as refused:
        Trainer(plan, build_mesh(plan))
    assert "export it to MaxText" in str(refused.value)


def test_a_capacity_plan_is_refused():
    plan = dataclasses.replace(explain("tiny-moe", "1k", "cpu:8").best, expert_capacity=1.25)
    with pytest.raises(CpplanError, match="expert_capacity=1.25"):
        Trainer(plan, build_mesh(plan))
