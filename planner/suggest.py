"""When nothing fits: what would (more remat, fewer tokens per step, a shorter sequence, more chips)."""
from __future__ import annotations

from cost_models.errors import CpplanError
from cost_models.topology import Topology, shape_for_chips
from cost_models.vocabulary import RematPolicy
from planner.options import SearchOptions, format_tokens
from planner.search import SearchResult, search


def suggestions(result: SearchResult) -> list[str]:
    """Concrete changes that make some plan fit, each checked by searching again."""
    out: list[str] = []
    opts, model, topo = result.options, result.model, result.topology
    if result.rejections and all(r.category in ("sequence split", "batch", "mesh") for r in result.rejections):
        return [f"a sequence length that splits into blocks of 128 tokens over the context ranks "
                f"(a multiple of 128 × the context degree, twice that for zigzag); {result.seq_len} does not"]
    if RematPolicy.FULL not in opts.remat:
        trial = search(model, result.seq_len, topo, _with(opts, remat=frozenset(RematPolicy)))
        if trial.ranked:
            out.append(f"allow remat=full: then {trial.best.plan.cp_strategy.value} fits")
    if result.global_batch > 1:
        trial = search(model, result.seq_len, topo, _with(opts, global_batch_tokens=result.seq_len))
        if trial.ranked:
            out.append(f"one sequence per step (global_batch_tokens={result.seq_len}) fits")
    from planner.api import max_seq_len

    try:
        longest, _ = max_seq_len(model, topo, **_as_kwargs(opts))
        if longest < result.seq_len:
            out.append(f"a shorter sequence: up to {format_tokens(longest)} tokens ({longest}) fits on {topo.name}")
    except CpplanError as err:
        out.append(f"no sequence length fits on {topo.name}: {err}")
    bigger = _bigger_slice_that_fits(result)
    if bigger:
        out.append(f"more chips: {bigger} fits")
    return out or ["nothing within this chip's largest pod fits; use a smaller model"]


def _with(opts: SearchOptions, **changes) -> SearchOptions:
    return SearchOptions(**{**opts.__dict__, **changes})


def _as_kwargs(opts: SearchOptions) -> dict:
    return {"strategies": opts.strategies, "mesh": dict(opts.mesh), "remat": opts.remat,
            "load_balance": opts.load_balance, "loss_chunk_tokens": opts.loss_chunk_tokens,
            "param_dtype": opts.param_dtype, "compute_dtype": opts.compute_dtype}


def _bigger_slice_that_fits(result: SearchResult) -> str | None:
    topo = result.topology
    if not topo.chip.kind.has_torus:
        return None
    chips = topo.num_chips * 2
    while chips <= topo.chip.max_chips:
        dims = shape_for_chips(topo.chip, chips)
        if dims:
            bigger = Topology(topo.chip, dims, topo.devices_per_chip)
            if search(result.model, result.seq_len, bigger, _with(result.options, mesh=())).ranked:
                return f"{bigger.name} ({chips} chips)"
        chips *= 2
    return None


def longest_advice(model, topo: Topology, opts: SearchOptions) -> str:
    """What to change when no sequence length fits a slice: each option re-searched at the
    shortest length that splits over it."""
    from planner.api import shortest_split

    out = []
    if opts.remat != frozenset(RematPolicy):
        wider = _with(opts, remat=frozenset(RematPolicy))
        tokens = shortest_split(model, topo, wider)
        if tokens and search(model, tokens, topo, _with(wider, global_batch=1)).ranked:
            out.append(f"allowing every remat policy, {format_tokens(tokens)} tokens fit")
    return "; ".join(out) or "use a larger slice or a smaller model"
