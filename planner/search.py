"""The search: every mesh factorisation × CP strategy × load balancing × remat × placement,
at the number of sequences per step nearest the target that some plan fits.

Structural rules (heads, sequence splits, balancing) are judged once per (context,
context_ulysses, tensor) and do not depend on the batch (`SearchSpace`); the batch rule (whole
sequences per data × fsdp shard) picks the meshes a batch may use. Those are priced as numpy
columns, one strategy at a time, over every realisable placement; splash SMEM and HBM reject;
each candidate keeps its best placement. Ranking: predicted step time per token, then memory
headroom, then a deterministic key. A pure function of its inputs (caches hold only what the
inputs determine: placements per topology).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import NamedTuple

import numpy as np

from cost_models.accuracy import memory_margins
from cost_models.candidates import GROUP_AXES, Candidates, LinkColumns, both_backwards, link_columns, stacked
from cost_models.case import Case, ReadsCase, batch_split_violation
from cost_models.compute import DQ_REDUCTION_STEPS, splash_smem_bytes, splash_vmem_problem
from cost_models.errors import CpplanError
from cost_models.estimate import Estimate, estimate_row
from cost_models.experts import expert_axis_problem, expert_axis_sizes
from cost_models.models import ModelSpec
from cost_models.placement import digit_bounds, inner_sizes, span_segments, splits_no_digit, tiles
from cost_models.precision import fp8_refusal
from cost_models.pricing import Priced, choose_rows, peak_bytes, price, priced_rows
from cost_models.pricing.attention import price_attention
from cost_models.pricing.offload import (
    HOST_COPY_LIMIT_BYTES,
    host_capacity_bytes,
    host_copy_violation,
    largest_host_copy_bytes,
)
from cost_models.pricing.step import price_shapes, shape_runs
from cost_models.pricing.target import per_head_smem_bytes
from cost_models.remat import SEARCHED_CUSTOM, remat_code
from cost_models.strategies import STRATEGIES, Shape, Violation, strategies_for
from cost_models.strategies.base import splash_blocks
from cost_models.targets import Target
from cost_models.topology import AxisLinks, Segment, Topology, divisors
from cost_models.units import GiB, MiB, counted
from cost_models.vocabulary import AXES, DTYPE_BYTES, CPStrategy, LoadBalance, RematPolicy
from planner.options import SearchOptions, as_list, ordered_factorizations
from planner.plan import DEFAULT_BLOCK, Plan

BLOCK_PREFERENCE = (512, 1024, 2048, 256, 128)  # splash blocks; of equally fast ones, the first
_EXPERT = AXES.index("expert")
_INNER = tuple(AXES.index(a) for a in ("context", "context_ulysses", "tensor"))


def _batch_shards(sizes: tuple[int, ...]) -> int:
    """The batch shards of a mesh (sizes in `AXES` order): data × fsdp × expert."""
    return sizes[0] * sizes[1] * sizes[_EXPERT]


def _inner(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The (context, context_ulysses, tensor) of a mesh (sizes in `AXES` order): what the structural rules read."""
    return tuple(sizes[i] for i in _INNER)


@dataclass(frozen=True)
class Rejection:
    """A candidate that cannot run, and why (the failed rule with its numbers)."""

    mesh: dict
    strategy: CPStrategy
    load_balance: LoadBalance
    remat: object  # a RematPolicy, or None when the rule does not depend on it
    category: str
    reason: str
    remat_custom: tuple = ()  # a custom policy's placements


@dataclass(frozen=True)
class Ranked:
    """A feasible candidate with its best placement and price."""

    plan: Plan
    estimate: Estimate


class Placement(NamedTuple):
    """A mesh laid on a topology: the logical axes and the physical dimensions of a slice,
    outermost first, the links each collective group gets, and (over several slices) how many
    slices the data and fsdp axes span."""

    axis_order: tuple[str, ...]
    physical_order: tuple[str, ...]
    links: dict[str, AxisLinks]
    dcn_data: int = 1
    dcn_fsdp: int = 1


class CandidateRow(NamedTuple):
    """One candidate the search prices: a mesh (sizes in `AXES` order), its balancing, remat
    policy and placement."""

    sizes: tuple[int, ...]
    load_balance: LoadBalance
    remat: RematPolicy
    placement: Placement
    remat_custom: tuple = ()  # a custom policy's placements (`SEARCHED_CUSTOM`'s)


class RankedList(Sequence):
    """Feasible candidates in rank order; each becomes a `Ranked` (a `Plan` and its `Estimate`)
    when first read, so a caller that wants the best plan does not build ten thousand."""

    def __init__(self, entries: list[tuple], build: Callable[[tuple], Ranked]):
        self._entries = entries  # (rank key, strategy, …), sorted
        self._build = build
        self._built: dict[int, Ranked] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(index)
        if position not in self._built:
            self._built[position] = self._build(self._entries[position])
        return self._built[position]

    def best_where(self, test: Callable[[tuple[int, ...]], bool]) -> Ranked | None:
        """The first-ranked candidate whose mesh (sizes in `AXES` order) passes `test`, or None."""
        for position, entry in enumerate(self._entries):
            if test(entry[0][2]):
                return self[position]
        return None

    def mesh_sizes(self) -> list[tuple[int, ...]]:
        """Each candidate's mesh (sizes in `AXES` order), in rank order (no plan built)."""
        return [entry[0][2] for entry in self._entries]

    def best_of_each_strategy(self) -> dict[CPStrategy, Ranked]:
        """The first-ranked candidate of each strategy that has one, in rank order."""
        first: dict[CPStrategy, int] = {}
        for position, entry in enumerate(self._entries):
            first.setdefault(entry[1], position)
        return {strategy: self[position] for strategy, position in first.items()}


@dataclass
class SearchResult(ReadsCase):
    """Everything the search found: ranked feasible candidates and every rejection.

    `rejections` are listed when first asked for (a plan alone does not need the tens of
    thousands a pod has): those decided before pricing, in the meshes' order, then the priced ones.
    """

    case: Case
    options: SearchOptions
    ranked: RankedList
    unpriced_rejections: Callable[[], list[Rejection]]
    priced_rejections: list[Rejection]
    candidates_priced: int = 0
    best_infeasible: list[Ranked] = field(default_factory=list)  # per strategy, the unfit one needing least HBM
    batch_note: str | None = None  # set when the sequences per step differ from the target
    mask_note: str | None = None  # set when a window or documents as long as the sequence bound nothing
    target: Target = Target.CPPLAN  # the runtime the plans are priced for

    @cached_property
    def rejections(self) -> list[Rejection]:
        return self.unpriced_rejections() + self.priced_rejections

    @property
    def best(self) -> Ranked | None:
        return self.ranked[0] if self.ranked else None


def _block_options(
    layout_q, layout_kv, topo: Topology, zigzag: bool, *, head_dim: int, act_bytes: int, causal: bool
) -> tuple[list[int], str | None]:
    """The splash blocks (in `BLOCK_PREFERENCE` order) a kernel call of (q × kv) tokens can use
    within the chip's SMEM (a causal mask's metadata; a full mask keeps none) and scoped VMEM,
    or none and the rule that fails."""
    q = layout_q / (2 if zigzag else 1)
    options = [
        b for b in BLOCK_PREFERENCE if b <= q and splash_blocks(int(layout_q), int(layout_kv), b, b, q)[0] is not None
    ]
    if not options:
        return [], f"no splash block in {BLOCK_PREFERENCE} divides the {int(q)}-token kernel block"
    if topo.chip.kind.interprets_kernels:  # an interpreted kernel has no SMEM or VMEM limit
        return options, None
    vmem = {b: splash_vmem_problem(b, b, head_dim=head_dim, act_bytes=act_bytes, chip=topo.chip) for b in options}
    if all(vmem.values()):
        return [], vmem[min(options)]
    options = [b for b in options if not vmem[b]]
    if not causal:
        return options, None
    fitting = [
        b for b in options if splash_smem_bytes(layout_q, layout_kv, block_q=b, block_kv=b) <= topo.chip.smem_bytes
    ]
    if fitting:
        return fitting, None
    b = max(options)
    need = float(splash_smem_bytes(layout_q, layout_kv, block_q=b, block_kv=b))
    return [], (
        f"splash mask metadata for a {int(layout_q)}×{int(layout_kv)} kernel call needs "
        f"{need / MiB:.1f} MiB SMEM at block {b} > {topo.chip.smem_bytes / MiB:.0f} MiB"
    )


