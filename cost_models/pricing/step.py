"""`price`: one training step's time, traffic and memory for columns of candidates, composed
from the builders of this package."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from cost_models.candidates import SHAPE_COLUMNS, Candidates
from cost_models.flops import model_flops_per_step
from cost_models.overlap import overlap_for
from cost_models.pricing.attention import AttentionTimes, price_attention
from cost_models.pricing.communication import ContextTraffic, context_traffic, price_exposure, price_traffic
from cost_models.pricing.elementwise import optimizer_seconds, price_elementwise
from cost_models.pricing.head import price_head
from cost_models.pricing.matmul import price_matmuls
from cost_models.pricing.memory import peak_bytes, price_memory
from cost_models.pricing.offload import price_offload, price_state_offload
from cost_models.pricing.target import target_memory, target_smem_bytes
from cost_models.strategies import STRATEGIES, CPCost, StrategySpec
from cost_models.targets import Target


@dataclass(frozen=True)
class Priced:
    """Per-candidate columns of times (s) and bytes; see `cost_models.estimate.Estimate` for their meaning."""

    step_time_s: np.ndarray
    compute_s: dict[str, np.ndarray]
    hbm_s: dict[str, np.ndarray]
    comm_s: dict[str, np.ndarray]
    exposed_s: dict[str, np.ndarray]
    memory: dict[str, np.ndarray]
    smem_bytes: np.ndarray
    model_flops: float
    executed_flops: np.ndarray  # per device, remat recomputation and splash's whole blocks included
    host_bytes: np.ndarray  # per device, the host memory the offloaded activations and state take

    @property
    def hbm_total(self) -> np.ndarray:
        return peak_bytes(self.memory)


def _rows_of(value, rows):
    """`value`'s columns at `rows` (a slice or indices), through dicts of them; a figure every row shares
    kept as it is."""
    if isinstance(value, dict):
        return {name: _rows_of(v, rows) for name, v in value.items()}
    return value[rows] if np.ndim(value) else value


def priced_rows(priced: Priced, rows: slice) -> Priced:
    """The columns of `rows` of the candidates priced (a figure every row shares kept as it is)."""
    return Priced(**{f.name: _rows_of(getattr(priced, f.name), rows) for f in dataclasses.fields(Priced)})


def choose_rows(take: np.ndarray, chosen: Priced, other: Priced) -> Priced:
    """Per candidate, `chosen`'s columns where `take`, else `other`'s (two prices of the same rows)."""

    def pick(a, b):
        if isinstance(a, dict):
            return {name: pick(a[name], b[name]) for name in a}
        return np.where(take, a, b)

    return Priced(
        **{
            f.name: getattr(other, f.name)
            if f.name == "model_flops"
            else pick(getattr(chosen, f.name), getattr(other, f.name))
            for f in dataclasses.fields(Priced)
        }
    )


class LayerKind(NamedTuple):
    """The layers with one mask: their share of the layers, the strategy they run, its attention and traffic."""

    share: float
    strategy: StrategySpec
    attention: AttentionTimes
    cost: CPCost


def price_layer_kinds(x: Candidates, target: Target) -> list[LayerKind]:
    """Each kind of layer (a distinct mask) priced under the strategy it runs (`Candidates.layer_kinds`)."""
    kinds = []
    for share, xm, strategy in _kind_columns(x):
        attention = price_attention(xm, strategy, traits=target.traits)
        cost = _strategy_cost(xm, strategy, attention.layout, attention.forward_s, attention.backward_s, target)
        kinds.append(LayerKind(share, strategy, attention, cost))
    return kinds


def _kind_columns(x: Candidates) -> list[tuple[float, Candidates, StrategySpec]]:
    """Per kind of layer: its share of the layers, the candidates as its layers (their mask), the strategy
    they run."""
    return [(share, kind_columns(x, mask), STRATEGIES[name]) for share, mask, name in x.layer_kinds()]


def kind_columns(x: Candidates, mask) -> Candidates:
    """The candidates as the model's layers of `mask` see them: that mask, and the head shape that goes with
    it (`ModelSpec.layer_model`)."""
    m = x.model
    layer_model = m.layer_model(mask)
    if layer_model is not m:
        x = dataclasses.replace(x, case=dataclasses.replace(x.case, model=layer_model))
    return x if mask == m.global_mask else dataclasses.replace(x, mask=mask)


def _strategy_cost(xm: Candidates, strategy: StrategySpec, layout, forward_s, backward_s, target: Target) -> CPCost:
    return strategy.cost(
        xm, layout, forward_s, backward_s, gradients_all_reduced=target.traits.context_gradients_all_reduced
    )


def price_layer_attention(x: Candidates, target: Target) -> tuple[AttentionTimes, CPCost]:
    """One decoder layer's attention and its strategy's traffic; where the layers' masks differ (local and
    global layers), their average over the layers (buffers and SMEM: the largest)."""
    return _layer_attention(price_layer_kinds(x, target))


def _layer_attention(kinds: list[LayerKind]) -> tuple[AttentionTimes, CPCost]:
    shares = [k.share for k in kinds]
    return (
        _layer_average([k.attention for k in kinds], shares, largest=frozenset({"smem_bytes"})),
        _layer_average(
            [k.cost for k in kinds],
            shares,
            largest=frozenset(
                {
                    "buffer_bytes",
                    "buffer_bytes_before_backward",
                    "kv_in_working_set",
                    "held_through_mlp_backward",
                    "beside_kv_excess",
                }
            ),
        ),
    )


def _layer_average(items: list, shares: list[float], *, largest: frozenset[str] = frozenset()):
    """One record whose fields are the `shares`-weighted sum of `items`' (those named in `largest`: their
    largest); the layout is the first's (the global layers')."""
    if len(items) == 1:
        return items[0]
    values = {}
    for f in dataclasses.fields(items[0]):
        if f.name == "layout":
            continue
        column = [getattr(item, f.name) for item in items]
        values[f.name] = (
            np.max(np.broadcast_arrays(*column), axis=0)
            if f.name in largest
            else sum(s * c for s, c in zip(shares, column))
        )
    return dataclasses.replace(items[0], **values)


def _context_traffic(x: Candidates, strategy: StrategySpec, cost: CPCost, overlap, target: Target) -> ContextTraffic:
    """A kind of layer's own strategy traffic (`cost`), with what of it the chip overlaps."""
    # a target that waits for the ring's hops hides none of them
    waits_for_hops = strategy.hides_traffic_behind_attention and not target.traits.ring_hops_overlap_attention
    return context_traffic(
        cost,
        x.remat_columns.recompute_attention,
        0.0 if waits_for_hops else overlap.of_context(strategy.name),
        hides_behind_attention=strategy.hides_traffic_behind_attention,
        shares_hops=target.traits.backward_shares_recomputed_hops,
    )


