"""Collective traffic per device, and how much of it the step waits for: each family priced as XLA's
compiled steps make it; only the fraction the compiler overlaps (`cost_models.overlap`) can hide, in one
window shared by FSDP and the strategy, the layer's compute (docs/provenance/cost_models.md#communication)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models.candidates import Candidates
from cost_models.overlap import Overlap
from cost_models.placement import axes_on_whole_dimensions
from cost_models.pricing.experts import DISPATCH_ALL_TO_ALLS, dispatch_bytes, routed_weight_bytes
from cost_models.pricing.memory import recomputed_checkpoint
from cost_models.pricing.rows import distinct_rows
from cost_models.remat import QKV_PROJECTIONS
from cost_models.strategies import STRATEGIES, CPCost
from cost_models.targets import TRAITS, Target, TargetTraits
from cost_models.work_layout import tensor_collectives_per_layer, weight_arrays_per_layer


@dataclass(frozen=True)
class ContextTraffic:
    """The strategy's own traffic for one layer, the backward including a recomputed forward's."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    exposed_forward_s: np.ndarray  # what compute does not hide (all of it where the chip cannot overlap)
    exposed_backward_s: np.ndarray

    @property
    def hidden_forward_s(self) -> np.ndarray:
        return self.forward_s - self.exposed_forward_s

    @property
    def hidden_backward_s(self) -> np.ndarray:
        return self.backward_s - self.exposed_backward_s


@dataclass(frozen=True)
class Traffic:
    """Collective seconds on one device (arrays over candidates)."""

    weight_gather_s: np.ndarray  # per layer: the forward's gathers of its weights
    backward_gather_s: np.ndarray  # per layer: the backward's (again, and recomputed q/k/v weights a second time)
    gradient_scatter_s: np.ndarray  # per layer: reduce-scatter of its gradients
    head_gather_s: np.ndarray  # per step: the output head gathered twice (forward, backward), compute dtype
    head_scatter_s: np.ndarray  # per step: its gradient reduce-scattered once, in the parameter dtype
    embedding_s: np.ndarray  # per step: the input embedding's all-to-all, forward and backward
    tensor_s: np.ndarray  # per step
    data_all_reduce_s: np.ndarray  # per step
    context: ContextTraffic  # per layer
    # per step: the experts' dispatch and return all-to-alls over `expert` (None: a model without experts,
    # which has no such family)
    expert_all_to_all_s: np.ndarray | None = None

    def per_step(self, num_layers: int) -> dict[str, np.ndarray]:
        """Seconds per step of each collective family; names as `Estimate.comm_s` has them."""
        return {
            "fsdp_all_gather": num_layers * (self.weight_gather_s + self.backward_gather_s) + self.head_gather_s,
            "fsdp_reduce_scatter": num_layers * self.gradient_scatter_s + self.head_scatter_s,
            "embedding": self.embedding_s,
            "tensor": self.tensor_s,
            "data_all_reduce": self.data_all_reduce_s,
            "context": num_layers * (self.context.forward_s + self.context.backward_s),
        } | ({} if self.expert_all_to_all_s is None else {"expert_all_to_all": self.expert_all_to_all_s})


@dataclass(frozen=True)
class Exposure:
    """Communication seconds per step the step waits for; names as `Estimate.exposed_s` has them."""

    fsdp: np.ndarray
    embedding: np.ndarray
    tensor: np.ndarray
    data_all_reduce: np.ndarray
    context: np.ndarray
    expert_all_to_all: np.ndarray | None = None  # None: a model without experts

    def as_dict(self) -> dict[str, np.ndarray]:
        return {
            "fsdp": self.fsdp,
            "embedding": self.embedding,
            "tensor": self.tensor,
            "data_all_reduce": self.data_all_reduce,
            "context": self.context,
        } | ({} if self.expert_all_to_all is None else {"expert_all_to_all": self.expert_all_to_all})


