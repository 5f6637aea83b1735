"""When nothing fits: changes that would, each searched again and shown with its predicted step.

An `Advice` names one change (a batch, a length that splits, a remat policy, dropping a fixed
mesh, a shorter sequence, a larger slice that exists), the request with that change made, and
what the search found for it; a change that was not checked, or did not fit, is never offered.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cost_models.targets import Target
from cost_models.topology import Topology, shape_for_chips
from cost_models.units import GiB, counted
from cost_models.vocabulary import DTYPE_BYTES, CPStrategy, LoadBalance, RematPolicy
from planner.explanation import format_seconds, short
from planner.options import SearchOptions, format_tokens
from planner.search import Ranked, SearchResult, SearchSpace, search

STRUCTURAL = ("sequence split", "batch", "mesh", "heads", "load balance")


@dataclass(frozen=True)
class Advice:
    """One change that makes a plan fit: the changed request, and what the search found with it.

    Attributes:
        change: the change in words.
        seq_len, topology, options: the request with the change made (`options` as keyword
            arguments of `planner.plan`), so that following the advice is one call.
        found: the search of that request (its best plan fits).
    """

    change: str
    seq_len: int
    topology: str
    options: dict
    found: SearchResult

    def __str__(self) -> str:
        best: Ranked = self.found.best
        per_step = f"{self.found.global_batch} × {format_tokens(self.found.seq_len)} tokens per step"
        return f"{self.change}: {short(best.plan)}; {per_step} in {format_seconds(best.estimate.step_time_s)}"


def weights_bytes_per_device(model, topo: Topology, opts: SearchOptions) -> float:
    """A floor under every plan's HBM per device on `topo`: the weights and AdamW's two moments, split
    over all its devices (no plan splits them further), before any gradient, activation or buffer."""
    return model.num_params * (2 * DTYPE_BYTES[opts.param_dtype] + DTYPE_BYTES[opts.mu_dtype]) / topo.num_devices


def holds_the_weights(model, topo: Topology, opts: SearchOptions) -> bool:
    """Whether `topo`'s devices could hold the weights and optimizer state at all (a bound priced in
    one step, so that advice searches no slice where nothing can fit, however large the model)."""
    return weights_bytes_per_device(model, topo, opts) <= topo.hbm_bytes_per_device


def lines(result: SearchResult, found: list[Advice]) -> list[str]:
    """The advice for a search in which nothing fits, one line each; one line saying what was
    tried when there is none."""
    fewer = _fewer_sequences(result)
    if found:
        return [*fewer, *(str(a) for a in found)]
    largest = ([result.topology, *_larger_slices(result.topology)])[-1]
    if not holds_the_weights(result.model, largest, result.options):
        need = weights_bytes_per_device(result.model, largest, result.options)
        return [
            *fewer,
            f"nothing found: the weights and optimizer state alone ({result.options.param_dtype} weights, "
            f"{result.options.mu_dtype} first moment) need {need / GiB:,.1f} GiB per device even split over "
            f"all {largest.num_devices} devices of {largest.name}, of {largest.hbm_bytes_per_device / GiB:.1f} "
            f"GiB; use a smaller model",
        ]
    given = restrictions(result.options)
    return [
        *fewer,
        f"nothing found: every remat policy, every batch, shorter sequences and every larger "
        f"{result.topology.chip.name} slice up to the full pod were searched"
        + (f" with {given} as given; drop them or use a smaller model" if given else "; use a smaller model"),
    ]


def _fewer_sequences(result: SearchResult) -> list[str]:
    """Why fewer sequences per step are not offered, where the request aimed at a number of tokens: the
    search tried every count down to one on this slice (a line), and where the weights alone
    overflow it, by how much; [] for an exact batch (whose nearest counts are advice) or one sequence."""
    if result.options.global_batch is not None or result.global_batch <= 1:
        return []
    line = (
        f"fewer sequences per step on {result.topology.name}: none fits, not even one "
        f"{format_tokens(result.seq_len)}-token sequence (counts from {result.global_batch} down to 1 were "
        f"searched)"
    )
    if not holds_the_weights(result.model, result.topology, result.options):
        need = weights_bytes_per_device(result.model, result.topology, result.options)
        line += (
            f": the weights and optimizer state alone need {need / GiB:,.1f} GiB per device of "
            f"{result.topology.hbm_bytes_per_device / GiB:.1f} GiB"
        )
    return [line]


def restrictions(opts: SearchOptions) -> str:
    """The search's own limits the request set (strategies, load balancing, a fixed mesh), in words, or ''."""
    given = []
    if opts.strategies != frozenset(CPStrategy):
        given.append(f"the strategies {sorted(s.value for s in opts.strategies)}")
    if opts.load_balance != frozenset(LoadBalance):
        given.append(f"load balancing {sorted(b.value for b in opts.load_balance)}")
    if opts.mesh:
        given.append(f"the mesh axes {dict(opts.mesh)}")
    return ", ".join(given)