def _per_head_blocks(options: list[int], layout, topo: Topology, target: Target) -> tuple[list[int], str | None]:
    """Of the splash blocks `_block_options` allows, those whose per-head metadata (the target's
    rule) fits the chip's SMEM, or none and the rule that fails."""
    traits = target.traits

    def need(block: int) -> float:
        return float(
            per_head_smem_bytes(
                layout.q_heads, layout.q_len, layout.kv_len, block_q=block, block_kv=block, traits=traits
            )
        )

    fitting = [b for b in options if need(b) <= topo.chip.smem_bytes]
    if fitting:
        return fitting, None
    b = max(options)
    return [], (
        f"{target.value}'s splash metadata (per head, {int(traits.smem_bytes_per_block_pair)} bytes per block "
        f"pair) for {float(layout.q_heads):g} heads of {int(layout.q_len)}×{int(layout.kv_len)} needs "
        f"{need(b) / MiB:.1f} MiB SMEM at block {b} > {topo.chip.smem_bytes / MiB:.0f} MiB"
    )


def _dq_reduction_steps(strategy: CPStrategy, target: Target) -> int:
    """The rolled dq partials of the target's fused backward where its strategy runs tokamax's kernels
    (MaxText's ring kernel or tokamax splash): fewer bytes held and moved than one fp32 partial per key
    block, never slower; 0 elsewhere, where the flag changes nothing."""
    spec = STRATEGIES[strategy]
    tokamax = spec.maxtext_ring_kernel or spec.maxtext_tokamax_splash
    return DQ_REDUCTION_STEPS if target.traits.ring_dq_partials and tokamax else 0


def _chip_alone(topo: Topology) -> Topology:
    """One chip of `topo` on its own: what the splash block rule reads of a slice (the chip row and its
    devices), so that every slice of a chip shares its blocks."""
    return dataclasses.replace(topo, chip_dims=(1,) * len(topo.chip_dims), num_slices=1)


class _SplashBlocks:
    """The splash block of one strategy's kernel calls per (context, context_ulysses, tensor, zigzag) layout,
    or the SMEM rule that fails, on `_chip_alone`'s chip (the layout, not the slice, decides): each layout
    judged once, and where several blocks fit, the fastest, the blocks of every new layout priced as rows
    of one table."""

    def __init__(self, model: ModelSpec, seq_len: int, topo: Topology, target: Target, act_bytes: int, strategy):
        self.model, self.seq_len, self.topo, self.target = model, seq_len, topo, target
        self.act_bytes, self.strategy = act_bytes, strategy
        self._found: dict[tuple, tuple[int | None, str | None]] = {}

    def of(self, layouts: list[tuple[float, float, float, bool]]) -> list[tuple[int | None, str | None]]:
        """(block, None) or (None, the rule that fails) for each layout."""
        trials = []  # (layout, its blocks) where more than one fits
        for layout in dict.fromkeys(layouts):
            if layout not in self._found:
                options, reason = self._options(*layout)
                self._found[layout] = (options[0] if options else None, reason)
                if len(options) > 1:
                    trials.append((layout, options))
        if trials:
            self._fastest(trials)
        return [self._found[layout] for layout in layouts]

    def _options(self, ring: float, ulysses: float, tensor: float, zigzag: bool) -> tuple[list[int], str | None]:
        """The blocks a layout's kernel calls can use, in `BLOCK_PREFERENCE` order, or none and why."""
        model, topo, target = self.model, self.topo, self.target
        spec = STRATEGIES[self.strategy]
        lay = spec.layout(Shape(model, self.seq_len, ring, ulysses, tensor, zigzag, topo.chip.kind.shares_cores))
        options, reason = _block_options(
            float(lay.q_len),
            float(lay.kv_len),
            topo,
            zigzag,
            head_dim=model.head_dim,
            act_bytes=self.act_bytes,
            # local layers' tables are shrunk to their window: only global causal layers hold the whole table
            causal=any(mask.causal and not mask.local for mask, _ in model.layer_masks),
        )
        if (
            options
            and target.traits.per_head_metadata
            and spec.maxtext_per_head_metadata
            and not topo.chip.kind.interprets_kernels
        ):
            options, reason = _per_head_blocks(options, lay, topo, target)
        most = target.traits.ring_kernel_max_block
        if options and most and spec.maxtext_ring_kernel and not topo.chip.kind.interprets_kernels:
            options = [b for b in options if b <= most]
            if not options:
                reason = f"{target.value}'s ring kernel compiles with splash blocks up to {most} only"
        return options, reason

    def _fastest(self, trials: list[tuple[tuple, list[int]]]) -> None:
        """Each layout's fastest block: the block changes only the attention's price (grid steps, diagonal
        waste, SMEM), which scales with the batch, so the fastest for one sequence is the fastest for any."""
        rows = [(layout, float(b)) for layout, options in trials for b in options]
        ring, ulysses, tensor, zigzag = zip(*(layout for layout, _ in rows))
        blocks, n = [b for _, b in rows], len(rows)
        trial = Candidates(
            case=Case(self.model, self.topo, self.seq_len, 1),
            strategy=self.strategy,
            data=[1.0] * n,
            fsdp=[1.0] * n,
            ring=ring,
            ulysses=ulysses,
            tensor=tensor,
            remat=[0] * n,
            zigzag=zigzag,
            block_q=blocks,
            block_kv=blocks,
            links={},
            ring_link=LinkColumns([0.0] * n, [0.0] * n),
            dq_reduction_steps=_dq_reduction_steps(self.strategy, self.target),
        )
        times = price_attention(trial, STRATEGIES[self.strategy], traits=self.target.traits).total_s
        start = 0
        for layout, options in trials:
            # the first of equals, in preference order
            self._found[layout] = (options[int(np.argmin(times[start : start + len(options)]))], None)
            start += len(options)


@lru_cache(maxsize=64)
def _splash_blocks(
    model: ModelSpec, seq_len: int, topo: Topology, target: Target, act_bytes: int, strategy: CPStrategy
) -> _SplashBlocks:
    """One `_SplashBlocks` per chip (`_chip_alone`) and search inputs, shared by every slice of the chip."""
    return _SplashBlocks(model, seq_len, topo, target, act_bytes, strategy)


@lru_cache(maxsize=64)
def _judged(
    model: ModelSpec,
    seq_len: int,
    shares_cores: bool,
    target: Target,
    strategies: frozenset,
    load_balances: tuple[LoadBalance, ...],
) -> dict[tuple[int, ...], tuple]:
    """(context, context_ulysses, tensor) → `_judge_one`'s verdicts, filled as searches ask, shared by every
    slice of a chip kind (one key per search: hashing the model per mesh cost more than judging)."""
    return {}


