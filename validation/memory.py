"""Memory validation: predicted HBM per device against the XLA TPU compiler's, deviceless.

Real model shapes with fewer layers (compile time grows with layers; memory per layer is
uniform, so a layer count that compiles in seconds checks the same formulas). Every plan is
compared at the same reduced layer count in the prediction and in the compiler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tqdm import tqdm

from cost_models.errors import CpplanError
from cost_models.models import get_model
from planner.api import run_search
from planner.estimate import estimate
from validation.report import MemoryReport, MemoryResult


def validate_memory(
    model,
    seq_lens: Sequence,
    topologies: Sequence[str],
    *,
    layers: int = 2,
    per_strategy: int = 1,
    sequences: int = 1,
    **options,
) -> MemoryReport:
    """Compiles the best plan of each strategy per (topology, length) and compares memory.

    Args:
        model: a model; its layer count is reduced to `layers`.
        seq_lens / topologies: the cases, with `sequences` sequences per step.
        layers: decoder layers compiled (and predicted).
        per_strategy: how many plans of each strategy, best first.
    Returns:
        A `MemoryReport`; a plan of which the compiler makes no program (it refuses it for another
        reason than HBM, e.g. a kernel over its VMEM, or ends its process on a failed check: each plan
        compiles in a child process) is kept as a failure saying so, with the compiler's line.
    """
    from runtime.compile import compile_in_child

    spec = get_model(model)
    reduced = dataclasses.replace(spec, name=f"{spec.name}-{layers}l", num_layers=layers)
    report = MemoryReport(f"HBM per device: cpplan vs the XLA TPU compiler ({spec.name}, {layers} layers)")
    plans = []
    for topology in topologies:
        for seq_len in seq_lens:
            result = run_search(reduced, seq_len, topology, global_batch=sequences, **options)
            picked = []
            for strategy in {r.plan.cp_strategy for r in result.ranked}:
                picked += [r for r in result.ranked if r.plan.cp_strategy is strategy][:per_strategy]
            picked += result.best_infeasible[:1]  # the compiler should refuse it too
            plans += [r.plan for r in sorted(picked, key=lambda r: (r.plan.cp_strategy.value, r.estimate.step_time_s))]
    progress = tqdm(plans, desc="compile", unit="plan")
    for plan in progress:
        progress.set_postfix_str(f"{plan.topology} {plan.cp_strategy.value} seq {plan.seq_len}")
        try:
            compiled = compile_in_child(plan)
        except CpplanError as err:
            report.results.append(MemoryResult(plan, estimate(plan), None, False, failure=str(err)))
            continue
        if compiled.failure:  # no program: keep going
            report.results.append(MemoryResult(plan, estimate(plan), None, False, failure=compiled.failure))
            continue
        report.results.append(
            MemoryResult(
                plan,
                estimate(plan),
                compiled.required_bytes if compiled.fits else None,
                compiled.fits,
                required_bytes=compiled.required_bytes,
                layers_compiled=layers,
            )
        )
    return report