def context_traffic(
    cost: CPCost, recompute_attention, overlapped: float, *, hides_behind_attention: bool, shares_hops: bool
) -> ContextTraffic:
    """The strategy's per-layer traffic, the recomputed forward's added to the backward (less what the
    backward reuses of it, the ring's hops too where the target `shares_hops`). Where the spec
    `hides_behind_attention` (the ring's hops) the `overlapped` fraction of what it hides is hidden;
    otherwise that fraction of all its traffic may hide in the layer's compute window (`price_exposure`)."""
    reuses_s = cost.recompute_reuses_s + shares_hops * cost.recompute_shared_hops_s
    backward_s = cost.backward_s + recompute_attention * (cost.forward_s - reuses_s)
    if hides_behind_attention:
        # the traffic a recompute makes unnecessary leaves the exposed part first
        spec_exposed_backward_s = np.clip(
            cost.exposed_backward_s + recompute_attention * (cost.exposed_forward_s - reuses_s),
            0.0,
            backward_s,
        )
        hidden_forward_s = overlapped * (cost.forward_s - cost.exposed_forward_s)
        hidden_backward_s = overlapped * (backward_s - spec_exposed_backward_s)
    else:
        hidden_forward_s, hidden_backward_s = overlapped * cost.forward_s, overlapped * backward_s
    return ContextTraffic(cost.forward_s, backward_s, cost.forward_s - hidden_forward_s, backward_s - hidden_backward_s)


# MaxText 0.2.5 all-reduces the gradients over the data axis in one call per group of a layer's weights, 4 a
# layer, and 7 more a step (embedding, head, final norm, scalars): its compile over v5e slices
# (docs/evidence/maxtext_dcn.txt)
DATA_ALL_REDUCES_PER_LAYER = 4
DATA_ALL_REDUCES_PER_STEP = 7


def data_all_reduces(model) -> int:
    """The gradient all-reduces over the data axis a step takes."""
    return DATA_ALL_REDUCES_PER_LAYER * model.num_layers + DATA_ALL_REDUCES_PER_STEP


def price_traffic(
    x: Candidates, weight_bytes, context: ContextTraffic, *, traits: TargetTraits = TRAITS[Target.CPPLAN]
) -> Traffic:
    """Prices every collective of a step for every candidate; `weight_bytes` is one layer's weights on a
    device in the compute dtype, `traits` the runtime's (which collectives its compiler makes of them)."""
    m, comm, tensor = x.model, x.comm, x.tensor
    group = x.weight_group
    weights = x.links["weights"]
    # an all-reduce costs a reduce-scatter and an all-gather of the same bytes: one more of them
    gathers_by_all_reduce = traits.weight_gathers_all_reduce_split_axes and _weight_axes_split(x)
    gather_factor = np.where(gathers_by_all_reduce, 2.0, 1.0)
    # the gradients of the gathered compute-dtype weights are in the compute dtype
    scatter_factor = np.where(traits.context_gradients_all_reduced & (x.ring * x.ulysses > 1), 2.0, 1.0)
    gather_s = gather_factor * _layer_weights_s(x, weight_bytes, comm.all_gather)
    scatter_s = scatter_factor * _layer_weights_s(x, weight_bytes, comm.reduce_scatter)
    regather_s = gather_factor * _qkv_regather_s(x, group, weights)
    windows = _windowed_projections(x, group, weights, traits)
    head_params = m.vocab * m.hidden
    head_gather_s = 2 * comm.all_gather(head_params * x.act_bytes / tensor, group, *weights)
    head_scatter_s = comm.reduce_scatter(head_params * x.param_bytes / tensor, group, *weights)
    # the lookup hands each device its tokens' full hidden vectors: an all-to-all over the weight
    # group of the device's activations, and its transpose in the backward; a per-layer inputs' table
    # (Gemma 4 E2B, E4B), sharded as the embedding, hands over every layer's inputs the same way
    looked_up = m.hidden + (m.num_layers * m.per_layer_inputs.width if m.per_layer_inputs else 0)
    embedding_s = 2 * comm.all_to_all(x.tokens_per_device * looked_up * x.act_bytes, group, *weights)
    one_tensor_gather_s = comm.all_gather(x.tokens_per_device * m.hidden * x.act_bytes, tensor, *x.links["tensor"])
    repeated = x.remat_columns.recompute_tensor_collectives
    # the loss sums its input's gradient over the vocabulary slices: one all-reduce of the activations
    loss_sum_s = comm.all_reduce(x.tokens_per_device * m.hidden * x.act_bytes, tensor, *x.links["tensor"])
    tensor_s = m.num_layers * one_tensor_gather_s * (tensor_collectives_per_layer(m) + repeated) + loss_sum_s
    # gradients cross the data axis in the compute dtype, as they cross the weight group (compiled steps), in
    # `data_all_reduces` calls, each waiting the axis's latency (over slices, DCN's)
    data_bw, data_lat = x.links["data"]
    data_s = comm.all_reduce(m.num_params * x.act_bytes / (group * tensor), x.data, data_bw, data_lat) + (
        data_all_reduces(m) - 1
    ) * comm.all_reduce(0.0, x.data, data_bw, data_lat)
    return Traffic(
        gather_s + windows.forward_s,
        gather_s + regather_s + windows.backward_s,
        scatter_s + windows.scatter_s,
        head_gather_s,
        head_scatter_s,
        embedding_s,
        tensor_s,
        data_s,
        context,
        expert_all_to_all_s(x) if m.experts else None,
    )


