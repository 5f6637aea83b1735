"""Step-time validation: price the feasible plans, run a selection of them, compare.

The selection: the planner's top K, the best plan of every strategy, then a seeded sample of
the rest, up to `max_plans` per sequence length. Runs go one after another; a progress line
shows where it is, and Ctrl-C stops it keeping what was measured.
"""
from __future__ import annotations

import random
import sys
import time
from collections.abc import Sequence

from cost_models.errors import CpplanError
from planner.api import run_search
from planner.options import parse_seq_len
from planner.search import Ranked
from runtime.validation.measured import MeasuredStep
from runtime.validation.report import StepResult, StepTimeReport


def select_plans(ranked: Sequence[Ranked], *, max_plans: int, top: int, seed: int) -> list[Ranked]:
    """Top `top`, the best of each strategy, then a seeded random sample, at most `max_plans`."""
    chosen: list[Ranked] = list(ranked[:top])
    for r in ranked:
        if r.plan.cp_strategy not in {c.plan.cp_strategy for c in chosen}:
            chosen.append(r)
    rest = [r for r in ranked if r not in chosen]
    random.Random(seed).shuffle(rest)
    chosen += rest[: max(0, max_plans - len(chosen))]
    return chosen[:max_plans] if len(chosen) > max_plans else chosen


def _progress(done: int, total: int, label: str, started: float) -> None:
    width = 24
    filled = width * done // max(total, 1)
    elapsed = time.perf_counter() - started
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {elapsed:5.0f}s {label[:60]:<60}")
    sys.stderr.flush()


def validate_step_times(model, seq_lens: Sequence, topology: str, *, sequences: int = 1, max_plans: int = 16,
                        top: int = 3, steps: int = 3, seed: int = 0, data=None, **options) -> StepTimeReport:
    """Runs a selection of feasible plans per sequence length and compares with their prices.

    Args:
        model, topology, **options: as for `planner.explain` (but global_batch_tokens).
        seq_lens: lengths to validate.
        sequences: sequences per step at every length.
        max_plans / top / seed: the selection (see `select_plans`).
        steps: steps per run; the measured step time is the fastest after the first (the median is kept too).
        data: text file for the runs (synthetic tokens when None).
    Returns:
        A `StepTimeReport`; interrupted runs keep what was measured (``interrupted=True``).
    """
    from runtime import run

    plans = []
    for seq_len in seq_lens:
        result = run_search(model, seq_len, topology, global_batch_tokens=parse_seq_len(seq_len) * sequences,
                            **options)
        if not result.ranked:
            raise CpplanError(f"no plan fits {result.model.name} at {seq_len} tokens on {result.topology.name}; "
                              "see `cpplan explain` for why.")
        plans += select_plans(result.ranked, max_plans=max_plans, top=top, seed=seed)
    report = StepTimeReport(f"Step-time validation: {plans[0].plan.model.name} on {plans[0].plan.topology}")
    started = time.perf_counter()
    try:
        for i, ranked in enumerate(plans):
            _progress(i, len(plans), f"{ranked.plan.cp_strategy.value} seq {ranked.plan.seq_len}", started)
            result = StepResult(ranked.plan, ranked.estimate)
            try:
                measured = run(ranked.plan, steps=steps, data=data, seed=seed)
                result.measured_step_s = measured.best_step_s
                result.measured_median_s = measured.step_time_s
                result.measured_mfu = ranked.estimate.model_flops / (measured.best_step_s *
                                                                     ranked.estimate.num_devices *
                                                                     ranked.estimate.peak_flops_per_device)
            except CpplanError as err:
                result.failure = str(err)
            report.results.append(result)
        _progress(len(plans), len(plans), "done", started)
    except KeyboardInterrupt:
        report.interrupted = True
    sys.stderr.write("\n")
    return report


def compare_measured(steps: Sequence[MeasuredStep]) -> StepTimeReport:
    """Predictions for step times measured elsewhere (a CSV, or a MaxText run)."""
    from cost_models.estimate import estimate

    report = StepTimeReport("Predicted vs imported measurements")
    for s in steps:
        e = estimate(s.plan)
        mfu = e.model_flops / (s.step_seconds * e.num_devices * e.peak_flops_per_device)
        report.results.append(StepResult(s.plan, e, s.step_seconds, mfu, source=s.source))
    return report
