"""The mixture-of-experts MLP of one decoder layer on one device, as MaxText's sparse matmul runs it with the
experts' weights sharded as every other weight is (FSDP over the weight-sharding group, columns over
tensor): route (the router's matmul, softmax and top k), permute (each token copied once per expert it is
routed to, sorted by expert), the grouped matmuls (every expert over its group of rows), unpermute and
combine (the copies weighted and summed back per token). Each step has its own price here; the dense
layers of a model with a dense lead are priced as any dense MLP (docs/provenance/moe_models.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models.candidates import Candidates
from cost_models.compute import tile_efficiency
from cost_models.vocabulary import Quantization

# HBM passes over the routed copies (tokens × top k × hidden) in one forward: the permute gathers them in
# expert order and writes them (2), the unpermute reads the grouped matmul's output and writes it back in
# token order (2), the combine reads it once more to weight and sum per token (1)
PERMUTE_PASSES = 5


@dataclass(frozen=True)
class ExpertTimes:
    """One mixture-of-experts layer's MLP on one device, forward (arrays over candidates)."""

    router_s: np.ndarray  # the router's matmul (hidden × experts) on every token
    # the routed experts' grouped matmuls: a third of their forward, input-gradient and weight-gradient
    # kernels together, as the chip row's grouped-matmul figures time each (`Chip.grouped_matmul_seconds`)
    grouped_s: np.ndarray
    shared_s: np.ndarray  # the shared experts' dense matmuls
    permute_s: np.ndarray  # moving the routed copies into expert order and back, and combining them

    @property
    def matmul_s(self) -> np.ndarray:
        return self.router_s + self.grouped_s + self.shared_s

    @property
    def total_s(self) -> np.ndarray:
        return self.matmul_s + self.permute_s


def expert_group_rows(x: Candidates) -> np.ndarray:
    """Rows of one expert's group on a device: its tokens' routed copies spread evenly over the experts
    (random or balanced routing), every device routing its own tokens to every expert."""
    e = x.model.experts
    return x.tokens_per_device * e.per_token / e.count


def grouped_matmul_efficiency(x: Candidates) -> np.ndarray:
    """Useful fraction of the chip's peak the routed experts' grouped matmuls reach, their three kernels
    (forward, input gradient, weight gradient) together (`grouped_seconds`)."""
    e, m = x.model.experts, x.model
    tokens = np.asarray(x.tokens_per_device, dtype=float)
    flops = 3 * 2.0 * tokens * e.per_token * m.mlp_matrices * m.hidden * e.intermediate / x.tensor
    return flops / (3 * grouped_seconds(x) * x.topology.peak_flops_per_device)


def grouped_seconds(x: Candidates) -> np.ndarray:
    """A third of the seconds of one layer's routed-expert grouped matmuls, forward and backward (each input
    projection and the output projection; the backward's input gradient as a forward, its weight gradient
    with the row's own figures), per device: the chip row's measured model of a grouped matmul
    (`Chip.grouped_matmul_seconds`), every device running every expert over its own tokens' routed copies."""
    chip, m, e = x.topology.chip, x.model, x.model.experts
    fp8 = x.quantization is Quantization.FP8_FULL

    def one(tokens: float, tensor: float) -> float:
        rows, width = tokens * e.per_token, e.intermediate / tensor
        shapes = [(m.hidden, width)] * m.mlp_inputs + [(width, m.hidden)]
        return (
            sum(
                2 * chip.grouped_matmul_seconds(e.count, rows, k, n, fp8=fp8)
                + chip.grouped_matmul_seconds(e.count, rows, k, n, weight_grad=True, fp8=fp8)
                for k, n in shapes
            )
            / 3
        )

    tokens, tensor = np.broadcast_arrays(
        np.asarray(x.tokens_per_device, dtype=float), np.asarray(x.tensor, dtype=float)
    )
    pairs, where = np.unique(np.stack([tokens.ravel(), tensor.ravel()], axis=1), axis=0, return_inverse=True)
    seconds = np.array([one(t, s) for t, s in pairs])
    return seconds[np.ravel(where)].reshape(tokens.shape)


def price_experts(x: Candidates) -> ExpertTimes:
    """Prices one mixture-of-experts layer's MLP for every candidate (the model must have experts)."""
    m, tensor = x.model, x.tensor
    e = m.experts
    tokens = np.asarray(x.tokens_per_device, dtype=float)
    tile, achievable = x.topology.chip.mxu_tile, x.achievable_matmul_flops
    router_s = 2.0 * tokens * m.hidden * e.count / (achievable * tile_efficiency(e.count, tile))
    grouped_s = grouped_seconds(x)
    shared_s = 0.0 * tokens
    if e.shared:  # a dense MLP of the shared experts' widths together, its columns split over tensor
        width = e.shared * e.shared_width / tensor
        columns = tile_efficiency(m.hidden, tile) * tile_efficiency(width, tile)
        shared_s = tokens * 2.0 * m.mlp_matrices * m.hidden * width / (achievable * columns)
    permute_s = PERMUTE_PASSES * tokens * e.per_token * m.hidden * x.act_bytes / x.topology.hbm_bw_per_device
    return ExpertTimes(router_s=router_s, grouped_s=grouped_s, shared_s=shared_s, permute_s=permute_s)
