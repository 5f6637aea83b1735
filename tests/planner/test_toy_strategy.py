"""A strategy registered in one place is found wherever strategies are listed: the search, the
explanation, the CLI, the plan's JSON and the MaxText export's refusal (its runtime conformance is
in tests/runtime/test_conformance.py)."""

import dataclasses

import pytest
from toy_strategy import NAME, registered_toy

import planner
from cost_models.errors import CpplanError
from cost_models.vocabulary import CPStrategy
from planner import Plan
from planner.estimate import estimate
from planner.maxtext import export_maxtext

pytestmark = pytest.mark.pure


def test_a_registered_strategy_is_searched_explained_listed_and_refused_by_maxtext():
    with registered_toy() as toy:
        assert toy in list(CPStrategy) and CPStrategy.parse(NAME) is toy
        explanation = planner.explain("llama3.1-8b", "128k", "v5p-16", strategies=[NAME], global_batch_tokens="128k")
        plan = explanation.best
        assert plan.cp_strategy is toy and "toy gather over context=" in str(explanation)
        # all-gather's price under another name; how much of its traffic hides is read from
        # compiled programs per strategy (cost_models/data/overlap.json), which it has none of yet
        ours, twin = estimate(plan), estimate(dataclasses.replace(plan, cp_strategy=CPStrategy.ALL_GATHER))
        assert (ours.compute_s, ours.comm_s, ours.hbm_bytes) == (twin.compute_s, twin.comm_s, twin.hbm_bytes)
        assert Plan.from_json(plan.to_json()) == plan
        from cli import build_parser

        assert NAME in build_parser()._subparsers._group_actions[0].choices["explain"].format_help()
        with pytest.raises(CpplanError, match=f"MaxText 0.2.5 has no {NAME} strategy"):
            export_maxtext(plan)
        # the MaxText target never offers it
        assert (
            planner.explain(
                "llama3.1-8b", "128k", "v5p-16", strategies=[NAME], target="maxtext", global_batch_tokens="128k"
            ).best
            is None
        )
    assert NAME not in [s.value for s in CPStrategy]
