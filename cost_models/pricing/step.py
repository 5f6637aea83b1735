"""`price`: one training step's time, traffic and memory for columns of candidates, composed
from the builders of this package."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from cost_models.candidates import Candidates
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


def priced_rows(priced: Priced, rows: slice) -> Priced:
    """The columns of `rows` of the candidates priced (a figure every row shares kept as it is)."""

    def part(value):
        if isinstance(value, dict):
            return {name: part(v) for name, v in value.items()}
        return value[rows] if np.ndim(value) else value

    return Priced(**{f.name: part(getattr(priced, f.name)) for f in dataclasses.fields(Priced)})


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
    for share, mask, name in x.layer_kinds():
        xm = x if mask == x.model.global_mask else dataclasses.replace(x, mask=mask)
        strategy = STRATEGIES[name]
        attention = price_attention(xm, strategy, traits=target.traits)
        cost = strategy.cost(
            xm,
            attention.layout,
            attention.forward_s,
            attention.backward_s,
            gradients_all_reduced=target.traits.context_gradients_all_reduced,
        )
        kinds.append(LayerKind(share, strategy, attention, cost))
    return kinds


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


def _context_traffic(x: Candidates, kind: LayerKind, overlap, target: Target) -> ContextTraffic:
    """A kind of layer's own strategy traffic, with what of it the chip overlaps."""
    strategy = kind.strategy
    # a target that waits for the ring's hops hides none of them
    waits_for_hops = strategy.hides_traffic_behind_attention and not target.traits.ring_hops_overlap_attention
    return context_traffic(
        kind.cost,
        x.remat_columns.recompute_attention,
        0.0 if waits_for_hops else overlap.of_context(strategy.name),
        hides_behind_attention=strategy.hides_traffic_behind_attention,
        shares_hops=target.traits.backward_shares_recomputed_hops,
    )


def price(x: Candidates, *, target: Target = Target.CPPLAN) -> Priced:
    """Prices every candidate in `x` (all of one strategy) as the runtime `target` runs them."""
    layers = x.model.num_layers
    chip = x.topology.chip
    overlap = overlap_for(chip.name, assumed_overlap=chip.comm_overlaps_compute)
    matmuls = price_matmuls(x)
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

    traffic = price_traffic(
        x,
        matmuls.weight_bytes,
        _layer_average([_context_traffic(x, k, overlap, target) for k in kinds], [k.share for k in kinds]),
        traits=target.traits,
    )
    exposed = price_exposure(
        traffic, layer_forward_s=layer_forward_s, layer_backward_s=layer_backward_s, num_layers=layers, overlap=overlap
    ).as_dict()
    offload = price_offload(x, layer_forward_s=layer_forward_s, layer_backward_s=layer_backward_s)
    exposed["host_offload"] = offload.exposed_s
    state = price_state_offload(x, layers_s=layers * (layer_forward_s + layer_backward_s))
    exposed["host_state"] = state.exposed_s
    optimizer_s = optimizer_seconds(x)
    compute = {"matmul": layers * matmuls.math_s + head.matmul_s, "attention": layers * attention.total_s}
    hbm = {
        "elementwise": layers * elementwise.total_s + head.cross_entropy_s,
        "matmul_weight_reads": layers * matmuls.weight_read_excess_s,
        "optimizer": optimizer_s,
    }
    step = (
        layers * (layer_forward_s + layer_backward_s)
        + head.matmul_s
        + head.cross_entropy_s
        + optimizer_s
        + sum(exposed.values())
    )
    return Priced(
        step_time_s=step,
        compute_s=compute,
        hbm_s=hbm,
        comm_s={**traffic.per_step(layers), "host_offload": offload.transfer_s, "host_state": state.transfer_s},
        exposed_s=exposed,
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
            ).as_dict(),
            attention.layout,
            target.traits,
        ),
        smem_bytes=target_smem_bytes(x, attention.layout, attention.smem_bytes, target.traits),
        model_flops=model_flops_per_step(x.model, x.seq_len, x.global_batch),
        executed_flops=layers * (matmuls.executed_flops + attention.executed_flops) + head.executed_flops,
        host_bytes=offload.host_bytes + state.host_bytes,
    )
