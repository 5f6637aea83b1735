"""The planner's public functions: plan, explain, evaluate, max_seq_len."""
from __future__ import annotations

import dataclasses
import os

from cost_models.errors import CpplanError
from cost_models.estimate import Estimate
from cost_models.models import ModelSpec, get_model
from cost_models.topology import Topology, get_topology
from cost_models.strategies import STRATEGIES
from cost_models.vocabulary import AXES, CPStrategy
from planner.options import SearchOptions, parse_seq_len
from planner.plan import Plan
from planner.search import SearchResult, search

ModelArg = str | ModelSpec | os.PathLike


def run_search(model, seq_len, topology, **options) -> SearchResult:
    """Parses the three inputs and the options, then searches.

    Without `global_batch_tokens`, a step holds the default batch (4M tokens on accelerators);
    when no plan fits it, the batch halves until one does (down to one sequence), and the result
    says so.
    """
    spec, tokens, topo = get_model(model), parse_seq_len(seq_len), get_topology(topology)
    opts = SearchOptions.build(**options)
    result = search(spec, tokens, topo, opts)
    if opts.global_batch_tokens is not None:
        return result
    default = batch = result.global_batch
    while not result.ranked and batch > 1:
        batch //= 2
        result = search(spec, tokens, topo, dataclasses.replace(opts, global_batch_tokens=batch * tokens))
    if result.ranked and batch != default:
        result.batch_note = (f"the default step of {default} sequences ({default * tokens:,} tokens) fits no plan; "
                             f"{batch} sequence{'s' if batch > 1 else ''} per step do")
    return result


def plan(model: ModelArg, seq_len: "int | str", topology: "str | Topology", **options) -> Plan:
    """The best feasible plan.

    Args:
        model: a model name, a `ModelSpec`, or a path to a Hugging Face config.json.
        seq_len: tokens per sequence, an int or a string such as ``4M`` or ``128k``.
        topology: a name such as ``v5p-256``, ``tpu7x:4x4x4`` or ``cpu:8``.
        **options: see `planner.options.SearchOptions`.
    Returns:
        The top-ranked `Plan`.
    Raises:
        CpplanError: bad input, or no plan fits (the message says why, per strategy).
    """
    from planner.explanation import Explanation

    explanation = Explanation(run_search(model, seq_len, topology, **options))
    if explanation.best is None:
        raise CpplanError(explanation.nothing_fits_text())
    return explanation.best


def explain(model: ModelArg, seq_len: "int | str", topology: "str | Topology", **options):
    """What the planner chose, why, what came close, and why everything else was rejected.

    Returns:
        An `Explanation`: ``str()`` is the report, ``.to_dict()`` / ``.to_json()`` for machines,
        ``.best`` the `Plan` (None when nothing fits) and ``.estimate`` its `Estimate`.
    """
    from planner.explanation import Explanation

    return Explanation(run_search(model, seq_len, topology, **options))


def evaluate(model: ModelArg, seq_len: "int | str", topology: "str | Topology", *, strategy,
             mesh: dict[str, int], **options) -> Estimate:
    """Prices a plan the user already has: its strategy and full mesh (missing axes are 1).

    The placement on the torus is the best realisable one for that mesh; remat and load
    balancing default to MaxText's (full; zigzag for ring and all-gather, none for Ulysses and
    USP, which MaxText does not balance) unless given.

    Raises:
        CpplanError: the mesh does not multiply to the device count, or the strategy cannot
            run this case (the message names the rule); a plan over HBM is returned with
            ``fits=False``.
    """
    topo = get_topology(topology)
    full_mesh = {a: int(mesh.get(a, 1)) for a in AXES}
    unknown = set(mesh) - set(AXES)
    if unknown:
        raise CpplanError(f"unknown mesh axes {sorted(unknown)}; the axes are {AXES}.")
    total = 1
    for s in full_mesh.values():
        total *= s
    if total != topo.num_devices:
        raise CpplanError(f"mesh {full_mesh} covers {total} devices; {topo.name} has {topo.num_devices}.")
    strategy = CPStrategy.parse(strategy)
    options.setdefault("remat", "full")
    spec = STRATEGIES[strategy]
    # balance by default where the strategy balances and MaxText accepts it, so the plan exports
    options.setdefault("load_balance", "zigzag" if spec.balances_load and not spec.maxtext_refuses_load_balance
                       else "none")
    result = run_search(model, seq_len, topo, mesh=full_mesh, strategies=[strategy], **options)
    if result.ranked:
        return result.ranked[0].estimate
    if result.best_infeasible:
        return result.best_infeasible[0].estimate
    reasons = "; ".join(sorted({r.reason for r in result.rejections})) or "no candidate"
    raise CpplanError(f"{strategy.value} cannot run mesh {full_mesh}: {reasons}.")


def max_seq_len(model: ModelArg, topology: "str | Topology", **options) -> tuple[int, Plan]:
    """The longest sequence (one sequence per step) that some plan fits, and that plan.

    Probes powers of two, then refines between the last that fits and the first that does not
    in sixteenths (lengths that split evenly over many devices).

    Raises:
        CpplanError: not even 1024 tokens fit, or `global_batch_tokens` was given.
    """
    if "global_batch_tokens" in options:
        raise CpplanError("max_seq_len prices one sequence per step; drop global_batch_tokens.")
    model_spec, topo, opts = get_model(model), get_topology(topology), SearchOptions.build(**options)

    def best(tokens: int):
        result = search(model_spec, tokens, topo, SearchOptions(**{**opts.__dict__, "global_batch_tokens": tokens}))
        return result.best.plan if result.ranked else None

    length, found = 1024, None
    while length <= 2**31:
        candidate = best(length)
        if candidate is None:
            break
        found, length = candidate, length * 2
    if found is None:
        raise CpplanError(f"no plan fits {model_spec.name} on {topo.name} even at 1024 tokens; "
                          "use a larger slice or more remat.")
    low, step = found.seq_len, found.seq_len // 16
    for k in range(15, 0, -1):
        candidate = best(low + k * step)
        if candidate is not None:
            return candidate.seq_len, candidate
    return found.seq_len, found
