"""Pure tier: explain says how many of a device's TensorCores the chosen plan's splash backward keeps busy
on each runtime (v5p's megacore), with the plan's step on the other runtime; nothing on one-core chips."""

import pytest

import planner
from cost_models.targets import Target

pytestmark = pytest.mark.pure


def test_one_sequence_a_v5p_device_keeps_one_core_busy_on_maxtext_and_two_on_cpplan():
    e = planner.explain("llama3.1-8b", "4M", "v5p-256")  # 4M tokens a step: one sequence on every device
    cores = e.to_dict()["backward_cores"]
    assert cores["sequences_per_device"] == 1 and cores["cores_per_device"] == 2
    assert cores["busy_cores"] == {"cpplan": 2.0, "maxtext": 1.0}
    assert cores["other_step_time_s"] == pytest.approx(planner.estimate(e.best, target=Target.MAXTEXT).step_time_s)
    assert cores["other_step_time_s"] > cores["step_time_s"]
    assert "2× the sequences per device would keep all 2 busy on both" in str(e)


def test_a_one_core_chip_says_nothing_of_cores():
    e = planner.explain("llama3.1-8b", "128k", "v5e:4x4")
    assert e.to_dict()["backward_cores"] is None and "TensorCores" not in str(e)
