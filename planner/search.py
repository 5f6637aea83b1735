"""The search: every mesh factorisation × CP strategy × load balancing × remat × placement,
at the number of sequences per step nearest the target that some plan fits.

Structural rules (heads, sequence splits, balancing) are judged once per (context,
context_ulysses, tensor) and do not depend on the batch (`SearchSpace`); the batch rule (whole
sequences per data × fsdp shard) picks the meshes a batch may use. Those are priced as numpy
columns, one strategy at a time: first each candidate's memory, which no placement changes (a
candidate that does not fit is rejected there), then the rest over every realisable placement;
splash SMEM and HBM reject; each candidate keeps its best placement. Ranking: predicted step time
per token, then memory headroom, then a deterministic key. A pure function of its inputs (caches hold only what the
inputs determine: placements per topology).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
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
from cost_models.placement import digit_bounds, span_segments, splits_no_digit, tiles
from cost_models.precision import fp8_refusal
from cost_models.pricing import Priced, choose_rows, peak_bytes, price, priced_rows
from cost_models.pricing.attention import price_attention
from cost_models.pricing.offload import (
    HOST_COPY_LIMIT_BYTES,
    host_capacity_bytes,
    host_copy_violation,
    largest_host_copy_bytes,
)
from cost_models.pricing.step import price_shapes
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
# placements of a strategy's candidates at a batch from which the search prices the candidates' shapes first, to
# time only those that may fit (`SearchSpace._shapes`); fewer are timed at once
SHAPES_FIRST = 20_000
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


class RankEntry(NamedTuple):
    """A feasible candidate in the ranking before its plan is built: its rank key (`_rank_key`), what it is
    looked up by, and the priced placements (`batch`) and row that build it."""

    key: tuple
    strategy: CPStrategy
    load_balance: LoadBalance
    step_time_s: float
    batch: int
    row: int

    @property
    def sizes(self) -> tuple[int, ...]:
        """The candidate's mesh (sizes in `AXES` order)."""
        return self.key[2]


