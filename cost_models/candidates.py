"""`Candidates`: the plans of one strategy as numpy columns, the form the price works on.

One row per candidate (a mesh, a placement's links, a remat policy, load balancing, splash
blocks), so that thousands of candidates are priced at once and a single plan is one row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, NamedTuple

import numpy as np

from cost_models.case import Case, ReadsCase
from cost_models.collectives import Collectives
from cost_models.masks import AttentionMask
from cost_models.precision import matmul_peak_flops
from cost_models.remat import RematCost, flat_offload_program, offloads_leave_hbm, remat_table
from cost_models.strategies.base import layer_strategy
from cost_models.topology import AxisLinks, Segment
from cost_models.vocabulary import EXPERT_WEIGHT_AXES, WEIGHT_SHARDING_AXES, CPStrategy, Quantization

# the per-candidate columns but for the links; with the backward's, what tells apart candidates' shapes
COLUMNS = ("data", "fsdp", "ring", "ulysses", "tensor", "expert", "remat", "zigzag", "block_q", "block_kv")
SHAPE_COLUMNS = COLUMNS + ("fused_attention_backward",)


class LinkColumns(NamedTuple):
    """The links a collective group gets, one entry per candidate."""

    bw: np.ndarray  # bytes/s
    latency: np.ndarray  # s


def _float_link(link) -> LinkColumns:
    return LinkColumns(*(np.asarray(column, dtype=float) for column in link))


@dataclass(frozen=True)
class Candidates(ReadsCase):
    """Candidates as columns: one strategy, any number of meshes × placements × remat × balancing.

    Mesh sizes, blocks and link figures are float arrays (one entry per candidate); lists are
    accepted and converted. Derived columns are computed once per instance (the fields never change).
    """

    case: Case
    strategy: CPStrategy
    data: np.ndarray
    fsdp: np.ndarray
    ring: np.ndarray  # size of the `context` axis
    ulysses: np.ndarray  # size of the `context_ulysses` axis
    tensor: np.ndarray
    remat: np.ndarray  # rows of cost_models.remat.remat_table: POLICIES, then `remat_presets`
    zigzag: np.ndarray
    block_q: np.ndarray  # splash query block
    block_kv: np.ndarray  # splash key/value block
    links: dict[str, LinkColumns]  # collective group (`GROUP_AXES`) → its links
    ring_link: LinkColumns  # one ppermute step along `context`
    expert: np.ndarray | float = 1.0  # size of the `expert` axis (MaxText's ici_expert_parallelism)
    loss_chunk_tokens: int = 0
    act_bytes: int = 2
    param_bytes: int = 4
    mu_bytes: int = 4  # AdamW's first moment, per parameter (the second is in the parameters' dtype)
    grad_bytes: int = 4  # a weight gradient, per parameter (`Plan.grad_dtype`)
    remat_custom: tuple = ()  # the placements the `custom` remat code stands for (cost_models.remat)
    remat_presets: tuple = ()  # further custom placements, coded after POLICIES (a search's `SEARCHED_CUSTOM`)
    # splash's fused backward where the target can run it (MaxText): one bool, or a column (one per candidate)
    fused_attention_backward: bool | np.ndarray = False
    dq_reduction_steps: int = 0  # the fused backward's rolled dq partials where the target's kernel has them
    mask: AttentionMask | None = None  # the layers priced: those with this mask (None: the global layers)
    local_strategy: CPStrategy | None = None  # the local layers' own strategy (None: `strategy` for every layer)
    state_on_host: tuple = ()  # the `HostState`s kept in host memory between steps
    quantization: Quantization = Quantization.NONE  # the matmuls' precision
    # a mixture of experts' capacity factor on MaxText's dense path (0: dropless, `pricing.capacity`)
    expert_capacity: float = 0.0
    one_hot_embedding: bool = False  # the input embedding as a one-hot matmul (`Plan.one_hot_embedding`)

    def __post_init__(self):
        # a frozen dataclass converts its own declared fields through object.__setattr__
        for name in ("data", "fsdp", "ring", "ulysses", "tensor", "block_q", "block_kv"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=float))
        object.__setattr__(
            self, "expert", np.array(np.broadcast_to(np.asarray(self.expert, dtype=float), self.ring.shape))
        )
        object.__setattr__(self, "zigzag", np.asarray(self.zigzag, dtype=bool))
        object.__setattr__(self, "remat", np.asarray(self.remat, dtype=int))
        if np.ndim(self.fused_attention_backward):
            object.__setattr__(self, "fused_attention_backward", np.asarray(self.fused_attention_backward, dtype=bool))
        object.__setattr__(self, "links", {name: _float_link(link) for name, link in self.links.items()})
        object.__setattr__(self, "ring_link", _float_link(self.ring_link))

    @property
    def attention_mask(self) -> AttentionMask:
        """The mask of the layers these columns price."""
        return self.mask or self.model.global_mask

    def layer_kinds(self) -> list[tuple[float, AttentionMask, CPStrategy]]:
        """Each distinct mask of the model's layers: the share of layers with it, the mask, and the
        strategy those layers run (`layer_strategy`)."""
        m = self.model
        return [
            (count / m.num_layers, mask, layer_strategy(m, mask, self.strategy, self.local_strategy))
            for mask, count in m.layer_masks
        ]

    @cached_property
    def sequences_per_device(self) -> np.ndarray:
        """Sequences each batch shard (data × fsdp × expert) holds."""
        return self.global_batch / (self.data * self.fsdp * self.expert)

    @cached_property
    def tokens_per_device(self) -> np.ndarray:
        """Tokens each device holds outside attention: its sequences split over both context axes."""
        return self.sequences_per_device * self.seq_len / (self.ring * self.ulysses)

    @property
    def achievable_matmul_flops(self) -> float:
        """FLOP/s a device's matmuls reach: its peak in the plan's precision (`matmul_peak_flops`) times the
        chip's measured matmul efficiency."""
        return matmul_peak_flops(self.topology, self.quantization) * self.topology.chip.matmul_efficiency

    @cached_property
    def weight_shards(self) -> np.ndarray:
        """Devices a weight is split over: the weight-sharding group × tensor."""
        return self.weight_group * self.tensor

    @cached_property
    def weight_group(self) -> np.ndarray:
        """Devices a weight is sharded over outside tensor parallelism: fsdp × expert × both context axes (the
        experts' matrices too: by expert over `expert`, by their model dimension over the rest)."""
        return self.fsdp * self.expert * self.ring * self.ulysses

    @cached_property
    def expert_weight_group(self) -> np.ndarray:
        """Devices the experts' matrices are gathered over: the weight group less `expert`, whose devices
        each keep their own experts (`GROUP_AXES["expert_weights"]`)."""
        return self.fsdp * self.ring * self.ulysses

    @property
    def shared_cores(self) -> bool:
        """Whether the devices share a host's cores (work then moves to whichever device is busy)."""
        return self.topology.chip.kind.shares_cores

    @cached_property
    def comm(self) -> Collectives:
        """The collective formulas of this chip row."""
        return Collectives(self.topology.chip.host_collectives)

    @property
    def context_link(self) -> LinkColumns:
        """Links of a collective over the `context` axis."""
        return self.links["context"]

    @property
    def ulysses_link(self) -> LinkColumns:
        """Links of a collective over the `context_ulysses` axis."""
        return self.links["ulysses"]

    @cached_property
    def remat_columns(self) -> RematCost:
        """What each candidate's remat policy keeps and recomputes, one entry per candidate."""
        return self._per_candidate(remat_table(self.model, self.remat_custom, presets=self.remat_presets))

    @cached_property
    def held_remat_columns(self) -> RematCost:
        """What each candidate's policy holds in HBM in its layers' backward: `remat_columns`, or, where the
        step's offloads stay in HBM (`offloads_leave_hbm`), the same with every offloaded value kept on device
        (host memory and the copies' time are still read from `remat_columns`)."""
        if offloads_leave_hbm(self.topology.chip, self.model.num_layers):
            return self.remat_columns
        return self._per_candidate(
            remat_table(self.model, self.remat_custom, offload_in_hbm=True, presets=self.remat_presets)
        )

    @cached_property
    def flat_offload(self) -> np.ndarray:
        """Per candidate, whether its step offloads and the compiler leaves it with no layer loop
        (`flat_offload_program`)."""
        offloads = np.asarray(self.remat_columns.saved_on_host) > 0
        return offloads & flat_offload_program(self.topology.chip, self.model.num_layers)

    @cached_property
    def without_layer_loop(self) -> np.ndarray:
        """Per candidate, whether its step has no layer loop: a step of one layer, or a flat offloading one."""
        return self.flat_offload | (self.model.num_layers == 1)

    def take(self, rows: np.ndarray) -> Candidates:
        """The candidates at `rows` (indices), as columns of their own."""
        fused = self.fused_attention_backward
        return dataclasses.replace(
            self,
            **{name: getattr(self, name)[rows] for name in COLUMNS},
            links={group: LinkColumns(link.bw[rows], link.latency[rows]) for group, link in self.links.items()},
            ring_link=LinkColumns(self.ring_link.bw[rows], self.ring_link.latency[rows]),
            fused_attention_backward=fused[rows] if np.ndim(fused) else fused,
        )

    def _per_candidate(self, table: RematCost) -> RematCost:
        return RematCost(**{f.name: getattr(table, f.name)[self.remat] for f in dataclasses.fields(table)})