def _unrestricted(opts: SearchOptions) -> SearchOptions:
    """`opts` without the limits `restrictions` names."""
    return dataclasses.replace(opts, strategies=frozenset(CPStrategy), load_balance=frozenset(LoadBalance), mesh=())


def advice(result: SearchResult) -> list[Advice]:
    """The changes that make some plan fit a search in which nothing does, each searched again.

    Args:
        result: a search in which nothing fits.
    Returns:
        The changes that fit (possibly none): allowing every remat policy, dropping a fixed mesh,
        an exact batch's nearest counts, the lengths around the asked one that split, the longest
        sequence that fits, and the first larger slice that exists and fits.
    """
    opts, model, topo, seq_len = result.options, result.model, result.topology, result.seq_len
    target = result.target
    if not holds_the_weights(model, topo, opts):  # no change on this slice can fit: only a larger one
        return _bigger_slice_that_fits(model, seq_len, topo, opts, target)
    out: list[Advice] = []
    if opts.remat != frozenset(RematPolicy):
        out += _tried("allow every remat policy", model, seq_len, topo, opts, target, remat=frozenset(RematPolicy))
    if opts.mesh:
        out += _tried(f"drop the fixed mesh axes {dict(opts.mesh)}", model, seq_len, topo, opts, target, mesh=())
    given = restrictions(opts)
    if given and not out and given != f"the mesh axes {dict(opts.mesh)}":
        loosened = _unrestricted(opts)
        out += _tried(
            f"drop {given}",
            model,
            seq_len,
            topo,
            opts,
            target,
            **{k: getattr(loosened, k) for k in ("strategies", "load_balance", "mesh")},
        )
    out += _batches(result)
    out += _lengths_that_split(result)
    out += _shorter(result)
    out += _bigger_slice_that_fits(model, seq_len, topo, opts, target)
    return out


def as_kwargs(opts: SearchOptions) -> dict:
    """Search options as the keyword arguments of `planner.plan` that build them."""
    return {
        "global_batch_tokens": opts.global_batch_tokens,
        "global_batch": opts.global_batch,
        "strategies": sorted(s.value for s in opts.strategies),
        "mesh": dict(opts.mesh),
        "remat": sorted(r.value for r in opts.remat),
        "load_balance": sorted(b.value for b in opts.load_balance),
        "loss_chunk_tokens": opts.loss_chunk_tokens,
        "param_dtype": opts.param_dtype,
        "compute_dtype": opts.compute_dtype,
    }


def _with_target(kwargs: dict, target: Target) -> dict:
    """`planner.plan` keyword arguments with the target added where it is not the default."""
    return kwargs if target is Target.CPPLAN else {**kwargs, "target": target.value}


def _tried(
    change: str, model, seq_len: int, topo: Topology, opts: SearchOptions, target: Target, **changes
) -> list[Advice]:
    """[the advice] when the request with `changes` made fits (priced for `target`), else []."""
    options = dataclasses.replace(opts, **changes)
    found = search(model, seq_len, topo, options, target=target)
    return [Advice(change, seq_len, topo.name, _with_target(as_kwargs(options), target), found)] if found.ranked else []


def _tokens(tokens: int) -> str:
    """'4M (4194304)', or '896' where the short form is the number."""
    short_form = format_tokens(tokens)
    return short_form if short_form == str(tokens) else f"{short_form} ({tokens})"


def _batches(result: SearchResult) -> list[Advice]:
    """For an exact batch, the sequence counts nearest it that a plan fits (a target batch has
    already been searched over every count)."""
    opts = result.options
    if opts.global_batch is None:
        return []
    space = SearchSpace(result.model, result.seq_len, result.topology, opts, target=result.target)
    out = []
    for count in space.nearest_batches(result.global_batch):
        found = space.result(count)
        if count != result.global_batch and found.ranked:
            options = _with_target(as_kwargs(dataclasses.replace(opts, global_batch=count)), result.target)
            out.append(
                Advice(
                    f"global_batch={count} sequences ({count * result.seq_len:,} tokens per step)",
                    result.seq_len,
                    result.topology.name,
                    options,
                    found,
                )
            )
    return out


