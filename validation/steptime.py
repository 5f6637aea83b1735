"""Step-time validation: price the feasible plans, run a selection of them, compare.

The selection: the planner's top K, the best plan of every strategy, then a seeded sample of
the rest, up to `max_plans` per sequence length, each also with the splash blocks and attention
backwards asked for (`plan_variants`). Runs go one after another under a progress
bar, each result appended to a journal file as it finishes; Ctrl-C (and SIGTERM, which the CLI
turns into it) stops them keeping what was measured.
"""

from __future__ import annotations

import dataclasses
import gc
import random
from collections.abc import Callable, Sequence

from tqdm import tqdm

from cost_models.errors import CpplanError
from cost_models.units import mfu
from planner.api import run_search
from planner.estimate import estimate
from planner.search import Ranked
from validation.measured import MeasuredStep
from validation.outputs import append_record
from validation.report import StepResult, StepTimeReport


def select_plans(ranked: Sequence[Ranked], *, max_plans: int, top: int, seed: int) -> list[Ranked]:
    """The plans to run at one length.

    Args:
        ranked: feasible plans, best predicted first.
        max_plans: at most this many.
        top: the planner's top K first.
        seed: seeds the sample of the rest.
    Returns:
        Top `top`, then the best of each strategy not yet in, then a seeded random sample.
    """
    chosen: list[Ranked] = list(ranked[:top])
    for r in ranked:
        if r.plan.cp_strategy not in {c.plan.cp_strategy for c in chosen}:
            chosen.append(r)
    rest = [r for r in ranked if r not in chosen]
    random.Random(seed).shuffle(rest)
    chosen += rest[: max(0, max_plans - len(chosen))]
    return chosen[:max_plans]


def plan_variants(ranked: Ranked, *, blocks: Sequence[int] = (), both_backwards: bool = False) -> list[Ranked]:
    """`ranked` and the same plan with each of `blocks` as its splash blocks and, where `both_backwards`,
    with the other attention backward (splash's fused kernel or its dq and dK/dV kernels): each that its
    strategy runs and the price says fits, priced as it is, `ranked` first."""
    plan = ranked.plan
    out = [ranked]
    backwards = (plan.fused_attention_backward, not plan.fused_attention_backward)[: 2 if both_backwards else 1]
    for block in dict.fromkeys((plan.block_q, *blocks)):
        for fused in backwards:
            if (block, fused) == (plan.block_q, plan.fused_attention_backward):
                continue
            try:
                variant = dataclasses.replace(plan, block_q=block, block_kv=block, fused_attention_backward=fused)
                priced = estimate(variant)
            except CpplanError:  # a block the lengths or the chip's memories refuse
                continue
            if priced.fits:
                out.append(Ranked(variant, priced))
    return out


def choose_plans(
    model,
    seq_lens: Sequence,
    topology: str,
    *,
    sequences: int = 1,
    max_plans: int = 16,
    top: int = 3,
    seed: int = 0,
    blocks: Sequence[int] = (),
    both_backwards: bool = False,
    **options,
) -> list[Ranked]:
    """The plans `validate_step_times` runs, chosen without jax: a TPU's compiler flags (the scoped VMEM
    the chosen splash blocks need) must be set before jax starts its backend. Each chosen plan is run
    with its `plan_variants` too.

    Raises:
        CpplanError: no plan fits at one of the lengths.
    """
    plans = []
    for seq_len in seq_lens:
        result = run_search(model, seq_len, topology, global_batch=sequences, **options)
        if not result.ranked:
            raise CpplanError(
                f"no plan fits {result.model.name} at {seq_len} tokens on {result.topology.name}; "
                "see `cpplan explain` for why."
            )
        for ranked in select_plans(result.ranked, max_plans=max_plans, top=top, seed=seed):
            plans += plan_variants(ranked, blocks=blocks, both_backwards=both_backwards)
    return plans


