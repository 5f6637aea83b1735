"""The matmuls of one decoder layer on one device: the projections (q/k/v and out) and the MLP (with a
per-layer input's gate and projection, Gemma 4 E2B and E4B) on the MXU with its tile padding, bounded below
by reading the layer's weights from HBM."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models.candidates import Candidates
from cost_models.chips import GroupedKernel
from cost_models.compute import tile_efficiency
from cost_models.flops import mean_layer_forward_flops
from cost_models.pricing.experts import price_experts, routed_weight_bytes


@dataclass(frozen=True)
class MatmulTimes:
    """One decoder layer's matmuls on one device (arrays over candidates)."""

    projections_s: np.ndarray  # forward MXU time of the q/k/v and output projections
    mlp_s: np.ndarray  # forward MXU time of the MLP and of a per-layer input's gate and projection
    weight_bytes: np.ndarray  # the layer's weights on one device as gathered (1/e of its routed experts), compute dtype
    forward_s: np.ndarray  # the forward math, or reading the weights when that takes longer
    backward_s: np.ndarray  # dX and dW (twice the forward math), or reading weights twice and writing fp32 grads
    recompute_s: np.ndarray  # what the remat policy runs again in the backward
    math_s: np.ndarray  # MXU time of forward, backward and recomputation together
    executed_flops: np.ndarray  # FLOPs of forward, backward and recomputation

    @property
    def weight_read_excess_s(self) -> np.ndarray:
        """Where reading the weights outlasts the math, forward and backward."""
        return self.forward_s + self.backward_s - 3 * (self.projections_s + self.mlp_s)


def price_matmuls(
    x: Candidates, *, mlp_chunk_tokens: int | None = None, grouped_kernel: GroupedKernel = GroupedKernel.TOKAMAX
) -> MatmulTimes:
    """Prices one decoder layer's matmuls for every candidate (a mixture of experts' MLP averaged with a
    dense lead's over the layers; its grouped matmuls a call per MLP chunk of the target's, `mlp_chunk_tokens`)."""
    model, chip = x.model, x.topology.chip
    tile, tensor = chip.mxu_tile, x.tensor
    flops = mean_layer_forward_flops(model, x.seq_len, x.tokens_per_device)
    qkv_columns = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim / tensor
    qkv_padding = tile_efficiency(model.hidden, tile) * tile_efficiency(qkv_columns, tile)
    out_padding = tile_efficiency(model.num_heads * model.head_dim / tensor, tile) * tile_efficiency(model.hidden, tile)
    mlp_padding = tile_efficiency(model.hidden, tile) * tile_efficiency(model.intermediate / tensor, tile)
    projections_s = (flops.qkv / qkv_padding + flops.out_proj / out_padding) / tensor / x.achievable_matmul_flops
    # a per-layer input's gate and projection (`hidden` × its width, the width split over tensor as the MLP's):
    # run after the MLP and, having no checkpoint name of their own, recomputed with it
    ple = model.per_layer_inputs
    ple_padding = tile_efficiency(model.hidden, tile) * tile_efficiency(ple.width / tensor, tile) if ple else 1.0
    mlp_s = mlp_seconds(x, mlp_padding, mlp_chunk_tokens, grouped_kernel) + (
        flops.per_layer_input / ple_padding / tensor / x.achievable_matmul_flops
    )

    hbm_bw = x.topology.hbm_bw_per_device
    # the layer's weights as a device gathers them: of the routed experts, only the E/e it holds
    layer_params = model.params_per_layer - routed_weight_bytes(x) / x.act_bytes * tensor * (1 - 1 / x.expert)
    weight_bytes = layer_params * x.act_bytes / tensor
    forward_s = np.maximum(projections_s + mlp_s, weight_bytes / hbm_bw)
    backward_s = np.maximum(
        2 * (projections_s + mlp_s), (2 * weight_bytes + layer_params * x.param_bytes / tensor) / hbm_bw
    )
    remat = x.remat_columns
    return MatmulTimes(
        projections_s=projections_s,
        mlp_s=mlp_s,
        weight_bytes=weight_bytes,
        forward_s=forward_s,
        backward_s=backward_s,
        recompute_s=remat.recompute_qkv_out * projections_s + remat.recompute_mlp * mlp_s,
        math_s=projections_s * (1 + 2 + remat.recompute_qkv_out) + mlp_s * (1 + 2 + remat.recompute_mlp),
        executed_flops=(
            (flops.qkv + flops.out_proj) / tensor * (3 + remat.recompute_qkv_out)
            + (flops.mlp + flops.per_layer_input) / tensor * (3 + remat.recompute_mlp)
        ),
    )


def mlp_seconds(
    x: Candidates,
    dense_padding,
    mlp_chunk_tokens: int | None = None,
    grouped_kernel: GroupedKernel = GroupedKernel.TOKAMAX,
) -> np.ndarray:
    """Forward seconds of one layer's MLP, averaged over the layers: the dense MLP's matmuls on the MXU with
    its tile padding (a wide layer's twice, `ModelSpec.mean_dense_mlp_params`), a mixture of experts' routing,
    grouped matmuls and permutes (`price_experts`)."""
    model = x.model
    dense_s = (
        2.0 * x.tokens_per_device * model.mean_dense_mlp_params / dense_padding / x.tensor / x.achievable_matmul_flops
    )
    if not model.experts:
        return dense_s
    share = model.moe_layers / model.num_layers
    return (1 - share) * dense_s + share * price_experts(x, mlp_chunk_tokens, grouped_kernel).total_s
