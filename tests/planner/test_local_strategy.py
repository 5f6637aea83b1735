"""A strategy per kind of layer: a model mixing local and global layers may run its local layers under
their own strategy on the plan's mesh (`Plan.local_strategy`), priced kind by kind, searched, explained,
and refused where MaxText must run it."""

import dataclasses
import json

import pytest

import planner
from cost_models.errors import CpplanError
from cost_models.models import get_model
from cost_models.pricing.step import price_layer_kinds
from cost_models.targets import Target
from planner.estimate import candidates_of, estimate
from planner.maxtext import export_maxtext
from planner.plan import Plan, make_mesh

pytestmark = pytest.mark.pure

GEMMA = get_model("gemma3-12b")  # 8 global causal layers, 40 of a 1K window


def gemma_plan(strategy="all_gather", local_strategy="ring", model=GEMMA, **changes):
    return Plan(
        model=model,
        topology="v5p:2x2x2",
        seq_len=128 * 1024,
        global_batch=1,
        mesh=make_mesh(context=8),
        cp_strategy=strategy,
        local_strategy=local_strategy,
        remat="full",
        **changes,
    )


def test_each_kind_of_layer_runs_its_strategy():
    plan = gemma_plan()
    assert [plan.strategy_for(mask).value for mask, _ in GEMMA.layer_masks] == ["all_gather", "ring"]
    single = dataclasses.replace(plan, local_strategy=None)
    assert [single.strategy_for(mask).value for mask, _ in GEMMA.layer_masks] == ["all_gather", "all_gather"]
    assert (plan.strategy_label, single.strategy_label) == ("all_gather+ring(local)", "all_gather")
    assert Plan.from_json(plan.to_json()) == plan
    assert json.loads(plan.to_json())["local_strategy"] == "ring"
    assert "local_strategy" not in json.loads(gemma_plan(local_strategy=None).to_json())


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(model=get_model("llama3.1-8b")), "one kind of layer"),
        (dict(model=get_model("mistral-7b-v0.1")), "one kind of layer"),
        (dict(local_strategy="all_gather"), "is cp_strategy already"),
        (dict(local_strategy="hops"), "hops"),
    ],
)
def test_a_local_strategy_that_cannot_be_is_refused(changes, words):
    with pytest.raises(CpplanError, match=words):
        gemma_plan(**changes)


def test_a_local_strategy_the_mesh_cannot_run_is_refused_by_check():
    plan = gemma_plan(local_strategy="ulysses")  # Ulysses needs the context_ulysses axis
    with pytest.raises(CpplanError, match="local_strategy=ulysses cannot run this plan's local layers"):
        plan.check()


def test_each_kind_is_priced_under_its_own_strategy():
    """The mixed plan's layer kinds are the single-strategy plans' kinds, and its attention their
    share-weighted sum over the layers."""
    mixed = price_layer_kinds(candidates_of(gemma_plan()), Target.CPPLAN)
    gathered = price_layer_kinds(candidates_of(gemma_plan(local_strategy=None)), Target.CPPLAN)
    ring = price_layer_kinds(candidates_of(gemma_plan("ring", None)), Target.CPPLAN)
    assert [k.share for k in mixed] == [8 / 48, 40 / 48]
    assert [k.strategy.name for k in mixed] == ["all_gather", "ring"]
    assert mixed[0].attention.total_s[0] == gathered[0].attention.total_s[0]
    assert mixed[1].attention.total_s[0] == ring[1].attention.total_s[0]
    assert mixed[1].cost.backward_s[0] == ring[1].cost.backward_s[0]
    attention = estimate(gemma_plan()).compute_s["attention"]
    want = 48 * (8 / 48 * gathered[0].attention.total_s[0] + 40 / 48 * ring[1].attention.total_s[0])
    assert attention == pytest.approx(want, rel=1e-12)
    # the ring's one hop for a 1K window moves less than gathering every rank's K/V
    assert ring[1].cost.forward_s[0] < gathered[1].cost.forward_s[0]


def test_the_search_takes_a_local_strategy_where_it_is_faster_and_prices_it_as_the_plan():
    e = planner.explain("gemma3-12b", "1M", "v5p-256", strategies=("ring", "all_gather"))
    best = e.best
    assert (best.cp_strategy.value, best.local_strategy.value) == ("all_gather", "ring")
    assert e.estimate.step_time_s == pytest.approx(estimate(best).step_time_s, rel=1e-9)
    assert e.estimate.hbm_bytes_per_device == pytest.approx(estimate(best).hbm_bytes_per_device, rel=1e-9)
    one = estimate(dataclasses.replace(best, local_strategy=None)).step_time_s
    assert one > e.estimate.step_time_s
    assert f"ring over context={dict(best.mesh)['context']} (local layers)" in str(e)
    assert e.to_dict()["local_layers"]["one_strategy"] == {"strategy": "all_gather", "step_time_s": one}


def test_maxtext_runs_one_strategy_for_every_layer():
    with pytest.raises(CpplanError, match="one context_parallel_strategy for every layer"):
        export_maxtext(gemma_plan())
    with pytest.raises(CpplanError, match="one context_parallel_strategy for every layer"):
        estimate(gemma_plan(), target="maxtext")
    # the MaxText target's search never offers one
    e = planner.explain("gemma3-12b", "1M", "v5p-256", strategies=("ring", "all_gather"), target="maxtext")
    assert all(r.plan.local_strategy is None for r in e.result.ranked[:50])
