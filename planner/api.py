"""The planner's public functions: plan, explain, evaluate, max_seq_len."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass

from cost_models.errors import CpplanError
from cost_models.estimate import Estimate
from cost_models.models import ModelSpec, get_model
from cost_models.strategies import STRATEGIES
from cost_models.strategies.base import SPLASH_LANES, Shape
from cost_models.targets import Target, get_target
from cost_models.topology import Topology, divisors, get_topology
from cost_models.vocabulary import AXES, CPStrategy, LoadBalance
from planner.options import MAX_TOKENS, SearchOptions, check_mesh, format_tokens, parse_seq_len
from planner.plan import Plan
from planner.search import SearchResult, SearchSpace, search

ModelArg = str | ModelSpec | os.PathLike


def run_search(model, seq_len, topology, **options) -> SearchResult:
    """Parses the three inputs and the options, then searches.

    The batch is the number of sequences nearest `global_batch_tokens` (by default 4M tokens on
    accelerators) that a plan fits, or exactly `global_batch` sequences; the result's `batch_note`
    says why when the count differs from the target. `target` (``cpplan`` by default, or
    ``maxtext``) is the runtime the plans are priced for.
    """
    spec, tokens = get_model(model), parse_seq_len(seq_len)
    target = get_target(options.pop("target", None), spec)
    topo = get_topology(topology, options.pop("num_slices", None))
    return search(spec, tokens, topo, SearchOptions.build(**options), target=target)


def plan(model: ModelArg, seq_len: "int | str", topology: "str | Topology", **options) -> Plan:
    """The best feasible plan.

    Args:
        model: a model name, a `ModelSpec`, or a path to a Hugging Face config.json.
        seq_len: tokens per sequence, an int or a string such as ``4M`` or ``128k``.
        topology: a name such as ``v5p-256``, ``tpu7x:4x4x4`` or ``cpu:8``.
        **options: see `planner.options.SearchOptions`; `num_slices`, the slices joined over
            DCN (default 1, or the name's `Nx` prefix); and `target`, the runtime priced:
            ``cpplan`` (default) or ``maxtext`` (MaxText 0.2.5's memory, only plans it accepts).
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


def explain(model: ModelArg, seq_len: "int | str", topology: "str | Topology", *, top: int | None = None, **options):
    """What the planner chose, why, what came close, and why everything else was rejected.

    Returns:
        An `Explanation`: ``str()`` is the report, ``.to_dict()`` / ``.to_json()`` for machines,
        ``.best`` the `Plan` (None when nothing fits) and ``.estimate`` its `Estimate`.
    """
    from planner.explanation import Explanation

    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
        raise CpplanError(f"top={top!r} must be a whole number of alternatives to show, 0 or more.")
    result = run_search(model, seq_len, topology, **dict(options))
    local = result.case.model
    # with local layers, the same request priced as if every layer attended globally (searched when asked
    # for): what the masks change
    global_only = (
        functools.partial(run_search, local.all_global(), seq_len, topology, **dict(options))
        if local.has_local_layers
        else None
    )
    return Explanation(result, global_only=global_only, **({} if top is None else {"top": top}))


def evaluate(
    model: ModelArg, seq_len: "int | str", topology: "str | Topology", *, strategy, mesh: dict[str, int], **options
) -> Estimate:
    """Prices a plan the user already has: its strategy and full mesh (missing axes are 1).

    The placement on the torus is the best realisable one for that mesh; remat and load
    balancing default to MaxText's (full; zigzag for ring and all-gather, none for Ulysses and
    USP, which MaxText does not balance, and none under a full mask, which has nothing to balance)
    unless given. A `global_batch_tokens` given here is the
    plan's batch exactly (a whole number of sequences), not a target.

    Raises:
        CpplanError: the mesh does not multiply to the device count, the batch is not whole
            sequences, or the strategy cannot run this case (the message names the rule); a plan
            over HBM is returned with ``fits=False``.
    """
    target = get_target(options.get("target"), get_model(model))
    topo = get_topology(topology, options.pop("num_slices", None))
    for name in ("strategies", "mesh"):
        if name in options:
            raise CpplanError(f"evaluate prices one strategy on one mesh (strategy=, mesh=); drop {name}.")
    if options.get("global_batch") is not None and options.get("global_batch_tokens") is not None:
        raise CpplanError(
            f"global_batch={options['global_batch']} (sequences) and global_batch_tokens="
            f"{options['global_batch_tokens']} both set the batch; give one of them."
        )
    full_mesh = {a: 1 for a in AXES} | check_mesh(mesh)
    total = math.prod(full_mesh.values())
    if total != topo.num_devices:
        raise CpplanError(f"mesh {full_mesh} covers {total} devices; {topo.name} has {topo.num_devices}.")
    strategy = CPStrategy.parse(strategy)
    options.setdefault("remat", "full")
    spec = STRATEGIES[strategy]
    # balance by default where the strategy balances this model's mask and MaxText accepts it, so
    # the plan exports
    if "load_balance" not in options:
        balanced = spec.balances(get_model(model)) and not spec.maxtext_refuses_load_balance
        if balanced and target.traits.maxtext_rules:  # MaxText balances only over an even ring degree
            balanced = full_mesh["context"] % 2 == 0
        options["load_balance"] = "zigzag" if balanced else "none"
    if options.get("global_batch_tokens") is not None:
        tokens, batch_tokens = (
            parse_seq_len(seq_len),
            parse_seq_len(options.pop("global_batch_tokens"), what="global_batch_tokens"),
        )
        if batch_tokens % tokens:
            raise CpplanError(
                f"global_batch_tokens={batch_tokens} is not a whole number of {tokens}-token "
                f"sequences; use a multiple of {tokens}."
            )
        options["global_batch"] = batch_tokens // tokens
    result = run_search(model, seq_len, topo, mesh=full_mesh, strategies=[strategy], **options)
    if result.ranked:
        return result.ranked[0].estimate
    if result.best_infeasible:
        return result.best_infeasible[0].estimate
    reasons = "; ".join(sorted({r.reason for r in result.rejections}))
    if not reasons:  # refused before pricing: the strategy's own rule for this mesh says why
        mask_model = get_model(model).within(parse_seq_len(seq_len))[0]
        shape = Shape.on_mesh(
            mask_model,
            parse_seq_len(seq_len),
            full_mesh,
            options["load_balance"] in ("zigzag", LoadBalance.ZIGZAG),
            topo.chip.kind.shares_cores,
        )
        violation = spec.check(shape)
        reasons = violation.reason if violation else "no candidate"
    raise CpplanError(f"{strategy.value} cannot run mesh {full_mesh}: {reasons}.")


@dataclass(frozen=True)
class LongestSequence:
    """The answer of `max_seq_len`; ``str()`` is what the CLI prints.

    Attributes:
        seq_len: the longest sequence length found to fit.
        plan: the best plan at that length.
        estimate: its predicted step.
        sequences: sequences per step (1 unless one sequence cannot be split over the slice).
        note: why more than one sequence, else None.
        surely_seq_len: the longest length some plan fits with the compiler's largest measured excess
            over the memory price to spare (`Estimate.marginal`'s margin); None where none does.
    """

    seq_len: int
    plan: Plan
    estimate: Estimate
    sequences: int
    note: str | None
    surely_seq_len: int | None

    def __str__(self) -> str:
        from planner.explanation import describe_strategy, format_seconds

        per_step = "" if self.sequences == 1 else f" × {self.sequences} sequences per step"
        line = (
            f"{self.plan.model.name} on {self.plan.topology}: up to {format_tokens(self.seq_len)} tokens "
            f"({self.seq_len}) per sequence{per_step}, with {describe_strategy(self.plan)}, "
            f"remat {self.plan.remat_label}; a step takes {format_seconds(self.estimate.step_time_s)}"
        )
        if self.surely_seq_len != self.seq_len:
            surely = (
                f"{format_tokens(self.surely_seq_len)} tokens ({self.surely_seq_len})"
                if self.surely_seq_len
                else "no length"
            )
            line += (
                f"\nMarginal: {surely} fit with the memory price's measured error "
                f"({self.estimate.memory_margin:.1%}) to spare; longer ones fit as priced, and `cpplan run`'s "
                "pre-flight compile settles them"
            )
        elif self.estimate.marginal:
            line += f"\nMarginal: this plan is {self.estimate.marginal_reason}; a slower plan fits with the margin"
        return line + (f"\nNote: {self.note}." if self.note else "")

    def to_dict(self) -> dict:
        return {
            "max_seq_len": self.seq_len,
            "max_seq_len_surely": self.surely_seq_len,
            "sequences": self.sequences,
            "note": self.note,
            "plan": self.plan.to_dict(),
            "estimate": self.estimate.to_dict(),
        }


def max_seq_len(model: ModelArg, topology: "str | Topology", **options) -> LongestSequence:
    """The longest sequence that some plan fits, with one sequence per step where the slice can
    split one sequence over all its devices, else with the fewest sequences that can.

    Probes from the shortest length that splits over the slice, doubling while a plan fits, then
    refines between the last that fits and the first that does not in sixteenths (multiples of
    that shortest length, so each probe splits).

    Raises:
        CpplanError: a batch option was given (this prices the fewest sequences), or no length fits
            with any number of sequences (the message says what would).
    """
    from planner.suggest import longest_advice

    for name in ("global_batch_tokens", "global_batch"):
        if options.get(name) is not None:
            raise CpplanError(f"max_seq_len chooses the sequences per step itself (one where it can); drop {name}.")
    model_spec = get_model(model)
    target = get_target(options.pop("target", None), model_spec)
    topo = get_topology(topology, options.pop("num_slices", None))
    opts = SearchOptions.build(**options)
    found = longest_sequence(model_spec, topo, opts, target=target)
    if found is None:
        raise CpplanError(
            f"no plan fits {model_spec.name} on {topo.name} at any sequence length, with any number "
            f"of sequences per step; {longest_advice(model_spec, topo, opts, target=target)}."
        )
    return found


def longest_sequence(
    model: ModelSpec, topo: Topology, opts: SearchOptions, *, target: Target = Target.CPPLAN
) -> LongestSequence | None:
    """`max_seq_len` on parsed inputs (priced for `target`): the answer, or None where no length fits.

    The fewest sequences per step whose shards let some length split over the slice decide; more
    sequences would only help the split, not the memory a device needs at the shortest length.
    """
    for sequences in divisors(topo.num_devices):
        grain = shortest_split(model, topo, opts, sequences, target=target)
        if grain is None:
            continue
        exact = dataclasses.replace(opts, global_batch=sequences, global_batch_tokens=None)
        shards = frozenset(divisors(sequences))

        @functools.cache  # the two probes below ask many of the same lengths
        def space(tokens: int) -> SearchSpace:
            return SearchSpace(model, tokens, topo, exact, shard_counts=shards, target=target)

        length = _longest_with(space, sequences, grain)
        if length is None:
            return None
        best = space(length).result(sequences).best
        surely = _longest_with(space, sequences, grain, surely=True)
        if sequences == 1:
            note = None
        elif topo.num_slices > 1:
            note = (
                f"a sequence stays inside one slice (only data and fsdp span the {topo.num_slices} slices of "
                f"{topo.name}, and each of their shards holds whole sequences); {sequences} sequences per step "
                f"is the fewest that split"
            )
        else:
            note = (
                f"no plan splits one sequence over all {topo.num_devices} devices of {topo.name}; {sequences} "
                f"sequences per step is the fewest that split"
            )
        return LongestSequence(length, best.plan, best.estimate, sequences, note, surely)
    return None


def _longest_with(space, sequences: int, grain: int, *, surely: bool = False) -> int | None:
    """The longest length some plan fits with `sequences` sequences per step, probing from `grain` (the
    shortest length that splits), or None when not even that fits; `space(tokens)` is the search at a
    length; `surely`: fits with the memory price's measured error to spare (`SearchSpace.fits`)."""

    def fits(tokens: int) -> bool:
        probe = space(tokens)
        return any(probe.fits(s, sequences // s, surely=surely) for s in probe.shard_counts)

    if not fits(grain):
        return None
    low = grain
    while 2 * low <= MAX_TOKENS and fits(2 * low):
        low *= 2
    step = max(grain, low // 16 // grain * grain)
    return next((tokens for tokens in range(2 * low - step, low, -step) if fits(tokens)), low)


def shortest_split(
    model: ModelSpec,
    topo: Topology,
    opts: SearchOptions,
    sequences: int | None = None,
    *,
    target: Target = Target.CPPLAN,
) -> int | None:
    """The shortest sequence length that some mesh splits over the slice (memory aside), or None.

    Every strategy splits a sequence into 128-token lanes over its context ranks (twice as many
    pieces under zigzag), so a length that splits is 128 × a divisor of twice the device count;
    these are tried shortest first against the strategies' own rules.

    Args:
        model, topo, opts: the search's inputs.
        sequences: sequences per step (their divisors bound data × fsdp); None for any number.
        target: the runtime, whose rules may refuse some splits.
    """
    shards = None if sequences is None else frozenset(divisors(sequences))
    for unit in divisors(2 * topo.num_devices):
        tokens = SPLASH_LANES * unit
        if SearchSpace(model, tokens, topo, opts, shard_counts=shards, target=target).shard_counts:
            return tokens
    return None
