"""The `expert` axis in the search and the plan: offered only to a model with experts, at the divisors of
its expert count, fixed by `mesh`; a plan with it round-trips through JSON, and plan JSON written before
the axis existed still loads (as expert=1)."""

import json

import pytest

from cost_models.errors import CpplanError
from cost_models.experts import Experts
from cost_models.models import MODELS, ModelSpec
from planner import explain
from planner.api import run_search
from planner.plan import Plan, make_mesh

pytestmark = pytest.mark.pure

# 2 layers, both mixture-of-experts: 8 routed experts of width 64, top 2
MOE = ModelSpec("tiny-moe", 2, 256, 4, 2, 64, 512, 1024, experts=Experts(8, 2, 64))
DENSE = ModelSpec("tiny-dense", 2, 256, 4, 2, 64, 512, 1024)


def expert_sizes(result) -> set[int]:
    return {sizes[-1] for sizes in result.ranked.mesh_sizes()}


def test_the_search_offers_expert_only_to_a_model_with_experts():
    assert expert_sizes(run_search(DENSE, 2048, "v5p:2x2x2", global_batch=16, target="maxtext")) == {1}
    # 8 devices: every divisor of 8 experts, on MaxText, which runs the axis as expert parallelism
    assert expert_sizes(run_search(MOE, 2048, "v5p:2x2x2", global_batch=16, target="maxtext")) == {1, 2, 4, 8}
    # cpplan's runtime runs every expert on every device: the axis stays one device, and fixing it is refused
    assert expert_sizes(run_search(MOE, 2048, "v5p:2x2x2", global_batch=16)) == {1}
    with pytest.raises(CpplanError, match="mesh expert=4: cpplan's runtime runs every expert on every device"):
        run_search(MOE, 2048, "v5p:2x2x2", global_batch=16, mesh={"expert": 4})


def test_a_fixed_expert_axis_and_its_rules():
    on_maxtext = {"global_batch": 16, "target": "maxtext"}
    assert expert_sizes(run_search(MOE, 2048, "v5p:2x2x2", mesh={"expert": 4}, **on_maxtext)) == {4}
    with pytest.raises(CpplanError, match="expert=2: model 'tiny-dense' has no experts"):
        run_search(DENSE, 2048, "v5p:2x2x2", mesh={"expert": 2}, **on_maxtext)
    six = ModelSpec("six-experts", 2, 256, 4, 2, 64, 512, 1024, experts=Experts(6, 2, 64))
    with pytest.raises(CpplanError, match="expert=4 does not divide num_experts=6"):
        run_search(six, 2048, "v5p:2x2x2", mesh={"expert": 4}, **on_maxtext)
    assert expert_sizes(run_search(six, 2048, "v5p:2x2x2", **on_maxtext)) <= {1, 2}


def test_a_plan_with_expert_parallelism_round_trips_through_json():
    plan = Plan(MOE, "v5p:2x2x2", 2048, 16, make_mesh(fsdp=2, expert=4))
    assert plan.mesh_dict["expert"] == 4 and plan.batch_shards == 8
    assert Plan.from_json(plan.to_json()) == plan
    plan.check()
    with pytest.raises(CpplanError, match="not divisible by data×fsdp×expert=8"):
        Plan(MOE, "v5p:2x2x2", 2048, 12, make_mesh(fsdp=2, expert=4)).check()
    with pytest.raises(CpplanError, match="has no experts"):
        Plan(DENSE, "v5p:2x2x2", 2048, 16, make_mesh(fsdp=2, expert=4)).check()


def test_plan_json_written_before_the_axis_loads_as_one_expert_device():
    plan = Plan(MODELS["llama3.1-8b"], "v5p:2x2x2", 8192, 4, make_mesh(fsdp=2, context=4))
    row = plan.to_dict()
    row["mesh"] = {a: s for a, s in row["mesh"].items() if a != "expert"}
    row["axis_order"] = [a for a in row["axis_order"] if a != "expert"]
    old = Plan.from_json(json.dumps(row))
    assert old.mesh_dict == plan.mesh_dict and old.mesh_dict["expert"] == 1
    assert old.segments() == plan.segments()


def test_explain_says_why_the_expert_axis_has_its_size():
    text = explain(MOE, 2048, "v5p:2x2x2", global_batch=16).why_text()
    assert "Expert parallelism: " in text
    assert "expert=" in text
    dense = explain(DENSE, 2048, "v5p:2x2x2", global_batch=16)
    assert "Expert parallelism" not in dense.why_text() and "expert=" not in str(dense)


def test_a_plan_built_in_code_before_the_axis_keeps_working():
    plan = Plan(
        MODELS["llama3.1-8b"],
        "v5p:2x2x2",
        8192,
        4,
        tuple((a, s) for a, s in make_mesh(fsdp=2, context=4) if a != "expert"),
        axis_order=("data", "fsdp", "tensor", "context_ulysses", "context"),
    )
    assert plan.mesh_dict["expert"] == 1 and plan.axis_order[0] == "expert"
    assert plan == Plan.from_json(plan.to_json())
