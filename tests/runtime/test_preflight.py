"""cpu_mesh tier: the pre-flight compiles the planner's plans best first and moves past a plan
whose compiled step does not fit, saying why."""

import pytest

jax = pytest.importorskip("jax")

from cost_models.errors import CpplanError  # noqa: E402
from planner import api  # noqa: E402
from runtime.preflight import preflight  # noqa: E402

pytestmark = pytest.mark.cpu_mesh


def test_a_plan_over_the_memory_moves_to_the_next_and_says_why():
    plans = [r.plan for r in api.run_search("tiny", "1k", "cpu:8").ranked[:2]]
    seen = []
    with pytest.raises(CpplanError, match="none of the planner's first 2 plans compiles and fits") as err:
        preflight(plans, devices=jax.devices(), available_bytes=1024, on_attempt=seen.append)
    assert [a.rank for a in seen] == [1, 2] and [a.plan for a in seen] == plans  # the second was tried
    for attempt in seen:
        assert not attempt.fits and attempt.required_bytes > 1024 and attempt.compile_s > 0
        assert "the compiled step holds" in attempt.reason and "MiB, over 0.00 MiB" in attempt.reason
    assert str(err.value).count("does not fit") == 2
    # with the chip row's memory the best plan passes, and its compiled step is the one kept
    passed = preflight(plans, devices=jax.devices())
    assert [a.rank for a in passed.attempts] == [1] and passed.plan == plans[0] and passed.compiled is not None
    assert passed.memory.hbm_bytes_per_device == passed.attempts[0].required_bytes
