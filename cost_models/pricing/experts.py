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

# HBM passes over the routed copies (tokens × top k × hidden) in one forward: the permute gathers them in
# expert order and writes them (2), the unpermute reads the grouped matmul's output and writes it back in
# token order (2), the combine reads it once more to weight and sum per token (1)
PERMUTE_PASSES = 5


@dataclass(frozen=True)
class ExpertTimes:
    """One mixture-of-experts layer's MLP on one device, forward (arrays over candidates)."""

    router_s: np.ndarray  # the router's matmul (hidden × experts) on every token
    grouped_s: np.ndarray  # the routed experts' grouped matmuls, their groups' row tiles padded
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
    """Useful fraction of the MXU's work in the grouped matmuls, relative to a dense matmul: each group's
    rows padded to whole row tiles of the chip's MXU side (a group's last tile is part empty)."""
    return tile_efficiency(np.maximum(expert_group_rows(x), 1.0), x.topology.chip.mxu_tile)


def price_experts(x: Candidates) -> ExpertTimes:
    """Prices one mixture-of-experts layer's MLP for every candidate (the model must have experts)."""
    m, tensor = x.model, x.tensor
    e = m.experts
    tokens = np.asarray(x.tokens_per_device, dtype=float)
    tile, achievable = x.topology.chip.mxu_tile, x.achievable_matmul_flops
    width = e.intermediate / tensor
    columns = tile_efficiency(m.hidden, tile) * tile_efficiency(width, tile)
    expert_flops = 2.0 * m.mlp_matrices * m.hidden * width  # per row, one expert
    router_s = 2.0 * tokens * m.hidden * e.count / (achievable * tile_efficiency(e.count, tile))
    grouped_s = tokens * e.per_token * expert_flops / (achievable * grouped_matmul_efficiency(x) * columns)
    shared_s = tokens * e.shared * expert_flops / (achievable * columns)
    permute_s = PERMUTE_PASSES * tokens * e.per_token * m.hidden * x.act_bytes / x.topology.hbm_bw_per_device
    return ExpertTimes(router_s=router_s, grouped_s=grouped_s, shared_s=shared_s, permute_s=permute_s)