def _layer_weights_s(x: Candidates, weight_bytes, collective) -> np.ndarray:
    """Per layer, one collective per weight array (`collective`: an all-gather or a reduce-scatter; the bytes
    of the whole layer as gathered, `weight_bytes`, the latency of each array) over the weight group; a model's
    routed experts' arrays over the weight group less `expert` (`GROUP_AXES["expert_weights"]`): each device
    gathers the E/e experts it holds, 1/e of their bytes."""
    m = x.model
    arrays = weight_arrays_per_layer(m)
    if not m.experts:
        return arrays * collective(weight_bytes / arrays, x.weight_group, *x.links["weights"])
    routed = routed_weight_bytes(x) / x.expert  # `weight_bytes` holds these: the experts the device keeps
    routed_arrays = m.mlp_matrices * m.moe_layers / m.num_layers
    other_arrays = arrays - routed_arrays
    return other_arrays * collective(
        (weight_bytes - routed) / other_arrays, x.weight_group, *x.links["weights"]
    ) + routed_arrays * collective(routed / routed_arrays, x.expert_weight_group, *x.links["expert_weights"])


def expert_all_to_all_s(x: Candidates) -> np.ndarray:
    """Per step, the experts' all-to-alls over `expert` (MaxText's `ragged_all_to_all`, priced as an
    all-to-all of the balanced bytes each device holds, `dispatch_bytes`, on the expert group's links): in
    each mixture-of-experts layer the forward's dispatch and return, their transposes in the backward, and the
    forward's again where the remat policy recomputes the MLP (zero without expert parallelism)."""
    m = x.model
    per_layer = x.comm.all_to_all(dispatch_bytes(x), x.expert, *x.links["expert"])
    count = DISPATCH_ALL_TO_ALLS * (2 + x.remat_columns.recompute_mlp)
    return m.moe_layers * count * per_layer


def _weight_axes_split(x: Candidates) -> np.ndarray:
    """Per candidate, whether the weight group's axes (fsdp and both context axes) split one of
    the slice's physical dimensions between them."""
    dims = tuple(d.size for d in x.topology.physical_dims)
    rows = np.stack([x.fsdp, x.expert, x.ring, x.ulysses], axis=1).astype(int)
    distinct, which = distinct_rows(rows)
    split = np.array([not axes_on_whole_dimensions(tuple(r), dims) for r in distinct.tolist()], dtype=bool)
    return split[which.reshape(-1)]


def _qkv_regather_s(x: Candidates, group, weights) -> np.ndarray:
    """Per layer and candidate, the backward's second gather of the q/k/v weights where the attention runs
    as loops of hops (ring, USP) and the policy recomputes those projections: XLA gathers them before the
    forward hops and again after the backward hops. Only where the TPU compiler builds the step, not for a
    ring of two (one hop) without Ulysses, and not in a parallel block, which keeps them across the hops,
    nor in a model mixing masks, whose attention is one conditional between the projections and their
    gradients (docs/provenance/cost_models.md#communication)."""
    regather_s = np.zeros_like(x.tokens_per_device, dtype=float)
    if (
        x.topology.chip.kind.interprets_kernels
        or not STRATEGIES[x.strategy].hides_traffic_behind_attention
        or x.model.decoder_block.parallel
        or len(x.model.layer_masks) > 1
    ):
        return regather_s
    # a plain ring of two (one hop) keeps them; USP's ring of two, between its all-to-alls, does not
    regathers = (x.ring > 2) | (x.ulysses > 1)
    for projection in QKV_PROJECTIONS:
        weight = projection.weight_size(x.model) * x.act_bytes / x.tensor
        regather_s = regather_s + np.where(
            recomputed_checkpoint(x, projection.name) & regathers,
            x.comm.all_gather(weight, group, *weights),
            0.0,
        )
    return regather_s


