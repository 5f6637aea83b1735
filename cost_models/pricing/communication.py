"""Collective traffic per device, and how much of it the step waits for.

FSDP gathers a layer's weights (one collective per weight array) and reduce-scatters its fp32
gradients; tensor parallelism gathers activations; data parallelism all-reduces gradients once
a step; the strategy's own context traffic comes from its spec. Where the chip overlaps
communication with compute, FSDP traffic and the strategy's hidden traffic share one window, the
layer's compute; what does not fit in it is exposed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models.candidates import Candidates
from cost_models.strategies import CPCost
from cost_models.work_layout import WEIGHT_ARRAYS_PER_LAYER

TENSOR_COLLECTIVES_PER_LAYER = 8  # a layer's tensor-parallel gathers and scatters: 4 forward, 4 backward


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

    weight_gather_s: np.ndarray  # per layer: all-gather of its weights
    gradient_scatter_s: np.ndarray  # per layer: reduce-scatter of its fp32 gradients
    embedding_s: np.ndarray  # per step: embeddings gathered twice, their gradient scattered once
    tensor_s: np.ndarray  # per step
    data_all_reduce_s: np.ndarray  # per step
    context: ContextTraffic  # per layer

    def per_step(self, num_layers: int) -> dict[str, np.ndarray]:
        """Seconds per step of each collective family; names as `Estimate.comm_s` has them."""
        return {
            "fsdp_all_gather": num_layers * 2 * self.weight_gather_s + self.embedding_s * 2 / 3,
            "fsdp_reduce_scatter": num_layers * self.gradient_scatter_s + self.embedding_s / 3,
            "tensor": self.tensor_s,
            "data_all_reduce": self.data_all_reduce_s,
            "context": num_layers * (self.context.forward_s + self.context.backward_s),
        }


@dataclass(frozen=True)
class Exposure:
    """Communication seconds per step the step waits for; names as `Estimate.exposed_s` has them."""

    fsdp: np.ndarray
    tensor: np.ndarray
    data_all_reduce: np.ndarray
    context: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        return {"fsdp": self.fsdp, "tensor": self.tensor, "data_all_reduce": self.data_all_reduce,
                "context": self.context}


def context_traffic(cost: CPCost, recompute_attention, overlaps: bool) -> ContextTraffic:
    """The strategy's per-layer traffic with the recomputed forward's added to the backward.

    Args:
        cost: the strategy's `CPCost`.
        recompute_attention: forward attention passes the remat policy recomputes (per candidate).
        overlaps: whether the chip overlaps communication with compute.
    Returns:
        Its `ContextTraffic`.
    """
    backward_s = cost.backward_s + recompute_attention * (cost.forward_s - cost.recompute_reuses_s)
    if not overlaps:
        return ContextTraffic(cost.forward_s, backward_s, cost.forward_s, backward_s)
    exposed_backward_s = cost.exposed_backward_s + recompute_attention * (cost.exposed_forward_s
                                                                          - cost.recompute_reuses_s)
    return ContextTraffic(cost.forward_s, backward_s, cost.exposed_forward_s, exposed_backward_s)


def price_traffic(x: Candidates, weight_bytes, context: ContextTraffic) -> Traffic:
    """Prices every collective of a step for every candidate.

    Args:
        x: the candidates.
        weight_bytes: one layer's weights on a device, in the compute dtype.
        context: the strategy's own traffic.
    Returns:
        Their `Traffic`.
    """
    m, comm, tensor = x.model, x.comm, x.tensor
    group = x.weight_group
    weights = x.links["weights"]
    # one collective per weight array: the bytes of the whole layer, the latency of each array
    arrays = WEIGHT_ARRAYS_PER_LAYER
    gather_s = arrays * comm.all_gather(weight_bytes / arrays, group, *weights)
    scatter_s = arrays * comm.reduce_scatter(m.params_per_layer * x.param_bytes / tensor / arrays, group, *weights)
    embedding_bytes = m.embedding_params * x.act_bytes / tensor
    embedding_s = 2 * comm.all_gather(embedding_bytes, group, *weights) + comm.reduce_scatter(
        m.embedding_params * x.param_bytes / tensor, group, *weights)
    one_tensor_gather_s = comm.all_gather(x.tokens_per_device * m.hidden * x.act_bytes, tensor, *x.links["tensor"])
    repeated = x.remat_columns.recompute_tensor_collectives
    tensor_s = m.num_layers * one_tensor_gather_s * (TENSOR_COLLECTIVES_PER_LAYER + repeated)
    data_s = comm.all_reduce(m.num_params * x.param_bytes / (group * tensor), x.data, *x.links["data"])
    return Traffic(gather_s, scatter_s, embedding_s, tensor_s, data_s, context)


def price_exposure(traffic: Traffic, *, layer_forward_s, layer_backward_s, num_layers: int,
                   overlaps: bool) -> Exposure:
    """The communication each step waits for.

    FSDP traffic and the strategy's hidden traffic share one window, the layer's compute; what
    does not fit in it is exposed (charged to FSDP, which the strategy's hiding left no room for).

    Args:
        traffic: the step's collectives.
        layer_forward_s: one layer's forward compute, the window of its forward traffic.
        layer_backward_s: one layer's backward compute (recomputation included).
        num_layers: decoder layers.
        overlaps: whether the chip overlaps communication with compute (no window when not).
    Returns:
        The `Exposure` per step.
    """
    window_forward, window_backward = (layer_forward_s, layer_backward_s) if overlaps else (0.0, 0.0)
    context = traffic.context
    fsdp_layer_s = (np.maximum(0.0, traffic.weight_gather_s + context.hidden_forward_s - window_forward)
                    + np.maximum(0.0, traffic.weight_gather_s + traffic.gradient_scatter_s + context.hidden_backward_s
                                 - window_backward))
    return Exposure(
        fsdp=num_layers * fsdp_layer_s + traffic.embedding_s,
        tensor=traffic.tensor_s,
        data_all_reduce=traffic.data_all_reduce_s,
        context=num_layers * (context.exposed_forward_s + context.exposed_backward_s),
    )
