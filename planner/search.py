"""The search: every mesh factorisation × CP strategy × load balancing × remat × placement.

Structural rules (batch, heads, sequence splits, splash SMEM) reject (mesh, strategy,
balancing) candidates before any pricing; the rest are priced as numpy columns, one strategy
at a time, over every realisable placement; HBM rejects per remat policy; each candidate keeps
its best placement. Ranking: predicted step time per token, then memory headroom, then a
deterministic key. A pure function of its inputs.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from cost_models.candidates import Candidates, group_links, link_columns
from cost_models.case import Case, batch_split_violation
from cost_models.compute import splash_smem_bytes
from cost_models.estimate import Estimate, estimate_row
from cost_models.models import ModelSpec
from cost_models.placement import axis_segments
from cost_models.pricing import Priced, price
from cost_models.remat import POLICIES
from cost_models.strategies import STRATEGIES, Shape, strategies_for
from cost_models.topology import AxisLinks, Topology
from cost_models.units import GiB, MiB
from cost_models.vocabulary import AXES, DTYPE_BYTES, CPStrategy, LoadBalance, RematPolicy
from planner.options import SearchOptions, as_list, ordered_factorizations
from planner.plan import DEFAULT_BLOCK, Plan

BLOCK_PREFERENCE = (512, 1024, 2048, 256, 128)  # splash blocks: 512 first, larger when SMEM needs it


@dataclass(frozen=True)
class Rejection:
    """A candidate that cannot run, and why (the failed rule with its numbers)."""

    mesh: dict
    strategy: CPStrategy
    load_balance: LoadBalance
    remat: object  # a RematPolicy, or None when the rule does not depend on it
    category: str
    reason: str


@dataclass(frozen=True)
class Ranked:
    """A feasible candidate with its best placement and price."""

    plan: Plan
    estimate: Estimate


class Placement(NamedTuple):
    """A mesh laid on a topology: the logical axes and the physical dimensions, outermost
    first, and the links each collective group gets."""

    axis_order: tuple[str, ...]
    physical_order: tuple[str, ...]
    links: dict[str, AxisLinks]


class CandidateRow(NamedTuple):
    """One candidate the search prices: a mesh (sizes in `AXES` order), its balancing, remat
    policy and placement."""

    sizes: tuple[int, ...]
    load_balance: LoadBalance
    remat: RematPolicy
    placement: Placement


@dataclass
class SearchResult:
    """Everything the search found: ranked feasible candidates and every rejection."""

    case: Case
    options: SearchOptions
    ranked: list[Ranked]
    rejections: list[Rejection]
    candidates_priced: int = 0
    best_infeasible: list[Ranked] = field(default_factory=list)  # per strategy, the unfit one needing least HBM
    batch_note: str | None = None  # set when the default batch was reduced to make a plan fit

    @property
    def best(self) -> Ranked | None:
        return self.ranked[0] if self.ranked else None

    @property
    def model(self) -> ModelSpec:
        return self.case.model

    @property
    def topology(self) -> Topology:
        return self.case.topology

    @property
    def seq_len(self) -> int:
        return self.case.seq_len

    @property
    def global_batch(self) -> int:
        return self.case.global_batch


def _shape(model, seq_len, mesh, zigzag, *, shared_cores) -> Shape:
    return Shape(model, seq_len, mesh["context"], mesh["context_ulysses"], mesh["tensor"], zigzag, shared_cores)


def _block(layout_q, layout_kv, topo: Topology, zigzag: bool) -> tuple[int | None, str | None]:
    """Splash block size for a kernel call of (q × kv) tokens, or the SMEM rule that fails."""
    q = layout_q / (2 if zigzag else 1)
    options = [b for b in BLOCK_PREFERENCE if q % b == 0 and layout_kv % b == 0 and b <= q]
    no_limit = topo.chip.smem_bytes == 0  # a host has no SMEM limit
    for b in options:
        if no_limit or splash_smem_bytes(layout_q, layout_kv, block_q=b, block_kv=b) <= topo.chip.smem_bytes:
            return b, None
    if not options:
        return None, f"no splash block in {BLOCK_PREFERENCE} divides the {int(q)}-token kernel block"
    b = max(options)
    need = float(splash_smem_bytes(layout_q, layout_kv, block_q=b, block_kv=b))
    return None, (f"splash mask metadata for a {int(layout_q)}×{int(layout_kv)} kernel call needs "
                  f"{need / MiB:.1f} MiB SMEM at block {b} > {topo.chip.smem_bytes / MiB:.0f} MiB")


class _Placements:
    """Distinct realisable placements of a mesh on a topology, with the links each gives."""

    def __init__(self, topo: Topology):
        self.topo = topo
        dims = topo.physical_dims
        seen, self.phys_orders = set(), []
        for perm in itertools.permutations(range(len(dims))):
            key = tuple((dims[i].size, dims[i].wraps, dims[i].link_bw_bytes_per_s) for i in perm)
            if key not in seen:
                seen.add(key)
                self.phys_orders.append(perm)
        self._links = lru_cache(maxsize=None)(topo.links)

    @lru_cache(maxsize=None)
    def of(self, sizes: tuple[int, ...]) -> list[Placement]:
        """The placements of a mesh (sizes in AXES order) that give distinct links."""
        dims = self.topo.physical_dims
        trivial = [a for a, s in zip(AXES, sizes) if s == 1]
        active = [a for a, s in zip(AXES, sizes) if s > 1]
        size_of = dict(zip(AXES, sizes))
        out, seen = [], set()
        for axis_perm in itertools.permutations(active):
            order = tuple(trivial) + axis_perm
            for perm in self.phys_orders:
                segs = axis_segments(tuple(size_of[a] for a in order), tuple(dims[i].size for i in perm))
                if segs is None:
                    continue
                by_axis = {a: tuple(type(s)(perm[s.dim], s.size, s.stride) for s in ss) for a, ss in zip(order, segs)}
                links = group_links(self._links, by_axis)
                key = tuple((l.collective_bw_bytes_per_s, l.collective_latency_s, l.ring_bw_bytes_per_s,
                             l.ring_latency_s) for l in links.values())
                if key not in seen:
                    seen.add(key)
                    out.append(Placement(order, tuple(dims[i].name for i in perm), links))
        return out


def search(model: ModelSpec, seq_len: int, topo: Topology, options: SearchOptions) -> SearchResult:
    """Prices every candidate and ranks the feasible ones (see the module docstring)."""
    batch = options.global_batch(seq_len, host=topo.chip.kind.shares_cores)
    case = Case(model, topo, seq_len, batch)
    fixed = options.axes_fixed()
    meshes = ordered_factorizations(topo.num_devices, len(AXES),
                                    {AXES.index(a): s for a, s in fixed.items()})
    rejections: list[Rejection] = []
    groups: dict[CPStrategy, list] = {}
    placements = _Placements(topo)

    for sizes in meshes:
        mesh = dict(zip(AXES, sizes))
        batch_shards = mesh["data"] * mesh["fsdp"]
        for strategy in strategies_for(mesh["context"], mesh["context_ulysses"]):
            if strategy not in options.strategies:
                continue
            impl = STRATEGIES[strategy]
            for lb in as_list(options.load_balance):
                zig = lb is LoadBalance.ZIGZAG
                if zig and not impl.balances_load:
                    if LoadBalance.NONE in options.load_balance:
                        continue  # the unbalanced candidate is the same plan
                    rejections.append(Rejection(mesh, strategy, lb, None, "load balance",
                                                f"only zigzag was allowed; {strategy.value} has nothing to balance"))
                    continue
                violation = batch_split_violation(batch, batch_shards) or impl.check(
                    _shape(model, seq_len, mesh, zig, shared_cores=topo.chip.kind.shares_cores))
                if violation:
                    rejections.append(Rejection(mesh, strategy, lb, None, violation.category, violation.reason))
                    continue
                groups.setdefault(strategy, []).append((sizes, lb))

    ranked: list[Ranked] = []
    best_infeasible: list[Ranked] = []
    priced_count = 0
    for strategy, cands in groups.items():
        rows = [CandidateRow(sizes, lb, remat, placement) for sizes, lb in cands for remat in as_list(options.remat)
                for placement in placements.of(sizes)]
        if not rows:
            continue
        x = _columns(case, strategy, rows, options)
        priced = price(x)
        priced_count += len(rows)
        # SMEM decides the block; a candidate whose kernel metadata cannot fit any block is rejected
        blocks, block_reasons = _blocks_for(x)
        mem = priced.hbm_total
        cap = topo.hbm_bytes_per_device
        per_candidate: dict[tuple, int] = {}
        for i, row in enumerate(rows):
            key = (row.sizes, row.load_balance, row.remat)
            j = per_candidate.get(key)
            if j is None or priced.step_time_s[i] < priced.step_time_s[j]:  # first placement wins ties
                per_candidate[key] = i
        strategy_least = None
        for (sizes, lb, remat), i in per_candidate.items():
            mesh = dict(zip(AXES, sizes))
            if block_reasons[i] or mem[i] > cap:
                if block_reasons[i]:
                    rejections.append(Rejection(mesh, strategy, lb, remat, "smem", block_reasons[i]))
                else:
                    parts = {k: float(np.broadcast_to(v, mem.shape)[i]) for k, v in priced.memory.items()}
                    top = max(parts, key=parts.get)
                    rejections.append(Rejection(mesh, strategy, lb, remat, "hbm",
                                                f"needs {mem[i] / GiB:.1f} GiB > {cap / GiB:.1f} GiB HBM "
                                                f"(largest: {top} {parts[top] / GiB:.1f} GiB)"))
                if strategy_least is None or mem[i] < mem[strategy_least]:
                    strategy_least = i
                continue
            ranked.append(_ranked(x=x, priced=priced, index=i, row=rows[i], block=blocks[i], options=options))
        if strategy_least is not None:
            best_infeasible.append(_ranked(x=x, priced=priced, index=strategy_least, row=rows[strategy_least],
                                           block=blocks[strategy_least] or DEFAULT_BLOCK, options=options))
    ranked.sort(key=_rank_key)
    best_infeasible.sort(key=lambda r: r.estimate.hbm_bytes_per_device)
    return SearchResult(case, options, ranked, rejections, priced_count, best_infeasible)


def _rank_key(r: Ranked):
    p = r.plan
    # 12 significant digits: equal plans computed along different paths still tie
    return (float(f"{r.estimate.step_time_s / r.estimate.tokens_per_step:.12g}"), -r.estimate.headroom_bytes,
            p.mesh_sizes, p.cp_strategy.value, p.load_balance.value, p.remat.value, p.axis_order, p.physical_order)


def _columns(case: Case, strategy: CPStrategy, rows: list[CandidateRow], options: SearchOptions) -> Candidates:
    """The rows as columns, each with the splash block SMEM allows (`DEFAULT_BLOCK` where none does)."""
    sizes = np.array([row.sizes for row in rows], dtype=float)
    links, ring_link = link_columns({group: [row.placement.links[group] for row in rows]
                                     for group in rows[0].placement.links})
    default_blocks = np.full(len(rows), float(DEFAULT_BLOCK))
    x = Candidates(
        case=case, strategy=strategy,
        data=sizes[:, 0], fsdp=sizes[:, 1], ring=sizes[:, 2], ulysses=sizes[:, 3], tensor=sizes[:, 4],
        remat=[POLICIES.index(row.remat) for row in rows],
        zigzag=[row.load_balance is LoadBalance.ZIGZAG for row in rows],
        block_q=default_blocks, block_kv=default_blocks, links=links, ring_link=ring_link,
        loss_chunk_tokens=options.loss_chunk_tokens, act_bytes=DTYPE_BYTES[options.compute_dtype],
        param_bytes=DTYPE_BYTES[options.param_dtype],
    )
    blocks, _ = _blocks_for(x)
    chosen = np.array([b or DEFAULT_BLOCK for b in blocks], dtype=float)
    return x.with_blocks(chosen, chosen)


def _blocks_for(x: Candidates) -> tuple[list, list]:
    """Per candidate: the splash block its kernel calls take (None where none fits), and why not."""
    lay = STRATEGIES[x.strategy].layout(x)
    q = np.broadcast_to(lay.q_len, x.ring.shape)
    kv = np.broadcast_to(lay.kv_len, x.ring.shape)
    cache: dict = {}
    blocks, reasons = [], []
    for qi, kvi, z in zip(q, kv, x.zigzag):
        key = (float(qi), float(kvi), bool(z))
        if key not in cache:
            cache[key] = _block(*key[:2], x.topology, key[2])
        b, why = cache[key]
        blocks.append(b)
        reasons.append(why)
    return blocks, reasons


def _ranked(*, x: Candidates, priced: Priced, index: int, row: CandidateRow, block: int,
            options: SearchOptions) -> Ranked:
    """Candidate `index` of a priced batch as a `Plan` with its `Estimate`."""
    case = x.case
    plan = Plan(model=case.model, topology=case.topology.name, seq_len=case.seq_len, global_batch=case.global_batch,
                mesh=tuple(zip(AXES, row.sizes)), axis_order=row.placement.axis_order,
                physical_order=row.placement.physical_order, cp_strategy=x.strategy, load_balance=row.load_balance,
                remat=row.remat, block_q=int(block), block_kv=int(block), loss_chunk_tokens=options.loss_chunk_tokens,
                param_dtype=options.param_dtype, compute_dtype=options.compute_dtype)
    return Ranked(plan, estimate_row(priced, index, x))