@dataclass(frozen=True)
class Windows:
    """Per layer, what the q/k/v projections' windowed einsums move beyond the ring collectives of the
    same weights: the forward's gather, the backward's (where it does not recompute them: a recompute
    gathers them whole) and the gradients' scatter."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    scatter_s: np.ndarray


def _windowed_projections(x: Candidates, group, weights, traits: TargetTraits) -> Windows:
    """The windowed einsums' excess (`Windows`) where the target's TPU compiler forms a sequential block's
    q/k/v projections that way (`TargetTraits.windowed_projection_fsdp`), zero elsewhere."""
    zero = np.zeros_like(x.tokens_per_device, dtype=float)
    if (
        traits.windowed_projection_fsdp is None
        or x.topology.chip.kind.interprets_kernels
        or x.model.decoder_block.parallel
    ):
        return Windows(zero, zero, zero)
    windowed = x.fsdp >= traits.windowed_projection_fsdp
    forward_s, backward_s = zero, zero
    for projection in QKV_PROJECTIONS:
        weight = projection.weight_size(x.model) * x.act_bytes / x.tensor
        excess = np.where(
            windowed,
            x.comm.windowed_einsum(weight, group, *weights) - x.comm.all_gather(weight, group, *weights),
            0.0,
        )
        forward_s = forward_s + excess
        backward_s = backward_s + np.where(recomputed_checkpoint(x, projection.name), 0.0, excess)
    # a reduce-scatter costs what an all-gather of the same bytes does: the scatter's excess is the forward's
    return Windows(forward_s, backward_s, forward_s)


def price_exposure(
    traffic: Traffic, *, layer_forward_s, layer_backward_s, num_layers: int, overlap: Overlap
) -> Exposure:
    """The communication each step waits for.

    Of each family only the fraction the compiler overlaps can hide. FSDP's and the strategy's hidden
    traffic, and the overlapped tensor traffic (half each way), share one window, the layer's compute; what
    does not fit is charged to FSDP. The head's and the embedding's collectives (outside the layers) and the
    data all-reduce (no compiled schedule says how much of it hides) are exposed.
    """
    context = traffic.context
    gather, backward_gather, scatter = traffic.weight_gather_s, traffic.backward_gather_s, traffic.gradient_scatter_s
    hidden_gather, hidden_scatter = overlap.of("fsdp_all_gather") * gather, overlap.of("fsdp_reduce_scatter") * scatter
    hidden_backward_gather = overlap.of("fsdp_all_gather") * backward_gather
    hidden_tensor_layer = overlap.of("tensor") * traffic.tensor_s / num_layers
    fsdp_layer_s = (
        (gather - hidden_gather)
        + (backward_gather - hidden_backward_gather)
        + (scatter - hidden_scatter)
        + np.maximum(0.0, hidden_gather + context.hidden_forward_s + hidden_tensor_layer / 2 - layer_forward_s)
        + np.maximum(
            0.0,
            hidden_backward_gather
            + hidden_scatter
            + context.hidden_backward_s
            + hidden_tensor_layer / 2
            - layer_backward_s,
        )
    )
    return Exposure(
        fsdp=num_layers * fsdp_layer_s + traffic.head_gather_s + traffic.head_scatter_s,
        embedding=traffic.embedding_s,
        tensor=traffic.tensor_s - num_layers * hidden_tensor_layer,
        data_all_reduce=traffic.data_all_reduce_s,
        context=num_layers * (context.exposed_forward_s + context.exposed_backward_s),
        # the grouped matmuls wait for the dispatch, and the combine for the return: no compute to hide behind
        expert_all_to_all=traffic.expert_all_to_all_s,
    )