class ShapePrice(NamedTuple):
    """What of a candidate's price does not read its links (all but the collectives)."""

    kinds: list[LayerKind]
    weight_bytes: np.ndarray  # one layer's weights on a device in the compute dtype
    layer_forward_s: np.ndarray
    layer_backward_s: np.ndarray
    compute_s: dict[str, np.ndarray]
    hbm_s: dict[str, np.ndarray]
    offload_exposed_s: np.ndarray
    offload_transfer_s: np.ndarray
    state_exposed_s: np.ndarray
    state_transfer_s: np.ndarray
    unexposed_s: np.ndarray  # the step but for its exposed communication
    memory: dict[str, np.ndarray]
    smem_bytes: np.ndarray
    executed_flops: np.ndarray
    host_bytes: np.ndarray


def shape_runs(x: Candidates) -> tuple[Candidates, np.ndarray]:
    """(the first of each run of consecutive candidates alike but for their links; each row's run): every
    figure that does not read the links is the same along a run, such as a search's placements of one mesh,
    which it lays side by side."""
    n = len(x.ring)
    starts = np.arange(n) == 0
    for name in SHAPE_COLUMNS:
        column = np.broadcast_to(getattr(x, name), (n,))
        starts[1:] |= column[1:] != column[:-1]
    return x.take(np.flatnonzero(starts)), np.cumsum(starts) - 1