class RankedList(Sequence):
    """Feasible candidates in rank order; each becomes a `Ranked` (a `Plan` and its `Estimate`)
    when first read, so a caller that wants the best plan does not build ten thousand."""

    def __init__(self, entries: list[RankEntry], build: Callable[[RankEntry], Ranked]):
        self._entries = entries  # sorted by key
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

    def where(self, test: Callable[[RankEntry], bool], *, start: int = 0) -> list[Ranked]:
        """The candidates from rank `start` on whose entry passes `test`, in rank order (only those built)."""
        return [self[position] for position in range(start, len(self)) if test(self._entries[position])]

    def best_where(self, test: Callable[[tuple[int, ...]], bool]) -> Ranked | None:
        """The first-ranked candidate whose mesh (sizes in `AXES` order) passes `test`, or None."""
        for position, entry in enumerate(self._entries):
            if test(entry.sizes):
                return self[position]
        return None

    def mesh_sizes(self) -> list[tuple[int, ...]]:
        """Each candidate's mesh (sizes in `AXES` order), in rank order (no plan built)."""
        return [entry.sizes for entry in self._entries]

    def best_of_each_strategy(self) -> dict[CPStrategy, Ranked]:
        """The first-ranked candidate of each strategy that has one, in rank order."""
        first: dict[CPStrategy, int] = {}
        for position, entry in enumerate(self._entries):
            first.setdefault(entry.strategy, position)
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
    -1 under the others."""

    __slots__ = ("spans", "figures", "links", "filled")

    def __init__(self, spans: tuple[tuple[int, int], ...], orders: int):
        self.spans = spans
        self.figures: list[int] = [-1] * orders
        self.links: list[AxisLinks | None] = [None] * orders
        self.filled = 0  # the orders filled, a bit each


class _MeshPlacements(Sequence):
    """The distinct placements of one mesh on one slice, in the order they are first met (axis order, then
    physical order). Each is an axis order, a physical order and the rows its groups take their links from;
    a `Placement` is made when read (a search reads a few of a pod's hundred thousand), and `figures` numbers
    each group's links (`_Placements.link_table` reads the links as columns off them)."""

    __slots__ = ("_axis_orders", "_dim_names", "_perms", "_orders", "_rows", "_row_of", "figures")

    def __init__(self, axis_orders, dim_names, perms, orders, rows, row_of, figures):
        self._axis_orders = axis_orders  # every axis order of the mesh (`_axis_orders`)
        self._dim_names = dim_names  # every physical order's dimension names
        self._perms, self._orders = perms, orders  # per placement: its axis order and physical order
        self._rows, self._row_of = rows, row_of  # distinct group rows; per axis order, each group's (an index)
        self.figures = figures  # (placements, groups in `GROUP_AXES` order): the number of each group's figures

    def __len__(self) -> int:
        return len(self._perms)

    def orders(self, index: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The axis order and physical order of placement `index`."""
        return self._axis_orders[self._perms[index]], self._dim_names[self._orders[index]]

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        perm, order = self._perms[index], self._orders[index]
        rows = self._row_of[perm]
        links = {group: self._rows[r].links[order] for group, r in zip(GROUP_AXES, rows.tolist())}
        return Placement(self._axis_orders[perm], self._dim_names[order], links)


class _Placements:
    """Distinct realisable placements of a mesh on a topology, with the links each gives.

    A placement's links depend on where each logical axis lies in the flattened device order: an axis
    spans positions `inner` to `inner × size` (`inner_sizes`), a collective group the spans of its axes.
    The links of a group's spans are priced once per topology for every physical order at once, and every
    axis order of a mesh is laid at once as arrays, so a mesh's thousands of (axis order × physical order)
    placements are table look-ups.
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
        self._all_orders = (1 << len(self.phys_orders)) - 1
        self._orders_at: dict[int, int] = {}  # a boundary's flattened position → `_orders_with_boundary`
        self._group_rows: dict[tuple, _GroupRow] = {}  # a group's spans → `_group_row`
        self._figure_ids: dict[tuple[float, ...], int] = {}  # links' figures → a number naming them
        self._figure_values: list[tuple[float, ...]] = []  # the figures of each number
        self._segment_links: dict[tuple, AxisLinks] = {}
        self._meshes: dict[tuple[int, ...], _MeshPlacements] = {}  # a mesh of one slice → its placements (`lay`)

    @lru_cache(maxsize=None)
    def of(self, sizes: tuple[int, ...]) -> Sequence[Placement]:
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

    def _within_slice(self, sizes: tuple[int, ...]) -> _MeshPlacements:
        """The placements of a mesh of one slice's devices that give distinct links (`lay`)."""
        if sizes not in self._meshes:
            self.lay([sizes])
        return self._meshes[sizes]

    def lay(self, meshes: Iterable[tuple[int, ...]]) -> None:
        """Finds the placements of meshes (sizes in AXES order) not yet laid, those whose axes of more than one
        device have the same sizes at once (`_lay_alike`); over several slices, of each split's mesh on one."""
        if self.topo.num_slices > 1:
            one = _placements(dataclasses.replace(self.topo, num_slices=1))
            slices = self.topo.num_slices
            one.lay((s[0] // d, s[1] // f) + s[2:] for s in meshes for d, f in dcn_splits(s, slices))
            return
        alike: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        for sizes in dict.fromkeys(meshes):
            if sizes not in self._meshes:
                alike.setdefault(tuple(s for s in sizes if s > 1), []).append(sizes)
        for active, same in alike.items():
            self._lay_alike(active, same)

    def _lay_alike(self, active: tuple[int, ...], meshes: list[tuple[int, ...]]) -> None:
        """The placements of meshes of one slice's devices whose axes of more than one device have sizes `active`
        (in AXES order) that give distinct links, each the first (axis order, then physical order) to give them:
        every axis order of every mesh at once, as arrays (`_laid`), a group's spans the union of its axes' (their
        bits' sum: the spans are disjoint)."""
        bits, tiled, met, ends, row_of_bits = self._laid(active)
        names = [tuple(a for a, s in zip(AXES, sizes) if s > 1) for sizes in meshes]
        group_bits = np.matmul(bits, np.stack([_group_members(n) for n in names]))  # (meshes, axis orders, groups)
        distinct, row_of = np.unique(group_bits, return_inverse=True)
        row_of = row_of.reshape(group_bits.shape)
        asked = np.zeros(len(distinct), dtype=np.int64)  # per distinct row, the orders an axis order tiles with it
        np.bitwise_or.at(asked, row_of, np.broadcast_to(tiled[:, None], row_of.shape))
        rows = []
        for group, orders in zip(distinct.tolist(), asked.tolist()):
            row = row_of_bits.get(group)
            if row is None:
                row = row_of_bits[group] = self._group_row(_spans(group, ends))
            if orders & ~row.filled:
                self._fill(row, orders)
            rows.append(row)
        # per mesh, of the (axis order, physical order) pairs that tile, the first to give each set of figures
        figures = np.array([row.figures for row in rows], dtype=np.int64)  # (rows, physical orders)
        pairs = len(met)
        keys = _figure_keys(figures, row_of.reshape(-1, len(GROUP_AXES)), len(self._figure_values))
        mesh_of = np.repeat(np.arange(len(meshes)), pairs)
        first = _first_of_each([mesh_of, *(key.reshape(len(meshes), -1)[:, met].ravel() for key in keys)])
        for m, chosen in enumerate(np.split(first, np.searchsorted(first, pairs * np.arange(1, len(meshes))))):
            perms, phys = np.divmod(met[chosen - m * pairs], len(self.phys_orders))
            self._meshes[meshes[m]] = _MeshPlacements(
                _axis_orders(names[m]),
                self._dim_names,
                perms.tolist(),
                phys.tolist(),
                rows,
                row_of[m],
                figures[row_of[m][perms], phys[:, None]],
            )

    @lru_cache(maxsize=None)
    def _laid(self, sizes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int], dict]:
        """Every order of axes of `sizes` (each more than one device; the meshes with these sizes share it), laid
        at once. An axis spans the flattened positions `inner` to `inner × size`, both products of some of the
        sizes (`_span_ends`), so its span is a bit set over the intervals between consecutive ends (adjacent spans
        join as runs of bits); an axis order tiles the physical orders whose digits none of its boundaries split
        (`tiles`).

        Returns:
            Per axis order, each axis's span bits (in `sizes` order) and the physical orders it tiles (a bit
            each); the (axis order, physical order) pairs that tile, flattened, axis order outermost; the ends;
            and the group rows by span bits over them, filled as meshes ask.
        """
        at_place, place_of = _permutations(len(sizes))
        active = np.array(sizes, dtype=np.int64)
        laid = active[at_place]
        inner = np.ones(laid.shape, dtype=np.int64)  # by place, outermost first: the product of the sizes inside
        inner[:, :-1] = np.cumprod(laid[:, :0:-1], axis=1)[:, ::-1]
        inner = inner[np.arange(len(inner))[:, None], place_of]  # by axis
        ends = _span_ends(sizes)
        low, high = np.searchsorted(ends, inner), np.searchsorted(ends, inner * active)
        bits = (_ONE << high.astype(np.uint64)) - (_ONE << low.astype(np.uint64))
        orders_at_end = np.array([self._orders_with_boundary(end) for end in ends.tolist()], dtype=np.int64)
        tiled = np.bitwise_and.reduce(orders_at_end[low], axis=1, initial=self._all_orders)
        met = np.flatnonzero((tiled[:, None] >> np.arange(len(self.phys_orders))) & 1)
        return bits, tiled, met, ends.tolist(), {}

    def _links(self, segments: tuple[tuple[int, int, int], ...]) -> AxisLinks:
        """`Topology.links` of segments given as (dimension, size, stride), once per topology (spans on the
        inner dimensions lie alike under every physical order that keeps those inside)."""
        if segments not in self._segment_links:
            self._segment_links[segments] = self.topo.links(tuple(Segment(*s) for s in segments))
        return self._segment_links[segments]

    def _orders_with_boundary(self, position: int) -> int:
        """The physical orders (a bit each) whose digits a boundary between axes at flattened `position` splits
        none of; once per position, shared by every mesh."""
        if position not in self._orders_at:
            self._orders_at[position] = sum(
                1 << k for k, bounds in enumerate(self._dim_bounds) if splits_no_digit(position, bounds)
            )
        return self._orders_at[position]

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
                if figure not in self._figure_ids:
                    self._figure_ids[figure] = len(self._figure_values)
                    self._figure_values.append(figure)
                row.figures[k] = self._figure_ids[figure]
                row.links[k] = a
        row.filled |= orders

    def orders(self, sizes: tuple[int, ...], index: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The axis order and physical order of placement `index` of a mesh (its links not looked up)."""
        placements = self.of(sizes)
        if isinstance(placements, _MeshPlacements):
            return placements.orders(index)
        return placements[index].axis_order, placements[index].physical_order

    @lru_cache(maxsize=None)
    def link_table(self, sizes: tuple[int, ...]) -> tuple[dict[str, LinkColumns], LinkColumns]:
        """The links of each placement of a mesh as columns (one entry per placement, in `of` order)."""
        placements = self.of(sizes)
        if not isinstance(placements, _MeshPlacements):  # over several slices: links crossing DCN of their own
            return link_columns({group: [p.links[group] for p in placements] for group in placements[0].links})
        # (placements, groups, figures): each group's collective bandwidth and latency, ring bandwidth and latency
        figures = np.array(self._figure_values)[placements.figures]
        cols = {group: LinkColumns(figures[:, g, 0], figures[:, g, 1]) for g, group in enumerate(GROUP_AXES)}
        ring = figures[:, list(GROUP_AXES).index("context")]
        return cols, LinkColumns(ring[:, 2], ring[:, 3])


_ONE = np.uint64(1)  # span bits are 64-bit words: a mesh's six axes have at most 2 ** 6 span ends (`_span_ends`)


@lru_cache(maxsize=None)
def _permutations(axes: int) -> tuple[np.ndarray, np.ndarray]:
    """Every order of `axes` axes in `itertools.permutations`' order, as (orders, places) arrays: the axis at
    each place (outermost first), and each axis's place."""
    at_place = np.array(list(itertools.permutations(range(axes))), dtype=np.intp).reshape(math.factorial(axes), axes)
    return at_place, np.argsort(at_place, axis=1)


@lru_cache(maxsize=None)
def _axis_orders(names: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """Every order of a mesh's axes of more than one device (`names`, in `AXES` order), outermost first and in
    `itertools.permutations`' order, as the whole axis order with the axes of size 1 outside. The same for
    every mesh with those axes, on any topology."""
    trivial = tuple(a for a in AXES if a not in names)
    return tuple(trivial + tuple(names[i] for i in order) for order in itertools.permutations(range(len(names))))


@lru_cache(maxsize=None)
def _group_members(names: tuple[str, ...]) -> np.ndarray:
    """(axes, groups) of 0 and 1: whether each of a mesh's axes (`names`) belongs to each group of `GROUP_AXES`."""
    return np.array([[int(a in axes) for axes in GROUP_AXES.values()] for a in names], dtype=np.uint64).reshape(
        len(names), len(GROUP_AXES)
    )


@lru_cache(maxsize=None)
def _span_ends(sizes: tuple[int, ...]) -> np.ndarray:
    """Where the spans of axes of `sizes` (in any order) can start or end in the flattened order: the products
    of some of them, ascending: at most 2 ** len(sizes), so for `AXES`' six a set of the intervals between them
    fits 63 bits."""
    products = {1}
    for size in sizes:
        products |= {p * size for p in products}
    return np.array(sorted(products), dtype=np.int64)


def _figure_keys(figures: np.ndarray, row_of: np.ndarray, below: int) -> list[np.ndarray]:
    """Per (axis order, physical order), flattened, axis order outermost, the numbers of every group's figures
    (`figures[row, order]` of the group's row `row_of[axis order, group]`), all under `below`, packed as the
    fields of as few 63-bit numbers as hold them."""
    width = max(1, (below - 1).bit_length())
    per, groups = 63 // width, row_of.shape[1]
    return [
        (figures[row_of[:, start : start + per]] << (width * np.arange(min(per, groups - start)))[:, None])
        .sum(axis=1)
        .ravel()
        for start in range(0, groups, per)
    ]


def _first_of_each(columns: list[np.ndarray]) -> np.ndarray:
    """The index of the first of each distinct row of a table given as its columns, ascending: a stable sort by
    the columns, many times faster than `numpy.unique` of whole rows."""
    order = np.lexsort(columns[::-1])
    new = np.zeros(len(order), dtype=bool)
    new[:1] = True
    for column in columns:
        ordered = column[order]
        new[1:] |= ordered[1:] != ordered[:-1]
    return np.sort(order[new])


def _spans(bits: int, ends: list[int]) -> tuple[tuple[int, int], ...]:
    """The spans (low, high), ascending, that a set of the intervals between consecutive `ends` covers (bit i:
    `ends[i]` to `ends[i + 1]`), adjacent intervals joined."""
    out = []
    while bits:
        low = (bits & -bits).bit_length() - 1
        run = bits >> low
        length = ((run + 1) & ~run).bit_length() - 1  # the run's trailing ones
        out.append((ends[low], ends[low + length]))
        bits &= ~(((1 << length) - 1) << low)
    return tuple(out)


@lru_cache(maxsize=1 << 16)
def _span_digits(low: int, high: int, dim_sizes: tuple[int, ...]) -> tuple[tuple[int, int, int], ...] | None:
    """The segments of the flattened positions `low` to `high` on dimensions of `dim_sizes` as (dimension, size,
    stride) (`span_segments`), or None where the span splits a digit of a dimension (`tiles`): the same on
    every slice whose dimensions have those sizes, so kept across slices."""
    if not tiles((high // low, low), dim_sizes):
        return None
    return tuple((s.dim, s.size, s.stride) for s in span_segments(low, high, dim_sizes))


def dcn_splits(sizes: tuple[int, ...], slices: int) -> list[tuple[int, int]]:
    """The (dcn_data, dcn_fsdp) splits of `slices` slices that a mesh (sizes in AXES order) allows:
    data and fsdp each span a divisor of their size, together every slice."""
    return [(d, slices // d) for d in divisors(slices) if sizes[0] % d == 0 and sizes[1] % (slices // d) == 0]


@lru_cache(maxsize=8)
def _searched_meshes(
    devices: int,
    fixed_items: tuple[tuple[str, int], ...],
    experts: tuple[int, ...],
    shard_counts: "frozenset[int] | None",
    slices: int,
) -> tuple[tuple[tuple[int, ...], ...], dict[int, list[tuple[int, tuple[int, ...]]]]]:
    """The meshes a search over `devices` considers (sizes in `AXES` order, the fixed axes held, `expert` one of
    `experts`, data × fsdp × expert one of `shard_counts` unless None, data and fsdp able to span `slices`), and
    them by batch shards: (index among them, mesh), in their order. Cached: a pod has tens or hundreds of thousands of
    meshes, and an advice or a max_seq_len probe searches the same devices at many lengths and batches."""
    meshes = ordered_factorizations(devices, len(AXES), {AXES.index(a): s for a, s in fixed_items})
    meshes = [sizes for sizes in meshes if sizes[_EXPERT] in experts]
    if shard_counts is not None:
        meshes = [sizes for sizes in meshes if _batch_shards(sizes) in shard_counts]
    if slices > 1:  # only data and fsdp span slices: the rest of a mesh must fit in one
        # the splits read data and fsdp alone: judged once per pair of the many meshes sharing it
        splits: dict[tuple[int, int], bool] = {}
        for sizes in meshes:
            if sizes[:2] not in splits:
                splits[sizes[:2]] = bool(dcn_splits(sizes, slices))
        meshes = [sizes for sizes in meshes if splits[sizes[:2]]]
    # grouped so that a search judges the rules of only the shard counts it prices (a few of a pod's many)
    by_shards: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
    for index, sizes in enumerate(meshes):
        by_shards.setdefault(_batch_shards(sizes), []).append((index, sizes))
    return tuple(meshes), by_shards


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
    """The priceable candidates of one strategy: each a sound verdict × remat policy, verdict by verdict with
    the remat policies inside (as the ranking's ties expect), as columns of one row each at the candidate's
    first placement, with the number of placements of its mesh (a row each where its step time is priced,
    `SearchSpace._placed`)."""

    positions: np.ndarray  # the candidate's verdict (its position, `SearchSpace._sound_with`)
    remat: np.ndarray  # index into the allowed remat policies (`as_list` order)
    placements: np.ndarray  # how many placements the verdict's mesh has
    x: Candidates


class _Priced(NamedTuple):
    """One strategy's rows priced at one batch, each row's attention backward (`fused`; None: splash's separate
    kernels on every row) and local layers (`local`; None: the strategy runs every layer) run as suits it
    best."""

    strategy: CPStrategy
    positions: np.ndarray  # each row's verdict
    x: Candidates
    priced: Priced
    local: np.ndarray | None = None
    fused: np.ndarray | None = None


class _Shapes(NamedTuple):
    """One strategy's candidates priced but for their links (`price_shapes`: the same at every placement), each
    attention backward run the way memory alone chooses where it does (`fixed`: one way fits, or neither, and
    then the separate kernels run; `SearchSpace._with_fused_backward`), else the separate kernels; the memory
    (by part) and host bytes of that way."""

    fixed: np.ndarray
    memory: dict[str, np.ndarray]
    host_bytes: np.ndarray

    @property
    def hbm_total(self) -> np.ndarray:
        return peak_bytes(self.memory)


class _Figures(NamedTuple):
    """Per candidate of one strategy's group at one batch (lists, in the group's order), what the search reads
    of it (`SearchSpace._figures`): whether it fits, its HBM in all and by part, host bytes and largest copy to
    the host, and where it was timed, its fastest row of `placed` (-1 elsewhere) and that row's step time."""

    fits: list[bool]
    hbm: list[float]
    parts: dict[str, list[float]]
    host: list[float]
    copy: np.ndarray
    copies_ok: np.ndarray
    row: list[int]
    step: list[float]
    placed: _Placed | None


class _Placed(NamedTuple):
    """Some of a group's candidates at every placement of their meshes, priced: each row's candidate (its index
    in the group, ascending) and placement (its index in `_Placements.of` of the candidate's mesh)."""

    group: _Group
    candidate: np.ndarray
    placement: np.ndarray
    p: _Priced


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
        self._meshes, self._meshes_of = _searched_meshes(
            topo.num_devices, tuple(sorted(fixed.items())), tuple(experts), shard_counts, topo.num_slices
        )
        self._judge_inputs = (
            self.model,
            seq_len,
            topo.chip.kind.shares_cores,
            target,
            options.strategies,
            tuple(as_list(options.load_balance)),
        )
        self._judgements = _judged(*self._judge_inputs)  # (context, context_ulysses, tensor) → `_judge_one`
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
        self._block_fits = np.zeros(len(self._meshes) * self._per_mesh, dtype=bool)  # by verdict position, once judged
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
        """Per strategy, the priceable candidates of the sound meshes with `shards` batch shards (built once)."""
        if shards not in self._groups:
            placements = _placements(self.topology)
            remats = len(self._remats)
            by_strategy: dict[CPStrategy, list[tuple[int, _Verdict]]] = {}
            for position, v in self._sound_with(shards):
                by_strategy.setdefault(v.strategy, []).append((position, v))
            placements.lay(v.sizes for _, v in self._sound_with(shards))
            case = Case(self.model, self.topology, self.seq_len, shards)
            groups = {}
            for strategy, verdicts in by_strategy.items():
                verdicts = [(position, v) for position, v in verdicts if placements.of(v.sizes)]
                if not verdicts:
                    continue
                counts = np.array([len(placements.of(v.sizes)) for _, v in verdicts])
                positions = np.repeat([position for position, _ in verdicts], remats)
                remat = np.tile(np.arange(remats), len(verdicts))
                x = self._group_columns(case, strategy, verdicts, remat, placements)
                groups[strategy] = _Group(positions, remat, np.repeat(counts, remats), x)
            self._groups[shards] = groups
        return self._groups[shards]

    def _group_columns(
        self, case: Case, strategy: CPStrategy, verdicts: list, remat: np.ndarray, placements: _Placements
    ) -> Candidates:
        """The columns of a group's candidates (each verdict's remat policies in turn) at their mesh's first
        placement, each with the splash block SMEM allows (`DEFAULT_BLOCK` where none does; the verdict's
        block rule then rejects it)."""
        opts = self.options
        remats = len(self._remats)
        sizes = np.repeat(np.array([v.sizes for _, v in verdicts], dtype=float), remats, axis=0)
        first = [placements.of(v.sizes)[0].links for _, v in verdicts]

        def per_candidate(figures: list[float]) -> np.ndarray:
            return np.repeat(figures, remats)

        links = {
            group: LinkColumns(
                per_candidate([f[group].collective_bw_bytes_per_s for f in first]),
                per_candidate([f[group].collective_latency_s for f in first]),
            )
            for group in first[0]
        }
        ring_link = LinkColumns(
            per_candidate([f["context"].ring_bw_bytes_per_s for f in first]),
            per_candidate([f["context"].ring_latency_s for f in first]),
        )
        blocks = self._blocks_of([position for position, _ in verdicts], strategy)
        block = np.repeat([float(b or DEFAULT_BLOCK) for b, _ in blocks], remats)
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
            zigzag=np.repeat([v.load_balance is LoadBalance.ZIGZAG for _, v in verdicts], remats),
            block_q=block,
            block_kv=block,
            links=links,
            ring_link=ring_link,
            loss_chunk_tokens=opts.loss_chunk_tokens,
            act_bytes=DTYPE_BYTES[opts.compute_dtype],
            param_bytes=DTYPE_BYTES[opts.param_dtype],
            mu_bytes=DTYPE_BYTES[opts.mu_dtype],
            dq_reduction_steps=_dq_reduction_steps(strategy, self.target),
            quantization=opts.quantization,
        )

    def _placed(self, strategy: CPStrategy, group: _Group, chosen: np.ndarray) -> _Placed:
        """The candidates `chosen` (indices into `group`, ascending, at least one) at every placement of their
        meshes, in turn, priced."""
        placements = _placements(self.topology)
        counts = group.placements[chosen]
        candidate = np.repeat(chosen, counts)
        placement = np.arange(len(candidate)) - np.repeat(np.cumsum(counts) - counts, counts)
        verdicts, which = np.unique(group.positions[chosen], return_inverse=True)
        tables = [placements.link_table(self._sound_at[position].sizes) for position in verdicts.tolist()]
        lengths = np.array([len(table[1].bw) for table in tables])
        # each row's entry in its verdicts' link tables laid end to end
        entry = np.repeat((np.cumsum(lengths) - lengths)[which.reshape(-1)], counts) + placement

        def laid(get) -> LinkColumns:
            return LinkColumns(*(np.concatenate([get(table)[i] for table in tables])[entry] for i in (0, 1)))

        x = dataclasses.replace(
            group.x.take(candidate),
            links={name: laid(lambda t, name=name: t[0][name]) for name in tables[0][0]},
            ring_link=laid(lambda t: t[1]),
        )
        return _Placed(group, candidate, placement, self._price(strategy, group.positions[candidate], x))

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

    def row(self, placed: _Placed, i: int) -> CandidateRow:
        """Row `i` of priced placements as a `CandidateRow`."""
        c = int(placed.candidate[i])
        v = self._sound_at[int(placed.group.positions[c])]
        placement = _placements(self.topology).of(v.sizes)[int(placed.placement[i])]
        policy, custom = self._remats[int(placed.group.remat[c])]
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

    def _batch_groups(self, batch: int, shards: "int | None" = None) -> list[tuple[CPStrategy, _Group]]:
        """Every strategy's candidates whose shards divide `batch` (or are `shards`), in the order of the
        meshes, at `batch`; the strategies in the order their first candidate appears, as the rejections list
        them."""
        case = Case(self.model, self.topology, self.seq_len, batch)
        wanted = [shards] if shards is not None else [s for s in self._meshes_of if batch % s == 0]
        # the placements of every shard count's meshes found at once (`_Placements.lay`)
        _placements(self.topology).lay(v.sizes for s in wanted for _, v in self._sound_with(s))
        per_strategy: dict[CPStrategy, list[_Group]] = {}
        for s in wanted:
            for strategy, group in self._group(s).items():
                per_strategy.setdefault(strategy, []).append(group)
        out = []
        first = {strategy: min(int(g.positions[0]) for g in groups) for strategy, groups in per_strategy.items()}
        for strategy in sorted(per_strategy, key=first.get):
            groups = per_strategy[strategy]
            if len(groups) == 1:
                group = groups[0]._replace(x=dataclasses.replace(groups[0].x, case=case))
            else:
                order = np.argsort(np.concatenate([g.positions for g in groups]), kind="stable")
                group = _Group(
                    *(
                        np.concatenate([getattr(g, name) for g in groups])[order]
                        for name in ("positions", "remat", "placements")
                    ),
                    stacked([g.x for g in groups], order, case),
                )
            out.append((strategy, group))
        return out

    def _price(self, strategy: CPStrategy, positions: np.ndarray, x: Candidates) -> _Priced:
        """Rows of verdicts `positions` priced, each row's attention backward and local layers run as suits it
        best (`_with_fused_backward`, `_with_local_strategies`)."""
        return self._with_local_strategies(self._with_fused_backward(strategy, positions, x))

    @property
    def _separate_backward_only(self) -> bool:
        """Whether every row runs splash's separate backward kernels (`_with_fused_backward`)."""
        return self.target.traits.maxtext_rules or len(self.model.layer_masks) > 1 or self.model.global_mask.local

    @property
    def _chooses_local_strategies(self) -> bool:
        """Whether each row's local layers take the strategy that suits them (`_with_local_strategies`)."""
        return len(self.model.layer_masks) > 1 and not self.target.traits.maxtext_rules

    def _with_fused_backward(self, strategy: CPStrategy, positions: np.ndarray, x: Candidates) -> _Priced:
        """Rows priced; on cpplan's runtime, each row's attention backward as splash's fused kernel where that
        fits and makes the step faster: its dq partials take memory the separate kernels do not (both priced in
        one table, `both_backwards`): only where both ways fit does the step time, which reads the links, choose
        (`_shapes` reads the rest off memory). Not for a model mixing masks, whose local layers' strategy is
        chosen per row on the separate kernels; MaxText's choice is its kernels'
        (`StrategySpec.maxtext_kernel_calls`)."""
        if self._separate_backward_only:
            return _Priced(strategy, positions, x, price(x, target=self.target))
        n = len(positions)
        both = price(both_backwards(x), target=self.target)
        separate, fused = priced_rows(both, slice(None, n)), priced_rows(both, slice(n, None))
        fit = both.hbm_total <= self.topology.hbm_bytes_per_device
        fits, fits_fused = fit[:n], fit[n:]
        # a plan that fits neither way keeps the separate kernels: the less memory, the nearer to fitting
        take = fits_fused & (~fits | (fused.step_time_s < separate.step_time_s))
        return _Priced(strategy, positions, x, choose_rows(take, fused, separate), fused=take)

    def _with_local_strategies(self, p: _Priced) -> _Priced:
        """For a model mixing masks, each row's local layers under whichever allowed strategy of the same
        mesh makes its step faster (or alone makes it fit); MaxText runs one strategy for every layer."""
        if not self._chooses_local_strategies:
            return p
        local = np.full(len(p.positions), None, dtype=object)
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
            return np.zeros(len(p.positions), dtype=bool)
        positions, which = np.unique(p.positions, return_inverse=True)
        verdicts = (self._sound_at[position] for position in positions.tolist())
        runs = [(other, v.load_balance) in self._sound_of_inner(_inner(v.sizes)) for v in verdicts]
        return np.array(runs, dtype=bool)[which.reshape(-1)]

    def _shapes(self, group: _Group) -> _Shapes | None:
        """The candidates of `group` priced but for their links (`_Shapes`); None where every candidate is to be
        timed: for a model whose local layers choose their strategy (by time too: `_with_local_strategies`), and
        for a group of fewer than `SHAPES_FIRST` placements, which their shapes would spare less than they cost."""
        if self._chooses_local_strategies or group.placements.sum() < SHAPES_FIRST:
            return None
        n = len(group.positions)
        if self._separate_backward_only:
            s = price_shapes(group.x, self.target)
            memory = {name: np.broadcast_to(part, (n,)) for name, part in s.memory.items()}
            return _Shapes(np.ones(n, dtype=bool), memory, np.broadcast_to(s.host_bytes, (n,)))
        s = price_shapes(both_backwards(group.x), self.target)  # separate kernels, then fused
        memory = {name: np.broadcast_to(part, (2 * n,)) for name, part in s.memory.items()}
        host = np.broadcast_to(s.host_bytes, (2 * n,))
        fit = peak_bytes(memory) <= self.topology.hbm_bytes_per_device
        fits, fits_fused = fit[:n], fit[n:]
        fused = fits_fused & ~fits  # where one way fits, that way runs
        return _Shapes(
            ~(fits & fits_fused),
            {name: np.where(fused, part[n:], part[:n]) for name, part in memory.items()},
            np.where(fused, host[n:], host[:n]),
        )

    def _block_ok(self, p: _Priced) -> np.ndarray:
        """Per row of a priced batch: whether its splash block fits SMEM."""
        return self._block_fits[p.positions]

    def _host_ok(self, p: _Priced) -> np.ndarray:
        """Per row of a priced batch: whether its offloaded activations fit the host memory of a
        device (`Plan.check` asks the same of one plan), and the TPU compiler makes its copies to the host."""
        return (p.priced.host_bytes <= host_capacity_bytes(self.topology)) & self._copies_ok(p.x)

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
        candidate: `price_shapes`) where that decides it: a candidate fits whichever way its attention backward
        runs, or none fits either way. None where it does not (the faster way runs, and time reads the links),
        and for a model whose local layers choose their strategy (by time too)."""
        if self._chooses_local_strategies:
            return None
        case = Case(self.model, self.topology, self.seq_len, shards * per_shard)
        host_cap, ways = host_capacity_bytes(self.topology), 1 if self._separate_backward_only else 2
        some = False  # some candidate fits one way
        for group in self._group(shards).values():
            x = dataclasses.replace(group.x, case=case)
            s = price_shapes(x if ways == 1 else both_backwards(x), self.target)
            n = len(group.positions)
            shape = (ways * n,)
            fit = (
                (np.broadcast_to(peak_bytes(s.memory), shape) <= cap)
                & (np.broadcast_to(s.host_bytes, shape) <= host_cap)
                & np.tile(np.broadcast_to(self._copies_ok(x), (n,)), ways)
            )
            fit = fit.reshape(ways, -1) & self._block_fits[group.positions]
            if fit.all(axis=0).any():
                return True
            some = some or bool(fit.any())
        return None if some else False

    def _least_hbm(self, shards: int, per_shard: int) -> float:
        """The least HBM a candidate with `shards` batch shards needs for `per_shard` sequences in each,
        of those whose splash block fits SMEM and whose offloads fit the host (inf where none do): read off
        the candidates' shapes where memory alone chooses their way (`_shapes`), else off every placement."""
        key = (shards, per_shard)
        if key not in self._least:
            least, host_cap = np.inf, host_capacity_bytes(self.topology)
            for strategy, group in self._batch_groups(shards * per_shard, shards):
                shapes = self._shapes(group)
                timed = np.arange(len(group.positions))
                if shapes is not None:
                    ok = self._block_fits[group.positions] & (shapes.host_bytes <= host_cap)
                    ok &= self._copies_ok(group.x)
                    hbm = np.broadcast_to(shapes.hbm_total, ok.shape)
                    least = min(least, float(np.min(hbm[ok & shapes.fixed], initial=np.inf)))
                    timed = np.flatnonzero(~shapes.fixed)
                if len(timed):
                    p = self._placed(strategy, group, timed).p
                    ok = self._block_ok(p) & self._host_ok(p)
                    least = min(least, float(np.min(p.priced.hbm_total[ok], initial=np.inf)))
            self._least[key] = least
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

    def _figures(self, strategy: CPStrategy, group: _Group) -> _Figures:
        """Per candidate of `group` (at its batch), what the search reads of it. Where memory alone chooses the
        way it runs (`_shapes`), its memory and host bytes are the same at every placement (they read no links):
        one that does not fit that way fits at no placement, and is never timed. The rest are priced at every
        placement (`_placed`), and their figures are those of their fastest, the first of equals."""
        n = len(group.positions)
        cap, host_cap = self.topology.hbm_bytes_per_device, host_capacity_bytes(self.topology)
        copy = np.broadcast_to(largest_host_copy_bytes(group.x), (n,))
        copies_ok = copy < HOST_COPY_LIMIT_BYTES
        block_ok = self._block_fits[group.positions]
        hbm, host, step, row = np.zeros(n), np.zeros(n), np.zeros(n), np.full(n, -1)
        parts: dict[str, np.ndarray] = {}
        timed = np.arange(n)
        shapes = self._shapes(group)
        if shapes is not None:
            hbm[:], host[:] = shapes.hbm_total, shapes.host_bytes
            parts = {name: np.array(np.broadcast_to(part, (n,))) for name, part in shapes.memory.items()}
            fits = block_ok & (hbm <= cap) & (host <= host_cap) & copies_ok
            timed = np.flatnonzero(~(shapes.fixed & ~fits))
        placed = self._placed(strategy, group, timed) if len(timed) else None
        if placed is not None:
            priced = placed.p.priced
            shape = priced.step_time_s.shape
            # each candidate's rows are consecutive: its fastest, the first of equals
            order = np.lexsort((np.arange(shape[0]), priced.step_time_s, placed.candidate))
            fastest = order[np.flatnonzero(np.r_[True, np.diff(placed.candidate[order]) != 0])]
            row[timed], step[timed] = fastest, priced.step_time_s[fastest]
            hbm[timed] = np.broadcast_to(priced.hbm_total, shape)[fastest]
            host[timed] = np.broadcast_to(priced.host_bytes, shape)[fastest]
            for name, part in priced.memory.items():
                parts.setdefault(name, np.zeros(n))[timed] = np.broadcast_to(part, shape)[fastest]
        return _Figures(
            (block_ok & (hbm <= cap) & (host <= host_cap) & copies_ok).tolist(),
            hbm.tolist(),
            {name: part.tolist() for name, part in parts.items()},
            host.tolist(),
            copy,
            copies_ok,
            row.tolist(),
            step.tolist(),
            placed,
        )

    def _fastest(self, strategy: CPStrategy, group: _Group, c: int, figures: _Figures) -> Ranked:
        """Candidate `c` of `group` at its fastest placement: its timed row, or for a candidate never timed
        (`_figures`), timed now."""
        if figures.row[c] >= 0:
            return self._ranked(figures.placed, figures.row[c])
        alone = self._placed(strategy, group, np.array([c]))
        return self._ranked(alone, int(np.argmin(alone.p.priced.step_time_s)))

    def result(self, batch: int) -> SearchResult:
        """The full search at `batch` sequences per step: ranked plans and every rejection (each candidate's
        figures: `_figures`)."""
        case = Case(self.model, self.topology, self.seq_len, batch)
        rejections: list[Rejection] = []
        feasible: list[RankEntry] = []
        best_infeasible: list[Ranked] = []
        priced_count = 0
        cap = self.topology.hbm_bytes_per_device
        host_cap = host_capacity_bytes(self.topology)
        batches: list[_Placed] = []
        orders_of = _placements(self.topology).orders
        for strategy, group in self._batch_groups(batch):
            priced_count += int(group.placements.sum())
            f = self._figures(strategy, group)
            if f.placed is not None:
                batches.append(f.placed)
            strategy_least = None
            # candidates read by index, not as a `CandidateRow` each: a pod ranks tens of thousands
            for c, (position, remat_of) in enumerate(zip(group.positions.tolist(), group.remat.tolist())):
                v = self._sound_at[position]
                remat, remat_custom = self._remats[remat_of]
                if not f.fits[c]:
                    reason = self._blocks[position][1]
                    if reason:
                        category = "smem"
                    elif f.host[c] > host_cap:
                        category = "host"
                        reason = (
                            f"offloads {f.host[c] / GiB:.1f} GiB of activations > "
                            f"{host_cap / GiB:.1f} GiB host memory per device"
                        )
                    elif not f.copies_ok[c]:
                        category, reason = "compiler", host_copy_violation(float(f.copy[c]))
                    else:
                        parts = {name: part[c] for name, part in f.parts.items()}
                        top = max(parts, key=parts.get)
                        category = "hbm"
                        reason = (
                            f"needs {f.hbm[c] / GiB:.1f} GiB > {cap / GiB:.1f} GiB HBM "
                            f"(largest: {top} {parts[top] / GiB:.1f} GiB)"
                        )
                    rejections.append(
                        Rejection(
                            dict(zip(AXES, v.sizes)), strategy, v.load_balance, remat, category, reason, remat_custom
                        )
                    )
                    # the least HBM of the plans that exist: one over its host's memory, or whose host copies
                    # the compiler cannot make, is refused outright
                    if (
                        f.host[c] <= host_cap
                        and f.copies_ok[c]
                        and (strategy_least is None or f.hbm[c] < f.hbm[strategy_least])
                    ):
                        strategy_least = c
                    continue
                axis_order, physical_order = orders_of(v.sizes, int(f.placed.placement[f.row[c]]))
                key = _rank_key(
                    f.step[c] / case.tokens_per_step,
                    cap - f.hbm[c],
                    v.sizes,
                    strategy,
                    v.load_balance,
                    remat,
                    axis_order,
                    physical_order,
                )
                feasible.append(RankEntry(key, strategy, v.load_balance, f.step[c], len(batches) - 1, f.row[c]))
            if strategy_least is not None:
                best_infeasible.append(self._fastest(strategy, group, strategy_least, f))
        feasible.sort(key=lambda entry: entry.key)
        best_infeasible.sort(key=lambda r: r.estimate.hbm_bytes_per_device)

        return SearchResult(
            case,
            self.options,
            RankedList(feasible, lambda entry: self._ranked(batches[entry.batch], entry.row)),
            lambda: self._unpriced_rejections(batch),
            rejections,
            priced_count,
            best_infeasible,
            target=self.target,
            mask_note=self.mask_note,
        )

    def _ranked(self, placed: _Placed, i: int) -> Ranked:
        """Row `i` of priced placements as a `Plan` with its `Estimate`."""
        p = placed.p
        row, case, opts = self.row(placed, i), p.x.case, self.options
        block = self._blocks[int(p.positions[i])][0] or DEFAULT_BLOCK
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