def _lengths_that_split(result: SearchResult) -> list[Advice]:
    """Where the sequence length is what no mesh can split: the nearest lengths that split and fit."""
    if not result.rejections or any(r.category not in STRUCTURAL for r in result.rejections):
        return []
    from planner.api import shortest_split

    grain = shortest_split(
        result.model, result.topology, result.options, result.options.global_batch, target=result.target
    )
    if grain is None:
        return []
    below, above = result.seq_len // grain * grain, -(-result.seq_len // grain) * grain
    out = []
    for tokens in sorted({t for t in (below, above) if t > 0 and t != result.seq_len}):
        out += _tried(
            f"a length that splits over the slice, {_tokens(tokens)} tokens (a multiple of {grain})",
            result.model,
            tokens,
            result.topology,
            result.options,
            result.target,
        )
    return out


def _shorter(result: SearchResult) -> list[Advice]:
    """The longest sequence that fits, when it is shorter than the one asked for; else, where the
    slice needs fewer sequences per step to fit, the lengths around the asked one that split with them."""
    from planner.api import longest_sequence, shortest_split

    opts, seq_len, target = result.options, result.seq_len, result.target
    longest = longest_sequence(result.model, result.topology, opts, target=target)
    if longest is None:
        return []
    n = longest.sequences
    per_step = "" if n == 1 else f" × {n} sequences"
    if longest.seq_len < seq_len:
        return _tried(
            f"a shorter sequence, the longest that fits: {_tokens(longest.seq_len)} tokens{per_step}",
            result.model,
            longest.seq_len,
            result.topology,
            opts,
            target,
            global_batch=n,
            global_batch_tokens=None,
        )
    grain = shortest_split(result.model, result.topology, opts, n, target=target)
    lengths = {seq_len // grain * grain, -(-seq_len // grain) * grain}
    out = []
    for tokens in sorted(t for t in lengths if 0 < t <= longest.seq_len and (t, n) != (seq_len, result.global_batch)):
        length = "" if tokens == seq_len else f" of {_tokens(tokens)} tokens (a length that splits over the slice)"
        out += _tried(
            f"{counted(n, 'sequence')} per step{length}",
            result.model,
            tokens,
            result.topology,
            opts,
            target,
            global_batch=n,
            global_batch_tokens=None,
        )
    return out


def _larger_slices(topo: Topology) -> list[Topology]:
    """The most cubic slice at twice, four times … the chips, then the full pod (as many slices as `topo` has)."""
    if not topo.chip.kind.has_torus:
        return []
    counts = []
    chips = topo.chips_per_slice * 2
    while chips < topo.chip.max_chips:
        counts.append(chips)
        chips *= 2
    if topo.chips_per_slice < topo.chip.max_chips:
        counts.append(topo.chip.max_chips)
    shapes = (shape_for_chips(topo.chip, chips) for chips in counts)
    return [Topology(topo.chip, dims, topo.devices_per_chip, topo.num_slices) for dims in shapes if dims is not None]


def _bigger_slice_that_fits(model, seq_len: int, topo: Topology, opts: SearchOptions, target: Target) -> list[Advice]:
    """The first larger slice (see `_larger_slices`) on which the same request fits, or []."""
    for bigger in _larger_slices(topo):
        if not holds_the_weights(model, bigger, opts):
            continue
        found = _tried(
            f"a larger slice, {bigger.name} ({bigger.num_chips} chips)", model, seq_len, bigger, opts, target, mesh=()
        )
        if found:
            return found
    return []


def longest_advice(model, topo: Topology, opts: SearchOptions, *, target: Target = Target.CPPLAN) -> str:
    """What to change when no sequence length fits a slice, each change searched again.

    Args:
        model: the model spec; topo: the slice; opts: the search options (no batch).
        target: the runtime the plans are priced for.
    Returns:
        A clause for the error message.
    """
    from planner.api import longest_sequence

    out = []
    if opts.remat != frozenset(RematPolicy):
        longest = longest_sequence(model, topo, dataclasses.replace(opts, remat=frozenset(RematPolicy)), target=target)
        if longest is not None:
            out.append(f"allow every remat policy: up to {_tokens(longest.seq_len)} tokens fit")
    given = restrictions(opts)
    if given:
        longest = longest_sequence(model, topo, _unrestricted(opts), target=target)
        if longest is not None:
            out.append(f"drop {given}: up to {_tokens(longest.seq_len)} tokens fit")
    for bigger in _larger_slices(topo):
        if not holds_the_weights(model, bigger, opts):
            continue
        longest = longest_sequence(model, bigger, dataclasses.replace(opts, mesh=()), target=target)
        if longest is not None:
            out.append(
                f"a larger slice, {bigger.name} ({bigger.num_chips} chips): up to {_tokens(longest.seq_len)} tokens fit"
            )
            break
    if out:
        return "what would fit: " + "; ".join(out)
    return "nothing fits with every remat policy or on any larger slice up to the full pod" + (
        f" with {given} as given; drop them or use a smaller model" if given else "; use a smaller model"
    )
