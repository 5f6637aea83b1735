"""The search's short cut: memory, host bytes and the rules read no links, so it prices each candidate's shape
first and times at every placement only the candidates that may fit. The result must be the one that timing
every candidate at every placement gives: the same plans in the same order with the same estimates, the same
rejections with the same numbers, the same least-memory plan of each strategy, from fewer rows timed."""

import math

import pytest

from planner import search
from planner.api import run_search

pytestmark = pytest.mark.pure


def _search(monkeypatch, shapes_first: bool, *args, **options):
    """The search with its candidates' shapes priced first (from any number of placements) or never, and the
    rows it timed."""
    monkeypatch.setattr(search, "SHAPES_FIRST", 0 if shapes_first else math.inf)
    timed, placed = [], search.SearchSpace._placed

    def counted(self, strategy, group, chosen):
        out = placed(self, strategy, group, chosen)
        timed.append(len(out.candidate))
        return out

    monkeypatch.setattr(search.SearchSpace, "_placed", counted)
    return run_search(*args, **options), sum(timed)


@pytest.mark.parametrize(
    "model, seq_len, topology, target",
    [
        ("mixtral-8x7b", "32k", "v5p-64", "maxtext"),  # MaxText's kernels: memory alone decides every candidate
        ("llama3.1-8b", "1M", "v5p-64", "cpplan"),  # both backward kernels: where both fit, the step time chooses
        ("llama3.1-70b", "4M", "v5p-16", "cpplan"),  # nothing fits: each strategy's least-memory plan timed alone
    ],
)
def test_shapes_first_finds_what_timing_every_placement_finds(monkeypatch, model, seq_len, topology, target):
    first, timed_first = _search(monkeypatch, True, model, seq_len, topology, target=target)
    every, timed_every = _search(monkeypatch, False, model, seq_len, topology, target=target)
    assert timed_first < timed_every
    assert (first.global_batch, first.candidates_priced) == (every.global_batch, every.candidates_priced)
    assert [(r.plan, r.estimate) for r in first.ranked] == [(r.plan, r.estimate) for r in every.ranked]
    assert first.rejections == every.rejections
    assert [(r.plan, r.estimate) for r in first.best_infeasible] == [
        (r.plan, r.estimate) for r in every.best_infeasible
    ]
    if model == "llama3.1-70b":
        assert not first.ranked and first.best_infeasible
    else:
        assert first.ranked and any(r.category == "hbm" for r in first.rejections)