def _judge_one(inputs: tuple, ring: int, ulysses: int, tensor: int) -> tuple[tuple, ...]:
    """(strategy, balancing, rule broken whatever the batch, structural rule broken) for one
    (context, context_ulysses, tensor) of the allowed strategies; `inputs` are `_judged`'s."""
    model, seq_len, shares_cores, target, strategies, load_balances = inputs
    out = []
    for strategy in strategies_for(ring, ulysses):
        if strategy not in strategies:
            continue
        impl = STRATEGIES[strategy]
        for lb in load_balances:
            zig = lb is LoadBalance.ZIGZAG
            if zig and not impl.balances(model):
                if LoadBalance.NONE in load_balances:
                    continue  # the unbalanced candidate is the same plan
                what = "a full (non-causal) mask" if impl.balances_load else strategy.value
                out.append(
                    (
                        strategy,
                        lb,
                        Violation("load balance", f"only zigzag was allowed; {what} has nothing to balance"),
                        None,
                    )
                )
                continue
            shape = Shape(model, seq_len, ring, ulysses, tensor, zig, shares_cores)
            out.append((strategy, lb, None, impl.check(shape) or _target_rule(impl, shape, target)))
    return tuple(out)


def _target_rule(spec, shape: Shape, target: Target) -> Violation | None:
    """Under a target with MaxText's rules, the first of them the candidate breaks."""
    if not target.traits.maxtext_rules:
        return None
    problems = spec.maxtext_rules(shape)
    return Violation("maxtext", problems[0]) if problems else None


class _GroupRow:
    """A group's links over the flattened positions `spans` under each physical order, filled for the orders
    a mesh asks of (`_Placements._fill`), and a number naming their figures (those that tell placements apart);
    None under the others."""

    __slots__ = ("spans", "figures", "links", "filled")

    def __init__(self, spans: tuple[tuple[int, int], ...], orders: int):
        self.spans = spans
        self.figures: list[int | None] = [None] * orders
        self.links: list[AxisLinks | None] = [None] * orders
        self.filled = 0  # the orders filled, a bit each