def stacked(parts: list[Candidates], order: np.ndarray, case: Case) -> Candidates:
    """The rows of several candidate columns of one strategy, stacked and reordered by `order`, at `case`;
    `fused_attention_backward` becomes a column."""

    def column(name):
        return np.concatenate([getattr(x, name) for x in parts])[order]

    def links(get) -> LinkColumns:
        return LinkColumns(
            np.concatenate([get(x).bw for x in parts])[order], np.concatenate([get(x).latency for x in parts])[order]
        )

    fused = [np.broadcast_to(x.fused_attention_backward, x.ring.shape) for x in parts]
    return dataclasses.replace(
        parts[0],
        case=case,
        **{name: column(name) for name in COLUMNS},
        links={group: links(lambda x, g=group: x.links[g]) for group in parts[0].links},
        ring_link=links(lambda x: x.ring_link),
        fused_attention_backward=np.concatenate(fused)[order],
    )


def both_backwards(x: Candidates) -> Candidates:
    """`x`'s rows twice in one table, so that one price gives both: first with the attention's backward as
    splash's dq and dK/dV kernels, then as its fused kernel."""
    parts = [dataclasses.replace(x, fused_attention_backward=fused) for fused in (False, True)]
    return stacked(parts, np.arange(2 * len(x.ring)), x.case)