def validate_step_times(
    model,
    seq_lens: Sequence,
    topology: str,
    *,
    sequences: int = 1,
    max_plans: int = 16,
    top: int = 3,
    steps: int = 3,
    seed: int = 0,
    data=None,
    journal=None,
    stop: "Callable[[], bool] | None" = None,
    plans: "Sequence[Ranked] | None" = None,
    **options,
) -> StepTimeReport:
    """Runs a selection of feasible plans per sequence length and compares with their prices.

    Args:
        model, topology, **options: as for `planner.explain` (but global_batch_tokens).
        seq_lens: lengths to validate.
        sequences: sequences per step at every length.
        max_plans / top / seed: the selection (see `select_plans`).
        steps: steps per run; the measured step time is the fastest after the first (the median is kept too).
        data: text file for the runs (synthetic tokens when None).
        journal: a file each plan's result is appended to (one JSON line) as soon as it is
            measured, so that a killed run keeps them; None keeps them in memory only.
        stop: asked after each step; True abandons the plan in hand (kept as a failure that says so)
            and ends the run as an interrupt does (the CLI's signal
            handler sets it rather than raising inside jax).
        plans: the plans to run (`choose_plans`' answer); None chooses them here.
    Returns:
        A `StepTimeReport`; interrupted runs keep what was measured (``interrupted=True``).
    Raises:
        CpplanError: no plan fits at one of the lengths.
    """
    from runtime import run

    if plans is None:
        plans = choose_plans(
            model, seq_lens, topology, sequences=sequences, max_plans=max_plans, top=top, seed=seed, **options
        )
    report = StepTimeReport(f"Step-time validation: {plans[0].plan.model.name} on {plans[0].plan.topology}")
    progress = tqdm(plans, desc="validate", unit="plan")
    try:
        for ranked in progress:
            progress.set_postfix_str(f"{ranked.plan.strategy_label} seq {ranked.plan.seq_len}")
            result = StepResult(ranked.plan, ranked.estimate)
            abandoned = False
            try:
                measured = run(ranked.plan, steps=steps, data=data, seed=seed, should_stop=stop or (lambda: False))
                abandoned = measured.stopped  # the plan in hand is abandoned, not measured on fewer steps
                if abandoned:
                    result.failure = f"abandoned: interrupted after {len(measured.step_times_s)} of {steps} steps"
                else:
                    result.measured_step_s = measured.best_step_s
                    result.measured_median_s = measured.step_time_s
                    result.measured_mfu = measured_mfu(ranked.estimate, measured.best_step_s)
            except Exception as err:  # one plan's failure (a compile, HBM) is its result; the next is measured
                result.failure = failure_reason(err)
                gc.collect()  # the failed plan's arrays and executables, before the next plan allocates
            report.results.append(result)
            if journal is not None:
                append_record(journal, result.to_dict())
            if stop is not None and stop():
                # interrupted only if plans were left unmeasured
                report.interrupted = abandoned or len(report.results) < len(plans)
                break
    except KeyboardInterrupt:
        report.interrupted = True
    finally:
        progress.close()
    return report


def measured_mfu(predicted, step_s: float) -> float:
    """MFU of a measured step against the same chip row's peak the prediction used."""
    return mfu(predicted.model_flops, step_s, predicted.num_devices, predicted.peak_flops_per_device)


def compare_measured(steps: Sequence[MeasuredStep]) -> StepTimeReport:
    """Predictions for step times measured elsewhere (a CSV, or a MaxText run).

    Args:
        steps: the imported measurements.
    Returns:
        A `StepTimeReport` with one row per measurement.
    """
    report = StepTimeReport("Predicted vs imported measurements")
    for s in steps:
        e = estimate(s.plan)
        report.results.append(StepResult(s.plan, e, s.step_seconds, measured_mfu(e, s.step_seconds), source=s.source))
    return report


FAILURE_CHARS = 400  # a compiler's message runs to pages; the report keeps its gist


def failure_reason(err: BaseException) -> str:
    """Why a plan was not measured, in one line: cpplan's own refusal as it stands, or the compiler's
    or runtime's error classed as scoped VMEM, HBM or another failure, with its first line."""
    if isinstance(err, CpplanError):
        return str(err)
    text = str(err).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(err).__name__)
    if "ScopedVmem" in text or "scoped allocation" in text.lower():
        kind = "does not compile: splash's scoped VMEM exceeds the compiler's limit"
    elif "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower() or "HbmOom" in text:
        kind = "out of memory"
    else:
        kind = f"failed ({type(err).__name__})"
    detail = first if len(first) <= FAILURE_CHARS else first[: FAILURE_CHARS - 1] + "…"
    return f"{kind}: {detail}"