def price_shapes(x: Candidates, target: Target) -> ShapePrice:
    """The `ShapePrice` of every candidate in `x` as the runtime `target` runs them."""
    layers = x.model.num_layers
    matmuls = price_matmuls(
        x, mlp_chunk_tokens=target.traits.mlp_chunk_tokens, grouped_kernel=target.traits.grouped_kernel
    )
    kinds = price_layer_kinds(x, target)
    attention, cost = _layer_attention(kinds)
    elementwise = price_elementwise(x, mlp_chunk_tokens=target.traits.mlp_chunk_tokens)
    head = price_head(x)
    layer_forward_s = matmuls.forward_s + attention.forward_s + elementwise.forward_s
    layer_backward_s = (
        matmuls.backward_s
        + attention.backward_s
        + elementwise.backward_s
        + matmuls.recompute_s
        + attention.recompute_s
        + elementwise.recompute_s
    )
    offload = price_offload(x, layer_forward_s=layer_forward_s, layer_backward_s=layer_backward_s)
    state = price_state_offload(x, layers_s=layers * (layer_forward_s + layer_backward_s))
    optimizer_s = optimizer_seconds(x)
    return ShapePrice(
        kinds=kinds,
        weight_bytes=matmuls.weight_bytes,
        layer_forward_s=layer_forward_s,
        layer_backward_s=layer_backward_s,
        compute_s={"matmul": layers * matmuls.math_s + head.matmul_s, "attention": layers * attention.total_s},
        hbm_s={
            "elementwise": layers * elementwise.total_s + head.cross_entropy_s + head.one_hot_mask_s,
            "matmul_weight_reads": layers * matmuls.weight_read_excess_s,
            "optimizer": optimizer_s,
        },
        offload_exposed_s=offload.exposed_s,
        offload_transfer_s=offload.transfer_s,
        state_exposed_s=state.exposed_s,
        state_transfer_s=state.transfer_s,
        unexposed_s=(
            layers * (layer_forward_s + layer_backward_s)
            + head.matmul_s
            + head.cross_entropy_s
            + head.one_hot_mask_s
            + optimizer_s
        ),
        memory=target_memory(
            x,
            price_memory(
                x,
                attention.layout,
                cost,
                mlp_chunk_tokens=target.traits.mlp_chunk_tokens,
                head_gradient_in_head_layout=target.traits.head_gradient_in_head_layout,
                kv_buffers_working_set=target.traits.kv_buffers_working_set,
                layers_switch_masks=target.traits.layers_switch_masks,
                fused_dq_partials_in_q_dtype=target.traits.fused_dq_partials_in_q_dtype,
                fused_backward_in_key_chunks=target.traits.fused_backward_in_key_chunks,
                expert_buffers_worst_case=target.traits.maxtext_rules,
                grouped_matmul_backward=target.traits.maxtext_rules,
                table_split_on_hidden=target.traits.table_split_on_hidden,
            ).as_dict(),
            attention.layout,
            target.traits,
        ),
        smem_bytes=target_smem_bytes(x, attention.layout, attention.smem_bytes, target.traits),
        executed_flops=layers * (matmuls.executed_flops + attention.executed_flops) + head.executed_flops,
        host_bytes=offload.host_bytes + state.host_bytes,
    )


def price(x: Candidates, *, target: Target = Target.CPPLAN) -> Priced:
    """Prices every candidate in `x` (all of one strategy) as the runtime `target` runs them: what does not
    read the links once per run of rows alike but for them (`shape_runs`, `price_shapes`), the collectives
    per row."""
    shapes, which = shape_runs(x)
    s = price_shapes(shapes, target)

    def rows(value):
        return _rows_of(value, which)

    layers = x.model.num_layers
    chip = x.topology.chip
    overlap = overlap_for(chip.name, assumed_overlap=chip.comm_overlaps_compute)
    contexts = []
    for (share, xm, strategy), kind in zip(_kind_columns(x), s.kinds):
        # the strategy's traffic reads the links: its cost again on every row, from its shape's attention
        a = kind.attention
        layout = dataclasses.replace(
            a.layout, **rows({f.name: getattr(a.layout, f.name) for f in dataclasses.fields(a.layout)})
        )
        cost = _strategy_cost(xm, strategy, layout, rows(a.forward_s), rows(a.backward_s), target)
        contexts.append(_context_traffic(x, strategy, cost, overlap, target))
    traffic = price_traffic(
        x, rows(s.weight_bytes), _layer_average(contexts, [k.share for k in s.kinds]), traits=target.traits
    )
    exposed = price_exposure(
        traffic,
        layer_forward_s=rows(s.layer_forward_s),
        layer_backward_s=rows(s.layer_backward_s),
        num_layers=layers,
        overlap=overlap,
    ).as_dict()
    exposed["host_offload"] = rows(s.offload_exposed_s)
    exposed["host_state"] = rows(s.state_exposed_s)
    return Priced(
        step_time_s=rows(s.unexposed_s) + sum(exposed.values()),
        compute_s=rows(s.compute_s),
        hbm_s=rows(s.hbm_s),
        comm_s={
            **traffic.per_step(layers),
            "host_offload": rows(s.offload_transfer_s),
            "host_state": rows(s.state_transfer_s),
        },
        exposed_s=exposed,
        memory=rows(s.memory),
        smem_bytes=rows(s.smem_bytes),
        model_flops=model_flops_per_step(x.model, x.seq_len, x.global_batch),
        executed_flops=rows(s.executed_flops),
        host_bytes=rows(s.host_bytes),
    )
