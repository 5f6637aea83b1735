"""When nothing fits: changes that would, each searched again and shown with its predicted step.

A line names one change (a batch, a length that splits, a remat policy, dropping a fixed mesh,
a shorter sequence, a larger slice that exists) and the plan and step time the search found
with it; a change that was not checked, or did not fit, is never offered.
"""
from __future__ import annotations

import dataclasses

from cost_models.errors import CpplanError
from cost_models.topology import Topology, shape_for_chips
from cost_models.vocabulary import RematPolicy
from planner.explanation import format_seconds, short
from planner.options import SearchOptions, format_tokens
from planner.search import Ranked, SearchResult, SearchSpace, search

STRUCTURAL = ("sequence split", "batch", "mesh", "heads", "load balance")


def suggestions(result: SearchResult) -> list[str]:
    """Concrete changes that make some plan fit, each checked by searching again.

    Args:
        result: a search in which nothing fits.
    Returns:
        One line per change that fits, with the plan found and its predicted step; one line
        saying what was tried when nothing does.
    """
    opts, model, topo, seq_len = result.options, result.model, result.topology, result.seq_len
    out: list[str] = []
    if opts.remat != frozenset(RematPolicy):
        trial = search(model, seq_len, topo, _with(opts, remat=frozenset(RematPolicy)))
        if trial.ranked:
            out.append(_line("allow every remat policy", trial))
    if opts.mesh:
        trial = search(model, seq_len, topo, _with(opts, mesh=()))
        if trial.ranked:
            out.append(_line(f"drop the fixed mesh axes {dict(opts.mesh)}", trial))
    out += _batches(result)
    out += _lengths_that_split(result)
    out += _shorter(result)
    bigger = _bigger_slice_that_fits(model, seq_len, topo, opts)
    if bigger:
        out.append(bigger)
    if out:
        return out
    return [f"nothing found: every remat policy, every batch, shorter sequences and every larger "
            f"{topo.chip.name} slice up to the full pod were searched; use a smaller model"]


def _line(change: str, trial: SearchResult) -> str:
    best: Ranked = trial.best
    return (f"{change}: {short(best.plan)}; {trial.global_batch} × {format_tokens(trial.seq_len)} tokens per step "
            f"in {format_seconds(best.estimate.step_time_s)}")


def _tokens(tokens: int) -> str:
    """'4M (4194304)', or '896' where the short form is the number."""
    short_form = format_tokens(tokens)
    return short_form if short_form == str(tokens) else f"{short_form} ({tokens})"


def _with(opts: SearchOptions, **changes) -> SearchOptions:
    return dataclasses.replace(opts, **changes)


def _batches(result: SearchResult) -> list[str]:
    """For an exact batch, the sequence counts nearest it that a plan fits (a target batch has
    already been searched over every count)."""
    if result.options.global_batch is None:
        return []
    space = SearchSpace(result.model, result.seq_len, result.topology, result.options)
    counts = [c for c in space.nearest_batches(result.global_batch) if c != result.global_batch]
    out = []
    for count in counts:
        trial = space.result(count)
        if trial.ranked:
            out.append(_line(f"global_batch={count} sequences ({count * result.seq_len:,} tokens per step)", trial))
    return out


def _lengths_that_split(result: SearchResult) -> list[str]:
    """Where the sequence length is what no mesh can split: the nearest lengths that split and fit."""
    if not result.rejections or any(r.category not in STRUCTURAL for r in result.rejections):
        return []
    from planner.api import shortest_split

    grain = shortest_split(result.model, result.topology, result.options, result.options.global_batch)
    if grain is None:
        return []
    below, above = result.seq_len // grain * grain, -(-result.seq_len // grain) * grain
    out = []
    for tokens in sorted({t for t in (below, above) if t > 0 and t != result.seq_len}):
        trial = search(result.model, tokens, result.topology, result.options)
        if trial.ranked:
            out.append(_line(f"a length that splits over the slice, {_tokens(tokens)} tokens (a multiple of {grain})",
                             trial))
    return out


def _shorter(result: SearchResult) -> list[str]:
    from planner.api import max_seq_len

    try:
        longest = max_seq_len(result.model, result.topology, **_as_kwargs(result.options))
    except CpplanError:
        return []
    if longest.seq_len >= result.seq_len:
        return []
    per_step = "" if longest.sequences == 1 else f" × {longest.sequences} sequences"
    return [f"a shorter sequence: up to {_tokens(longest.seq_len)} tokens{per_step}: "
            f"{short(longest.plan)}; a step in {format_seconds(longest.estimate.step_time_s)}"]


def _as_kwargs(opts: SearchOptions) -> dict:
    return {"strategies": opts.strategies, "mesh": dict(opts.mesh), "remat": opts.remat,
            "load_balance": opts.load_balance, "loss_chunk_tokens": opts.loss_chunk_tokens,
            "param_dtype": opts.param_dtype, "compute_dtype": opts.compute_dtype}


def _larger_slices(topo: Topology) -> list[Topology]:
    """The most cubic slice at twice, four times … the chips, then the full pod."""
    if not topo.chip.kind.has_torus:
        return []
    counts = []
    chips = topo.num_chips * 2
    while chips < topo.chip.max_chips:
        counts.append(chips)
        chips *= 2
    if topo.num_chips < topo.chip.max_chips:
        counts.append(topo.chip.max_chips)
    shapes = (shape_for_chips(topo.chip, chips) for chips in counts)
    return [Topology(topo.chip, dims, topo.devices_per_chip) for dims in shapes if dims is not None]


def _bigger_slice_that_fits(model, seq_len: int, topo: Topology, opts: SearchOptions) -> str | None:
    """The first larger slice (see `_larger_slices`) on which the same request fits, or None."""
    options = _with(opts, mesh=())
    for bigger in _larger_slices(topo):
        trial = search(model, seq_len, bigger, options)
        if trial.ranked:
            return _line(f"a larger slice, {bigger.name} ({bigger.num_chips} chips)", trial)
    return None


def longest_advice(model, topo: Topology, opts: SearchOptions) -> str:
    """What to change when no sequence length fits a slice, each change searched again.

    Args:
        model: the model spec; topo: the slice; opts: the search options (no batch).
    Returns:
        A clause for the error message.
    """
    from planner.api import max_seq_len

    kwargs = _as_kwargs(opts)
    out = []
    if opts.remat != frozenset(RematPolicy):
        try:
            longest = max_seq_len(model, topo, **{**kwargs, "remat": None})
            out.append(f"allow every remat policy: up to {format_tokens(longest.seq_len)} tokens fit")
        except CpplanError:
            pass  # no line for a change that does not fit
    for bigger in _larger_slices(topo):
        try:
            longest = max_seq_len(model, bigger, **{**kwargs, "mesh": None})
        except CpplanError:
            continue
        out.append(f"a larger slice, {bigger.name} ({bigger.num_chips} chips): up to "
                   f"{format_tokens(longest.seq_len)} tokens fit")
        break
    if out:
        return "what would fit: " + "; ".join(out)
    return "nothing fits with every remat policy or on any larger slice up to the full pod; use a smaller model"