def link_columns(links: dict[str, list[AxisLinks]]) -> tuple[dict[str, LinkColumns], LinkColumns]:
    """(group → its collective link columns, the `context` ring (ppermute) link columns) from each
    group's per-candidate `AxisLinks`, in candidate order."""
    cols = {
        name: LinkColumns(
            np.array([a.collective_bw_bytes_per_s for a in ls]), np.array([a.collective_latency_s for a in ls])
        )
        for name, ls in links.items()
    }
    ctx = links["context"]
    return cols, LinkColumns(np.array([a.ring_bw_bytes_per_s for a in ctx]), np.array([a.ring_latency_s for a in ctx]))


# the mesh axes each collective group runs over: the weights are sharded over fsdp, expert and the
# context axes (their gathers and reduce-scatters span all four); the experts' matrices, split by expert
# over `expert`, are gathered over the others; the experts' dispatch and combine are all-to-alls over `expert`
GROUP_AXES: dict[str, tuple[str, ...]] = {
    "data": ("data",),
    "weights": WEIGHT_SHARDING_AXES,
    "tensor": ("tensor",),
    "context": ("context",),
    "ulysses": ("context_ulysses",),
    "expert": ("expert",),
    "expert_weights": EXPERT_WEIGHT_AXES,
}


def group_links(
    links_of: Callable[[tuple[Segment, ...]], AxisLinks], segments: dict[str, tuple[Segment, ...]]
) -> dict[str, AxisLinks]:
    """The `AxisLinks` each group of `GROUP_AXES` gets from its mesh axes' segments, priced by `links_of`."""
    return {group: links_of(sum((segments[a] for a in axes), ())) for group, axes in GROUP_AXES.items()}