class _Placements:
    """Distinct realisable placements of a mesh on a topology, with the links each gives.

    A placement's links depend on where each logical axis lies in the flattened device order: an axis
    spans positions `inner` to `inner × size` (`inner_sizes`), a collective group the spans of its axes.
    The links of a group's spans are priced once per topology for every physical order at once, so a
    mesh's thousands of (axis order × physical order) placements are table look-ups.
    """

    def __init__(self, topo: Topology):
        self.topo = topo
        dims = topo.physical_dims
        seen, self.phys_orders = set(), []
        for perm in itertools.permutations(range(len(dims))):
            key = tuple((dims[i].size, dims[i].wraps, dims[i].link_bw_bytes_per_s) for i in perm)
            if key not in seen:
                seen.add(key)
                self.phys_orders.append(perm)
        self._dim_sizes = [tuple(dims[i].size for i in perm) for perm in self.phys_orders]
        self._dim_names = [tuple(dims[i].name for i in perm) for perm in self.phys_orders]
        self._dim_bounds = [digit_bounds(sizes) for sizes in self._dim_sizes]
        self._orders_at: dict[int, int] = {}  # a boundary's flattened position → `_orders_with_boundary`
        self._laid: dict[tuple[int, ...], tuple[list, dict]] = {}  # axis sizes → `_lay`
        self._group_rows: dict[tuple, _GroupRow] = {}  # a group's spans → `_group_row`
        self._figure_ids: dict[tuple[float, ...], int] = {}  # links' figures → a number naming them
        self._segment_links: dict[tuple, AxisLinks] = {}

    @lru_cache(maxsize=None)
    def of(self, sizes: tuple[int, ...]) -> list[Placement]:
        """The placements of a mesh (sizes in AXES order) that give distinct links.

        Over several slices each split of the slices between data and fsdp (MaxText's
        `dcn_data_parallelism` × `dcn_fsdp_parallelism`) that divides them is a placement of its
        own: the rest of the mesh lies on one slice, and the data and weight groups cross DCN.
        """
        if self.topo.num_slices == 1:
            return self._within_slice(sizes)
        one = _placements(dataclasses.replace(self.topo, num_slices=1))  # shared with the slice alone
        out = []
        for dcn_data, dcn_fsdp in dcn_splits(sizes, self.topo.num_slices):
            for p in one._within_slice((sizes[0] // dcn_data, sizes[1] // dcn_fsdp) + sizes[2:]):
                links = {
                    **p.links,
                    "data": self.topo.across_slices(p.links["data"], dcn_data),
                    "weights": self.topo.across_slices(p.links["weights"], dcn_fsdp),
                    "expert_weights": self.topo.across_slices(p.links["expert_weights"], dcn_fsdp),
                }
                out.append(Placement(p.axis_order, p.physical_order, links, dcn_data, dcn_fsdp))
        return out

    @lru_cache(maxsize=None)
    def _within_slice(self, sizes: tuple[int, ...]) -> list[Placement]:
        """The placements of a mesh of one slice's devices that give distinct links, each the first (axis
        order, then physical order) to give them."""
        names = tuple(a for a, s in zip(AXES, sizes) if s > 1)
        active = [s for s in sizes if s > 1]
        out, seen = [], set()
        for order, axis_order, positions in _axis_orders(names):
            # axes of size 1 take no part of any dimension: the spans are the active axes'
            axis_sizes = tuple(map(active.__getitem__, order))
            tiling, orders, rows_at = self._laid.get(axis_sizes) or self._lay(axis_sizes)
            if not tiling:
                continue
            rows = [rows_at.get(p) or self._laid_row(axis_sizes, p) for p in positions]  # a look-up, most times
            for row in rows:
                if orders & ~row.filled:
                    self._fill(row, orders)
            keys = list(zip(*(row.figures for row in rows)))  # per physical order, the figures of every group
            for k in tiling:
                if keys[k] not in seen:
                    seen.add(keys[k])
                    links = {g: row.links[k] for g, row in zip(GROUP_AXES, rows)}
                    out.append(Placement(axis_order, self._dim_names[k], links))
        return out

    def _links(self, segments: tuple[tuple[int, int, int], ...]) -> AxisLinks:
        """`Topology.links` of segments given as (dimension, size, stride), once per topology (spans on the
        inner dimensions lie alike under every physical order that keeps those inside)."""
        if segments not in self._segment_links:
            self._segment_links[segments] = self.topo.links(tuple(Segment(*s) for s in segments))
        return self._segment_links[segments]

    def _lay(self, axis_sizes: tuple[int, ...]) -> tuple[list[int], int, dict]:
        """The physical orders (indices into `phys_orders`, and a bit each) that axes of these sizes (outermost
        first) tile, and an empty table of group rows by the positions of a group's axes (`_laid_row`); once per
        sizes, shared by every mesh whose axes take them in this order. The axes cover the slice, so they tile
        an order where each boundary between them splits none of its digits (`tiles`)."""
        orders = (1 << len(self.phys_orders)) - 1
        for position in inner_sizes(axis_sizes):
            orders &= self._orders_with_boundary(position)
        laid = self._laid[axis_sizes] = ([k for k in range(len(self.phys_orders)) if orders >> k & 1], orders, {})
        return laid

    def _orders_with_boundary(self, position: int) -> int:
        """The physical orders (a bit each) whose digits a boundary between axes at flattened `position` splits
        none of; once per position, shared by every mesh."""
        if position not in self._orders_at:
            self._orders_at[position] = sum(
                1 << k for k, bounds in enumerate(self._dim_bounds) if splits_no_digit(position, bounds)
            )
        return self._orders_at[position]

    def _laid_row(self, axis_sizes: tuple[int, ...], positions: tuple[int, ...]) -> _GroupRow:
        """`_group_row` of a group whose axes take `positions` (ascending) of axes of `axis_sizes` (outermost
        first): an axis spans the flattened positions `inner` to `inner × size` (`inner_sizes`)."""
        inner = inner_sizes(axis_sizes)
        row = self._group_row(_joined((inner[p], inner[p] * axis_sizes[p]) for p in positions))
        self._laid[axis_sizes][2][positions] = row
        return row

    def _group_row(self, spans: tuple[tuple[int, int], ...]) -> _GroupRow:
        """The row of a group over the flattened positions `spans`, one per topology, filled as orders ask."""
        if spans not in self._group_rows:
            self._group_rows[spans] = _GroupRow(spans, len(self.phys_orders))
        return self._group_rows[spans]

    def _fill(self, row: _GroupRow, orders: int) -> None:
        """`row`'s links and figures under the physical orders of `orders` (a bit each), where axes tile them: a
        group's spans then take whole digits."""
        for k, (perm, dim_sizes) in enumerate(zip(self.phys_orders, self._dim_sizes)):
            if orders >> k & 1 and not row.filled >> k & 1:
                digits = [_span_digits(low, high, dim_sizes) for low, high in row.spans]
                a = self._links(tuple((perm[dim], size, stride) for span in digits for dim, size, stride in span))
                figure = (a.collective_bw_bytes_per_s, a.collective_latency_s, a.ring_bw_bytes_per_s, a.ring_latency_s)
                row.figures[k] = self._figure_ids.setdefault(figure, len(self._figure_ids))
                row.links[k] = a
        row.filled |= orders

    @lru_cache(maxsize=None)
    def link_table(self, sizes: tuple[int, ...]) -> tuple[dict[str, LinkColumns], LinkColumns]:
        """The links of each placement of a mesh as columns (one entry per placement, in `of` order)."""
        placements = self.of(sizes)
        return link_columns({group: [p.links[group] for p in placements] for group in placements[0].links})


@lru_cache(maxsize=None)
def _axis_orders(names: tuple[str, ...]) -> tuple[tuple, ...]:
    """Every order of a mesh's axes of more than one device (`names`, in `AXES` order), outermost first and in
    `itertools.permutations`' order: (indices into `names`, the whole axis order with the axes of size 1
    outside, and per group of `GROUP_AXES` the positions its axes take, ascending). The same for every mesh
    with those axes, on any topology."""
    trivial = tuple(a for a in AXES if a not in names)
    out = []
    for order in itertools.permutations(range(len(names))):
        laid = [names[i] for i in order]
        positions = tuple(tuple(sorted(laid.index(a) for a in axes if a in laid)) for axes in GROUP_AXES.values())
        out.append((order, trivial + tuple(laid), positions))
    return tuple(out)


@lru_cache(maxsize=1 << 16)
def _span_digits(low: int, high: int, dim_sizes: tuple[int, ...]) -> tuple[tuple[int, int, int], ...] | None:
    """The segments of the flattened positions `low` to `high` on dimensions of `dim_sizes` as (dimension, size,
    stride) (`span_segments`), or None where the span splits a digit of a dimension (`tiles`): the same on
    every slice whose dimensions have those sizes, so kept across slices."""
    if not tiles((high // low, low), dim_sizes):
        return None
    return tuple((s.dim, s.size, s.stride) for s in span_segments(low, high, dim_sizes))


def _joined(spans) -> tuple[tuple[int, int], ...]:
    """Flattened positions (low, high) of several axes as a group's spans: adjacent spans joined, inner first."""
    out: list[tuple[int, int]] = []
    for low, high in sorted(spans):
        if out and out[-1][1] == low:
            out[-1] = (out[-1][0], high)
        else:
            out.append((low, high))
    return tuple(out)


def dcn_splits(sizes: tuple[int, ...], slices: int) -> list[tuple[int, int]]:
    """The (dcn_data, dcn_fsdp) splits of `slices` slices that a mesh (sizes in AXES order) allows:
    data and fsdp each span a divisor of their size, together every slice."""
    return [(d, slices // d) for d in divisors(slices) if sizes[0] % d == 0 and sizes[1] % (slices // d) == 0]


@lru_cache(maxsize=8)
def _placements(topo: Topology) -> _Placements:
    """One placement cache per topology, shared by every search on it (a sweep, a max_seq_len probe)."""
    return _Placements(topo)


class _Verdict(NamedTuple):
    """A (mesh, strategy, balancing) candidate before the batch: its batch shards, and the rule it
    breaks whatever the batch (`always`) or unless the batch splits (`structural`)."""

    sizes: tuple[int, ...]
    strategy: CPStrategy
    load_balance: LoadBalance
    shards: int
    always: Violation | None
    structural: Violation | None


class _Group(NamedTuple):
    """The priceable rows of one strategy: each row is a sound verdict × remat policy × placement,
    kept as indices (a `CandidateRow` is built only for the rows a result reports), with columns."""

    positions: np.ndarray  # the row's verdict (its position, `SearchSpace._sound_with`)
    remat: np.ndarray  # index into the allowed remat policies (`as_list` order)
    placement: np.ndarray  # index into the placements of the verdict's mesh
    x: Candidates


class _Priced(NamedTuple):
    """One strategy's rows priced at one batch; `local` holds each row's local-layer strategy (None: the
    strategy runs every layer), for models mixing masks."""

    strategy: CPStrategy
    rows: _Group
    priced: Priced
    local: np.ndarray | None = None
    fused: np.ndarray | None = None  # each row's `Plan.fused_attention_backward` (None: False for every row)

    @property
    def x(self) -> Candidates:
        return self.rows.x


class SearchSpace:
    """The part of a search that does not depend on the batch, done once and priced at any batch.

    The structural rules (heads, sequence splits, balancing) and the placements depend on the
    mesh, not on the sequences per step; the batch enters only through the data × fsdp split and
    through memory and time that scale with sequences per shard. A batch prices the structurally
    sound rows whose shards divide it.
    """

    def __init__(
        self,
        model: ModelSpec,
        seq_len: int,
        topo: Topology,
        options: SearchOptions,
        *,
        shard_counts: "frozenset[int] | None" = None,
        target: Target = Target.CPPLAN,
    ):
        """Args:
            model, seq_len, topo, options: the search's inputs.
            shard_counts: only meshes whose data × fsdp is one of these (None: every mesh); a
                caller that prices a known batch needs only its divisors.
            target: the runtime the plans are for: its price, and under MaxText only the plans
                MaxText accepts, with splash blocks its per-head metadata fits.
        Raises:
            CpplanError: the fixed mesh axes do not cover the topology's devices.
        """
        experts = expert_axis_sizes(model) if target.traits.expert_parallelism else (1,)
        fixed_expert = dict(options.mesh).get("expert", 1)
        if fixed_expert > 1 and not target.traits.expert_parallelism:
            raise CpplanError(
                f"mesh expert={fixed_expert}: cpplan's runtime runs every expert on every device over its own "
                f"tokens, with no expert parallelism; plan it for MaxText (`--target maxtext`), or leave expert out."
            )
        problem = options.mesh_problem(topo, implied={"expert": 1} if len(experts) == 1 else None)
        if problem:
            raise CpplanError(problem)
        self.model, self.mask_note = model.within(seq_len)
        self.seq_len, self.topology, self.options = seq_len, topo, options
        self.target = target
        self._memory_margins = memory_margins(topo.chip.name, target.value)
        self._chip = _chip_alone(topo)  # what the splash block rule reads of the slice
        fixed = options.axes_fixed()
        problem = "expert" in fixed and expert_axis_problem(model, fixed["expert"])
        if problem:
            raise CpplanError(f"mesh {problem}.")
        if len(experts) == 1:  # a dense model: `expert` is one device, and the meshes are those without it
            fixed = {**fixed, "expert": experts[0]}
        meshes = ordered_factorizations(topo.num_devices, len(AXES), {AXES.index(a): s for a, s in fixed.items()})
        meshes = [sizes for sizes in meshes if sizes[_EXPERT] in experts]
        if shard_counts is not None:
            meshes = [sizes for sizes in meshes if _batch_shards(sizes) in shard_counts]
        if topo.num_slices > 1:  # only data and fsdp span slices: the rest of a mesh must fit in one
            # the splits read data and fsdp alone: judged once per pair of the many meshes sharing it
            splits: dict[tuple[int, int], bool] = {}
            for sizes in meshes:
                if sizes[:2] not in splits:
                    splits[sizes[:2]] = bool(dcn_splits(sizes, topo.num_slices))
            meshes = [sizes for sizes in meshes if splits[sizes[:2]]]
        self._meshes = meshes
        self._judge_inputs = (
            self.model,
            seq_len,
            topo.chip.kind.shares_cores,
            target,
            options.strategies,
            tuple(as_list(options.load_balance)),
        )
        self._judgements = _judged(*self._judge_inputs)  # (context, context_ulysses, tensor) → `_judge_one`
        # batch shards → (index in `meshes`, mesh), in the meshes' order; the rules are judged per batch shards
        # when first asked (a search prices a few of a pod's many shard counts)
        self._meshes_of: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
        for index, sizes in enumerate(meshes):
            self._meshes_of.setdefault(_batch_shards(sizes), []).append((index, sizes))
        # a verdict's position: its mesh's index times the most verdicts a mesh has, plus its place among them,
        # so that positions follow the meshes' order whichever shard counts are judged
        self._per_mesh = len(options.strategies) * len(self._judge_inputs[-1])
        # batch shards → (first position, mesh, its sound (strategy, balancing)), in the meshes' order
        self._sound_meshes: dict[int, list[tuple[int, tuple[int, ...], list[tuple]]]] = {}
        self._sound: dict[int, list[tuple[int, _Verdict]]] = {}  # batch shards → (position, verdict), once asked
        self._sound_at: dict[int, _Verdict] = {}  # position → sound verdict, of the batch shards asked
        self._sound_of: dict[tuple[int, ...], list[tuple]] = {}  # (context, …) → its sound (strategy, balancing)
        self._groups: dict[int, dict[CPStrategy, _Group]] = {}
        self._least: dict[tuple[int, int], float] = {}
        self._blocks: dict[int, tuple[int | None, str | None]] = {}  # verdict position → splash block, or why none
        self._block_fits = np.zeros(len(meshes) * self._per_mesh, dtype=bool)  # by verdict position, once judged
        # (policy, custom placements) in the allowed policies' order, `custom` as each of `SEARCHED_CUSTOM`
        self._remats = [
            (policy, custom)
            for policy in as_list(options.remat)
            for custom in (SEARCHED_CUSTOM if policy is RematPolicy.CUSTOM else ((),))
        ]

    @property
    def shard_counts(self) -> list[int]:
        """The data × fsdp sizes of the structurally sound candidates, ascending."""
        return [shards for shards in sorted(self._meshes_of) if self._sound_meshes_with(shards)]

    def sound_within(self, most: float) -> bool:
        """Whether some structurally sound candidate has at most `most` batch shards (judging the fewest first)."""
        return any(self._sound_meshes_with(shards) for shards in sorted(self._meshes_of) if shards <= most)

    def _sound_meshes_with(self, shards: int) -> list[tuple[int, tuple[int, ...], list[tuple]]]:
        """(first position, mesh, its sound (strategy, balancing)) of the meshes with `shards` batch shards that
        have a sound verdict, in the meshes' order: judged when first asked for."""
        if shards not in self._sound_meshes:
            self._sound_meshes[shards] = [
                (index * self._per_mesh, sizes, sound)
                for index, sizes in self._meshes_of.get(shards, [])
                if (sound := self._sound_of_inner(_inner(sizes)))
            ]
        return self._sound_meshes[shards]

    def _sound_of_inner(self, inner: tuple[int, ...]) -> list[tuple]:
        """The (strategy, balancing) of a (context, context_ulysses, tensor) that break no rule whatever the
        batch, nor a structural one (the rules look at those axes only, so a judgement serves every data × fsdp
        split)."""
        if inner not in self._sound_of:
            self._sound_of[inner] = [
                (s, lb) for s, lb, always, rule in self._judgement(inner) if always is None and rule is None
            ]
        return self._sound_of[inner]

    def _judgement(self, inner: tuple[int, ...]) -> tuple[tuple, ...]:
        """`_judge_one` of a (context, context_ulysses, tensor), once per chip kind and search inputs (`_judged`)."""
        if inner not in self._judgements:
            self._judgements[inner] = _judge_one(self._judge_inputs, *inner)
        return self._judgements[inner]

    def _sound_with(self, shards: int) -> list[tuple[int, _Verdict]]:
        """(position, verdict) of the sound verdicts with `shards` batch shards, in the meshes' order: made when
        first asked for (a batch prices a few of a pod's many shard counts)."""
        if shards not in self._sound:
            found = self._sound[shards] = []
            for first, sizes, sound in self._sound_meshes_with(shards):
                for position, (strategy, lb) in enumerate(sound, first):
                    v = self._sound_at[position] = _Verdict(sizes, strategy, lb, shards, None, None)
                    found.append((position, v))
        return self._sound[shards]

    def _group(self, shards: int) -> "dict[CPStrategy, _Group]":
        """Per strategy, the priceable rows of the sound meshes with `shards` batch shards (built once)."""
        if shards not in self._groups:
            placements = _placements(self.topology)
            remats = len(self._remats)
            by_strategy: dict[CPStrategy, list[tuple[int, _Verdict]]] = {}
            for position, v in self._sound_with(shards):
                by_strategy.setdefault(v.strategy, []).append((position, v))
            case = Case(self.model, self.topology, self.seq_len, shards)
            groups = {}
            for strategy, verdicts in by_strategy.items():
                verdicts = [(position, v) for position, v in verdicts if placements.of(v.sizes)]
                if not verdicts:
                    continue
                # rows run verdict by verdict, remat policies outside placements, as the ranking's ties expect
                counts = np.array([len(placements.of(v.sizes)) for _, v in verdicts])
                per_verdict = remats * counts
                positions = np.repeat([position for position, _ in verdicts], per_verdict)
                within = np.arange(per_verdict.sum()) - np.repeat(np.cumsum(per_verdict) - per_verdict, per_verdict)
                remat, placement = np.divmod(within, np.repeat(counts, per_verdict))
                # each row's entry in its verdicts' link tables, laid end to end
                entry = np.repeat(np.cumsum(counts) - counts, per_verdict) + placement
                x = self._group_columns(case, strategy, verdicts, per_verdict, remat, entry, placements)
                groups[strategy] = _Group(positions, remat, placement, x)
            self._groups[shards] = groups
        return self._groups[shards]

    def _group_columns(
        self,
        case: Case,
        strategy: CPStrategy,
        verdicts: list,
        per_verdict: np.ndarray,
        remat: np.ndarray,
        entry: np.ndarray,
        placements: _Placements,
    ) -> Candidates:
        """The columns of a group's rows, each with the splash block SMEM allows (`DEFAULT_BLOCK`
        where none does; the verdict's block rule then rejects it); `entry` is each row's placement in
        the verdicts' link tables laid end to end."""
        opts = self.options
        sizes = np.repeat(np.array([v.sizes for _, v in verdicts], dtype=float), per_verdict, axis=0)
        tables = [placements.link_table(v.sizes) for _, v in verdicts]

        def stacked(get) -> LinkColumns:
            return LinkColumns(
                np.concatenate([get(t).bw for t in tables])[entry],
                np.concatenate([get(t).latency for t in tables])[entry],
            )

        blocks = self._blocks_of([position for position, _ in verdicts], strategy)
        block = np.repeat([float(b or DEFAULT_BLOCK) for b, _ in blocks], per_verdict)
        return Candidates(
            case=case,
            strategy=strategy,
            data=sizes[:, 0],
            fsdp=sizes[:, 1],
            ring=sizes[:, 2],
            ulysses=sizes[:, 3],
            tensor=sizes[:, 4],
            expert=sizes[:, _EXPERT],
            remat=np.array([remat_code(p, c, SEARCHED_CUSTOM) for p, c in self._remats])[remat],
            remat_presets=SEARCHED_CUSTOM,
            zigzag=np.repeat([v.load_balance is LoadBalance.ZIGZAG for _, v in verdicts], per_verdict),
            block_q=block,
            block_kv=block,
            links={group: stacked(lambda t, g=group: t[0][g]) for group in tables[0][0]},
            ring_link=stacked(lambda t: t[1]),
            loss_chunk_tokens=opts.loss_chunk_tokens,
            act_bytes=DTYPE_BYTES[opts.compute_dtype],
            param_bytes=DTYPE_BYTES[opts.param_dtype],
            mu_bytes=DTYPE_BYTES[opts.mu_dtype],
            dq_reduction_steps=_dq_reduction_steps(strategy, self.target),
            quantization=opts.quantization,
        )

    def _blocks_of(self, positions: list[int], strategy: CPStrategy) -> list[tuple[int | None, str | None]]:
        """The splash block of each verdict's kernel calls (its layout does not depend on placement,
        remat or batch), or the SMEM rule that fails."""
        new = [position for position in positions if position not in self._blocks]
        if new:
            verdicts = [self._sound_at[position] for position in new]
            layouts = [(*map(float, _inner(v.sizes)), v.load_balance is LoadBalance.ZIGZAG) for v in verdicts]
            act_bytes = DTYPE_BYTES[self.options.compute_dtype]
            blocks = _splash_blocks(self.model, self.seq_len, self._chip, self.target, act_bytes, strategy)
            for position, (block, reason) in zip(new, blocks.of(layouts)):
                self._blocks[position] = (block, reason)
                self._block_fits[position] = reason is None
        return [self._blocks[position] for position in positions]

    def row(self, rows: _Group, i: int) -> CandidateRow:
        """Row `i` of a group as a `CandidateRow`."""
        v = self._sound_at[int(rows.positions[i])]
        placement = _placements(self.topology).of(v.sizes)[int(rows.placement[i])]
        policy, custom = self._remats[int(rows.remat[i])]
        return CandidateRow(v.sizes, v.load_balance, policy, placement, custom)

    @cached_property
    def verdicts(self) -> list[_Verdict]:
        """Each mesh × allowed strategy × balancing with the rules it breaks, in the meshes' order (a
        verdict's position is its index); built when the rejections are listed."""
        out = []
        for sizes in self._meshes:
            shards = _batch_shards(sizes)
            out += [
                _Verdict(sizes, strategy, lb, shards, always, structural)
                for strategy, lb, always, structural in self._judgement(_inner(sizes))
            ]
        return out

    def _priced(self, batch: int, shards: "int | None" = None) -> list[_Priced]:
        """Every strategy's sound rows whose shards divide `batch` (or are `shards`), in the order of
        the meshes, priced."""
        case = Case(self.model, self.topology, self.seq_len, batch)
        wanted = [shards] if shards is not None else [s for s in self._meshes_of if batch % s == 0]
        per_strategy: dict[CPStrategy, list[_Group]] = {}
        for s in wanted:
            for strategy, group in self._group(s).items():
                per_strategy.setdefault(strategy, []).append(group)
        out = []
        # strategies in the order their first candidate appears, as the rejections list them
        first = {strategy: min(int(g.positions[0]) for g in groups) for strategy, groups in per_strategy.items()}
        for strategy in sorted(per_strategy, key=first.get):
            groups = per_strategy[strategy]
            if len(groups) == 1:
                rows = groups[0]._replace(x=dataclasses.replace(groups[0].x, case=case))
            else:
                order = np.argsort(np.concatenate([g.positions for g in groups]), kind="stable")
                rows = _Group(
                    *(
                        np.concatenate([getattr(g, name) for g in groups])[order]
                        for name in ("positions", "remat", "placement")
                    ),
                    stacked([g.x for g in groups], order, case),
                )
            out.append(self._with_local_strategies(self._with_fused_backward(strategy, rows)))
        return out

    @property
    def _separate_backward_only(self) -> bool:
        """Whether every row runs splash's separate backward kernels (`_with_fused_backward`)."""
        return self.target.traits.maxtext_rules or len(self.model.layer_masks) > 1 or self.model.global_mask.local

    @property
    def _chooses_local_strategies(self) -> bool:
        """Whether each row's local layers take the strategy that suits them (`_with_local_strategies`)."""
        return len(self.model.layer_masks) > 1 and not self.target.traits.maxtext_rules

    def _with_fused_backward(self, strategy: CPStrategy, rows: _Group) -> _Priced:
        """`rows` priced; on cpplan's runtime, each row's attention backward as splash's fused kernel where
        that fits and makes the step faster: its dq partials take memory the separate kernels do not (both
        priced in one table, `both_backwards`). Not for a model mixing masks, whose local layers' strategy
        is chosen per row on the separate kernels; MaxText's choice is its kernels'
        (`StrategySpec.maxtext_kernel_calls`)."""
        if self._separate_backward_only:
            return _Priced(strategy, rows, price(rows.x, target=self.target))
        n = len(rows.positions)
        both = price(both_backwards(rows.x), target=self.target)
        separate, fused = priced_rows(both, slice(None, n)), priced_rows(both, slice(n, None))
        fit = both.hbm_total <= self.topology.hbm_bytes_per_device
        fits, fits_fused = fit[:n], fit[n:]
        # a plan that fits neither way keeps the separate kernels: the less memory, the nearer to fitting
        take = fits_fused & (~fits | (fused.step_time_s < separate.step_time_s))
        return _Priced(strategy, rows, choose_rows(take, fused, separate), fused=take)

    def _with_local_strategies(self, p: _Priced) -> _Priced:
        """For a model mixing masks, each row's local layers under whichever allowed strategy of the same
        mesh makes its step faster (or alone makes it fit); MaxText runs one strategy for every layer."""
        if not self._chooses_local_strategies:
            return p
        local = np.full(len(p.rows.positions), None, dtype=object)
        priced, cap = p.priced, self.topology.hbm_bytes_per_device
        for other in self.options.strategies:
            runs = self._local_strategy_runs(p, other)
            if not runs.any():
                continue
            alternative = price(dataclasses.replace(p.x, local_strategy=other), target=self.target)
            fits, fits_other = priced.hbm_total <= cap, alternative.hbm_total <= cap
            faster = alternative.step_time_s < priced.step_time_s
            take = runs & ((fits_other & ~fits) | ((fits_other == fits) & faster))
            if take.any():
                priced, local = choose_rows(take, alternative, priced), np.where(take, other, local)
        return p._replace(priced=priced, local=local)

    def _local_strategy_runs(self, p: _Priced, other: CPStrategy) -> np.ndarray:
        """Per row, whether `other` can run the local layers on the row's mesh beside `p.strategy`: its own
        verdict on the same context and tensor axes and balancing breaks no rule."""
        if other is p.strategy:
            return np.zeros(len(p.rows.positions), dtype=bool)
        positions, which = np.unique(p.rows.positions, return_inverse=True)
        verdicts = (self._sound_at[position] for position in positions.tolist())
        runs = [(other, v.load_balance) in self._sound_of_inner(_inner(v.sizes)) for v in verdicts]
        return np.array(runs, dtype=bool)[which.reshape(-1)]

    def _block_ok(self, p: _Priced) -> np.ndarray:
        """Per row of a priced batch: whether its splash block fits SMEM."""
        return self._block_fits[p.rows.positions]

    def _host_ok(self, p: _Priced) -> np.ndarray:
        """Per row of a priced batch: whether its offloaded activations fit the host memory of a
        device (`Plan.check` asks the same of one plan), and the TPU compiler makes its copies to the host."""
        return (p.priced.host_bytes <= host_capacity_bytes(self.topology)) & self._copies_ok(p.rows.x)

    @staticmethod
    def _copies_ok(x) -> np.ndarray:
        """Per candidate: whether the TPU compiler makes its layer loop's copies to the host
        (`cost_models.pricing.offload.HOST_COPY_LIMIT_BYTES`)."""
        return largest_host_copy_bytes(x) < HOST_COPY_LIMIT_BYTES

    def fits(self, shards: int, per_shard: int, *, surely: bool = False) -> bool:
        """Whether some candidate with `shards` batch shards fits `per_shard` sequences in each; `surely`:
        with the compiler's largest measured excess over the memory price to spare (not marginal)."""
        cap = self.topology.hbm_bytes_per_device / (1 + self._memory_margins[0] if surely else 1)
        known = self._fits_unpriced(shards, per_shard, cap)
        return self._least_hbm(shards, per_shard) <= cap if known is None else known

    def _fits_unpriced(self, shards: int, per_shard: int, cap: float) -> bool | None:
        """`fits` read off the part of the price that does not read the links (memory and host bytes, once per
        mesh and remat policy: `price_shapes`) where that decides it: a row fits whichever way its attention
        backward runs, or none fits either way. None where it does not (the faster way runs, and time reads the
        links), and for a model whose local layers choose their strategy (by time too)."""
        if self._chooses_local_strategies:
            return None
        case = Case(self.model, self.topology, self.seq_len, shards * per_shard)
        host_cap, ways = host_capacity_bytes(self.topology), 1 if self._separate_backward_only else 2
        some = False  # some row fits one way
        for group in self._group(shards).values():
            runs, which = shape_runs(dataclasses.replace(group.x, case=case))
            s = price_shapes(runs if ways == 1 else both_backwards(runs), self.target)
            shape = (ways * len(runs.ring),)
            fit = (
                (np.broadcast_to(peak_bytes(s.memory), shape) <= cap)
                & (np.broadcast_to(s.host_bytes, shape) <= host_cap)
                & np.tile(np.broadcast_to(self._copies_ok(runs), (len(runs.ring),)), ways)
            )
            first = np.flatnonzero(np.r_[True, which[1:] != which[:-1]])  # each run's first row
            fit = fit.reshape(ways, -1) & self._block_fits[group.positions[first]]
            if fit.all(axis=0).any():
                return True
            some = some or bool(fit.any())
        return None if some else False

    def _least_hbm(self, shards: int, per_shard: int) -> float:
        """The least HBM a candidate with `shards` batch shards needs for `per_shard` sequences in each,
        of those whose splash block fits SMEM and whose offloads fit the host (inf where none do)."""
        key = (shards, per_shard)
        if key not in self._least:
            self._least[key] = min(
                (
                    float(np.min(p.priced.hbm_total[self._block_ok(p) & self._host_ok(p)], initial=np.inf))
                    for p in self._priced(shards * per_shard, shards)
                ),
                default=np.inf,
            )
        return self._least[key]

    def largest_fitting(self, shards: int, most: int) -> int:
        """The most sequences per shard, at most `most`, that fit (0 when not even one does).

        Memory grows with the sequences a shard holds, so a bisection finds the edge.
        """
        if self.fits(shards, most):
            return most
        low, high = 0, most  # fits(low) (or low = 0), not fits(high)
        while high - low > 1:
            mid = (low + high) // 2
            if self.fits(shards, mid):
                low = mid
            else:
                high = mid
        return low

    def result(self, batch: int) -> SearchResult:
        """The full search at `batch` sequences per step: ranked plans and every rejection."""
        case = Case(self.model, self.topology, self.seq_len, batch)
        rejections: list[Rejection] = []
        feasible: list[tuple] = []  # (rank key, strategy, which priced batch, row)
        best_infeasible: list[Ranked] = []
        priced_count = 0
        cap = self.topology.hbm_bytes_per_device
        host_cap = host_capacity_bytes(self.topology)
        batches = self._priced(batch)
        placements_of = _placements(self.topology).of
        for k, p in enumerate(batches):
            priced = p.priced
            priced_count += len(p.rows.positions)
            mem = np.broadcast_to(priced.hbm_total, priced.step_time_s.shape)
            # a candidate is a verdict × remat policy; its rows (placements) are consecutive: keep the
            # fastest placement of each, the first of equals
            candidate = p.rows.positions * len(self._remats) + p.rows.remat
            order = np.lexsort((np.arange(len(candidate)), priced.step_time_s, candidate))
            starts = np.flatnonzero(np.r_[True, candidate[order][1:] != candidate[order][:-1]])
            chosen = np.sort(order[starts])  # in row order, as the candidates first appear
            host = np.broadcast_to(priced.host_bytes, mem.shape)
            copy = np.broadcast_to(largest_host_copy_bytes(p.rows.x), mem.shape)
            copies_ok = copy < HOST_COPY_LIMIT_BYTES
            fits = self._block_ok(p)[chosen] & (mem[chosen] <= cap) & (host[chosen] <= host_cap) & copies_ok[chosen]
            steps, mems = priced.step_time_s.tolist(), mem.tolist()
            parts_of = {name: np.broadcast_to(v, mem.shape) for name, v in priced.memory.items()}
            strategy_least = None
            # rows read by index, not as a `CandidateRow` each: a pod ranks tens of thousands
            positions, remat_of, placement_of = (a.tolist() for a in (p.rows.positions, p.rows.remat, p.rows.placement))
            for i, ok in zip(chosen.tolist(), fits.tolist()):
                v = self._sound_at[positions[i]]
                placement = placements_of(v.sizes)[placement_of[i]]
                remat, remat_custom = self._remats[remat_of[i]]
                if not ok:
                    reason = self._blocks[int(p.rows.positions[i])][1]
                    if reason:
                        category = "smem"
                    elif host[i] > host_cap:
                        category = "host"
                        reason = (
                            f"offloads {host[i] / GiB:.1f} GiB of activations > "
                            f"{host_cap / GiB:.1f} GiB host memory per device"
                        )
                    elif not copies_ok[i]:
                        category, reason = "compiler", host_copy_violation(float(copy[i]))
                    else:
                        parts = {name: float(v[i]) for name, v in parts_of.items()}
                        top = max(parts, key=parts.get)
                        category = "hbm"
                        reason = (
                            f"needs {mems[i] / GiB:.1f} GiB > {cap / GiB:.1f} GiB HBM "
                            f"(largest: {top} {parts[top] / GiB:.1f} GiB)"
                        )
                    rejections.append(
                        Rejection(
                            dict(zip(AXES, v.sizes)), p.strategy, v.load_balance, remat, category, reason, remat_custom
                        )
                    )
                    # the least HBM of the plans that exist: one over its host's memory, or whose host copies
                    # the compiler cannot make, is refused outright
                    if (
                        host[i] <= host_cap
                        and copies_ok[i]
                        and (strategy_least is None or mems[i] < mems[strategy_least])
                    ):
                        strategy_least = i
                    continue
                feasible.append(
                    (
                        _rank_key(
                            steps[i] / case.tokens_per_step,
                            cap - mems[i],
                            v.sizes,
                            p.strategy,
                            v.load_balance,
                            remat,
                            placement.axis_order,
                            placement.physical_order,
                        ),
                        p.strategy,
                        k,
                        i,
                    )
                )
            if strategy_least is not None:
                best_infeasible.append(self._ranked(p, strategy_least))
        feasible.sort(key=lambda entry: entry[0])
        best_infeasible.sort(key=lambda r: r.estimate.hbm_bytes_per_device)

        def build(entry) -> Ranked:
            _, _, k, i = entry
            return self._ranked(batches[k], i)

        return SearchResult(
            case,
            self.options,
            RankedList(feasible, build),
            lambda: self._unpriced_rejections(batch),
            rejections,
            priced_count,
            best_infeasible,
            target=self.target,
            mask_note=self.mask_note,
        )

    def _ranked(self, p: _Priced, i: int) -> Ranked:
        """Row `i` of a priced batch as a `Plan` with its `Estimate`."""
        row, case, opts = self.row(p.rows, i), p.x.case, self.options
        block = self._blocks[int(p.rows.positions[i])][0] or DEFAULT_BLOCK
        plan = Plan(
            model=case.model,
            topology=case.topology.name,
            seq_len=case.seq_len,
            global_batch=case.global_batch,
            mesh=tuple(zip(AXES, row.sizes)),
            axis_order=row.placement.axis_order,
            physical_order=row.placement.physical_order,
            dcn_data=row.placement.dcn_data,
            dcn_fsdp=row.placement.dcn_fsdp,
            cp_strategy=p.strategy,
            local_strategy=None if p.local is None else p.local[i],
            load_balance=row.load_balance,
            remat=row.remat,
            remat_custom=row.remat_custom,
            block_q=int(block),
            block_kv=int(block),
            loss_chunk_tokens=opts.loss_chunk_tokens,
            param_dtype=opts.param_dtype,
            mu_dtype=opts.mu_dtype,
            compute_dtype=opts.compute_dtype,
            quantization=opts.quantization,
            dq_reduction_steps=_dq_reduction_steps(p.strategy, self.target),
            fused_attention_backward=p.fused is not None and bool(p.fused[i]),
        )
        x = dataclasses.replace(
            p.x, local_strategy=plan.local_strategy, fused_attention_backward=plan.fused_attention_backward
        )
        return Ranked(plan, estimate_row(p.priced, i, x, memory_margins=self._memory_margins))

    def _unpriced_rejections(self, batch: int) -> list[Rejection]:
        """The candidates rejected before pricing at `batch`: a rule whatever the batch, then the batch split,
        then the structural rules."""
        batch_rule = {
            s: batch_split_violation(batch, s, with_expert=self.model.experts is not None)
            for s in {v.shards for v in self.verdicts}
        }
        meshes: dict[tuple, dict] = {}
        out = []
        for v in self.verdicts:
            violation = v.always or batch_rule[v.shards] or v.structural
            if violation:
                mesh = meshes.get(v.sizes) or meshes.setdefault(v.sizes, dict(zip(AXES, v.sizes)))
                out.append(Rejection(mesh, v.strategy, v.load_balance, None, violation.category, violation.reason))
        return out

    def nearest_batches(self, target: float) -> list[int]:
        """The sequence counts nearest `target` (by ratio) that some plan fits: one, or two as near.

        Per batch-shard count s the nearest multiples of s are s·⌊target/s⌋ and s·⌈target/s⌉; where
        neither fits, the largest that does (memory decides). Shard counts are taken in order of the
        best ratio they could give, and the walk stops once none can come nearer. Counts above twice
        the target are considered only where no shard count up to it is sound.
        """

        def distance(count: int) -> float:
            return abs(math.log(count / target))

        def reachable(s: int) -> tuple[int, int]:
            return max(1, math.floor(target / s)), max(1, math.ceil(target / s))

        # counts above twice the target only where no mesh within it splits the slice: more
        # sequences need more memory per device, so they help only the split
        counts = [s for s in self._meshes_of if s <= 2 * target] if self.sound_within(2 * target) else self._meshes_of
        order = sorted(counts, key=lambda s: (min(distance(s * b) for b in reachable(s)), s))
        best: dict[int, float] = {}
        best_distance = math.inf
        for s in order:
            low, high = reachable(s)
            if min(distance(s * low), distance(s * high)) > best_distance + _TIE:
                break
            if not self._sound_meshes_with(s):
                continue  # no candidate with s batch shards is structurally sound
            if {s * b for b in (low, high) if distance(s * b) <= best_distance + _TIE} <= best.keys():
                continue  # its nearest counts are found already, and their search prices every shard count
            found = []
            if self.fits(s, high):
                found.append(high)
                if low < high and distance(s * low) <= distance(s * high) + _TIE and self.fits(s, low):
                    found.append(low)
            else:
                most = self.largest_fitting(s, high - 1) if high > 1 else 0
                if most:
                    found.append(most)
            for per_shard in found:
                count = s * per_shard
                d = distance(count)
                if d < best_distance - _TIE:
                    best, best_distance = {count: d}, d
                elif d <= best_distance + _TIE:
                    best[count] = d
        return sorted(best)


_TIE = 1e-12  # ratios this close are the same distance from the target


def search(
    model: ModelSpec, seq_len: int, topo: Topology, options: SearchOptions, *, target: Target = Target.CPPLAN
) -> SearchResult:
    """Prices every candidate at the chosen batch and ranks the feasible ones (see the module docstring).

    With `options.global_batch` the batch is that many sequences. Otherwise the batch is the
    feasible count nearest the target (`options.target_sequences`); of two as near, the one
    whose best plan is faster per token. Where no count fits, the result is the nearest whole
    count to the target, with nothing ranked.

    `target` is the runtime the plans are priced for (see `SearchSpace`).

    Raises:
        CpplanError: the fixed mesh does not cover the devices, or a quantization the chip does not run.
    """
    refusal = fp8_refusal(topo, options.quantization)
    if refusal:
        raise CpplanError(refusal + ".")
    space = SearchSpace(model, seq_len, topo, options, target=target)
    if options.global_batch is not None:
        return space.result(options.global_batch)
    target = options.target_sequences(seq_len, host=topo.chip.kind.shares_cores)
    counts = space.nearest_batches(target)
    if not counts:
        return space.result(max(1, round(target)))
    result = min(
        (space.result(count) for count in counts),
        key=lambda r: r.best.estimate.step_time_s / r.best.estimate.tokens_per_step,
    )
    # above twice the target only where no mesh within it splits the slice (see `nearest_batches`)
    split_within = space.sound_within(2 * target)
    result.batch_note = batch_note(
        target,
        result.global_batch,
        seq_len,
        tied=[c for c in counts if c != result.global_batch],
        devices=None if split_within else topo.num_devices,
    )
    return result


def batch_note(target: float, chosen: int, seq_len: int, *, tied: list[int], devices: int | None = None) -> str | None:
    """Why the search took `chosen` sequences per step for a target of `target` (None when it is the target).

    Args:
        target: the sequences aimed for; chosen: the count taken; seq_len: tokens per sequence.
        tied: other counts as near the target, slower per token.
        devices: the slice's device count where no mesh could split a count up to twice the
            target over them (so the count had to grow), else None.
    """
    if chosen == target:
        return None
    target_tokens = round(target * seq_len)
    note = (
        f"{counted(chosen, 'sequence')} per step ({chosen * seq_len:,} tokens): the number "
        f"nearest the target of {target_tokens:,} tokens that a plan fits"
    )
    if target == int(target):
        note += f" ({int(target)} sequence{'s fit' if target > 1 else ' fits'} no plan)"
    if devices is not None:
        note += (
            f"; at this length no mesh splits up to twice the target's sequences over {devices} devices "
            f"(the sequences must carry the factors of {devices} that the length cannot)"
        )
    elif not target / 2 <= chosen <= 2 * target:
        note += "; no count between half and twice the target fits"
    if tied:
        note += f"; {', '.join(map(str, tied))} as near, but slower per token"
    return note


def _rank_key(
    time_per_token: float,
    headroom_bytes: float,
    sizes,
    strategy: CPStrategy,
    load_balance: LoadBalance,
    remat: RematPolicy,
    axis_order,
    physical_order,
) -> tuple:
    """Ranking: step time per token, then memory headroom, then a deterministic order."""
    # 12 significant digits: equal plans computed along different paths still tie
    return (
        float(f"{time_per_token:.12g}"),
        -headroom_bytes,
        sizes,
        strategy.value,
        load_balance.value,
        remat.value,
        axis_order,
        physical_order,
    )
