"""The price of one `Plan`: the plan as one row of candidates, priced as the search prices them."""

from __future__ import annotations

from cost_models.accuracy import ErrorBand, error_band, memory_margins
from cost_models.candidates import Candidates, group_links, link_columns
from cost_models.errors import CpplanError
from cost_models.estimate import Estimate, estimate_row
from cost_models.pricing import price
from cost_models.remat import remat_code
from cost_models.targets import Target, get_target
from cost_models.vocabulary import DTYPE_BYTES, CPStrategy, LoadBalance
from planner.maxtext import maxtext_problems
from planner.plan import Plan


def plan_error_band(plan: Plan, target: "str | Target | None" = None) -> ErrorBand | None:
    """The measured step-time error band of the regime `plan` runs in on `target`
    (`cost_models.accuracy.error_band`)."""
    return error_band(
        plan.topology_spec.chip.name,
        context_parallel=plan.cp_strategy is not CPStrategy.NONE,
        num_slices=plan.num_slices,
        experts=plan.model.experts is not None,
        seq_len=plan.seq_len,
        runtime=get_target(target) is Target.CPPLAN,
    )


def candidates_of(plan: Plan) -> Candidates:
    """The plan as one row of `Candidates`, its links those of its placement.

    Args:
        plan: the plan.
    Returns:
        A one-row `Candidates`.
    Raises:
        CpplanError: the plan's axes do not tile its topology in its axis and physical order.
    """
    mesh = plan.mesh_dict
    topology = plan.topology_spec
    links, ring_link = link_columns(
        {group: [links] for group, links in group_links(topology.links, plan.segments()).items()}
    )
    return Candidates(
        case=plan.case,
        strategy=plan.cp_strategy,
        local_strategy=plan.local_strategy,
        data=[mesh["data"]],
        fsdp=[mesh["fsdp"]],
        ring=[mesh["context"]],
        ulysses=[mesh["context_ulysses"]],
        tensor=[mesh["tensor"]],
        expert=[mesh["expert"]],
        remat=[remat_code(plan.remat)],
        zigzag=[plan.load_balance is LoadBalance.ZIGZAG],
        block_q=[plan.block_q],
        block_kv=[plan.block_kv],
        links=links,
        ring_link=ring_link,
        loss_chunk_tokens=plan.loss_chunk_tokens,
        act_bytes=DTYPE_BYTES[plan.compute_dtype],
        param_bytes=DTYPE_BYTES[plan.param_dtype],
        mu_bytes=DTYPE_BYTES[plan.mu_dtype],
        grad_bytes=DTYPE_BYTES[plan.grad_dtype or plan.param_dtype],
        remat_custom=plan.remat_custom,
        fused_attention_backward=plan.fused_attention_backward,
        dq_reduction_steps=plan.dq_reduction_steps,
        state_on_host=plan.state_on_host,
        quantization=plan.quantization,
        expert_capacity=plan.expert_capacity,
        one_hot_embedding=plan.one_hot_embedding,
    )


def estimate(plan: Plan, *, target: "str | Target | None" = None) -> Estimate:
    """Prices one plan.

    Args:
        plan: the plan.
        target: the runtime that runs it: ``cpplan`` (default) or ``maxtext`` (its exported flags).
    Returns:
        Its `Estimate`.
    Raises:
        CpplanError: the plan's mesh does not tile its topology, its strategy cannot run it (the
            rule and its numbers), its batch does not split over data × fsdp, or the target is unknown.
    """
    if not isinstance(plan, Plan):
        raise CpplanError(
            f"estimate takes a Plan, not {type(plan).__name__}; build one with planner.plan, Plan.from_dict or "
            f"Plan.from_json."
        )
    target = get_target(target, plan.model)
    plan.check()
    if target.traits.maxtext_rules and plan.local_strategy is not None:
        raise CpplanError("MaxText cannot run this plan: " + "; ".join(maxtext_problems(plan)) + ".")
    x = candidates_of(plan)
    margins = memory_margins(x.topology.chip.name, target.value)
    return estimate_row(price(x, target=target), 0, x, memory_margins=margins)
