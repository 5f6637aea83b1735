"""FLOPs of a training step as MaxText counts them (maxtext_utils.calculate_tflops_training_per_device):
matmuls with learnable weights (the embedding is a gather), causal attention halved, the backward twice
the forward. A full mask counts every query×key pair (MaxText's "4 for non-causal"), so MFU stays the
share of peak doing the model's own work; remat recomputation is executed work, never model FLOPs. A local
layer counts each query against its window or chunk (capped at the sequence), halved as causal, as MaxText
counts Gemma 3's sliding-window layers (`calculate_gemma3_tflops_training_per_device`); packed documents
of varying length, on a global layer, count each query against twice the keys it is expected to see in its
document (halved as causal, as a fixed length's chunk is). Gemma 4 E2B and E4B's KV-shared layers project
no keys and values, E2B's have an MLP twice as wide, and per-layer inputs add each layer's gate and
projection and, once, the input embedding's projection to every layer's inputs
(`calculate_gemma4_small_tflops_training_per_device`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models.masks import AttentionMask
from cost_models.models import ModelSpec


@dataclass(frozen=True)
class LayerFlops:
    """Forward FLOPs of one decoder layer for `tokens` tokens in sequences of `seq_len`."""

    qkv: float
    out_proj: float
    mlp: float
    attention: float  # 4·S²·H·d per sequence for a full mask; causal: half of it
    per_layer_input: float = 0.0  # the per-layer input's gate and projection (Gemma 4 E2B, E4B)

    @property
    def matmul(self) -> float:
        return self.qkv + self.out_proj + self.mlp + self.per_layer_input

    @property
    def total(self) -> float:
        return self.matmul + self.attention


def layer_forward_flops(model: ModelSpec, seq_len, tokens, mask: AttentionMask | None = None) -> LayerFlops:
    """Forward FLOPs of one layer with `mask` (default: a global layer's), averaged over the layers of that
    mask where some of them reuse another layer's keys and values (`kv_shared_layers`); `seq_len` and
    `tokens` may be numpy arrays."""
    mask = mask or model.global_mask
    kv_share = model.kv_projecting_share(mask)
    model = model.layer_model(mask)
    d, h, k, hd = model.hidden, model.num_heads, model.num_kv_heads, model.head_dim
    keys = np.minimum(mask.size, seq_len) if mask.local else seq_len
    if model.varying_documents and mask.causal and not mask.local:
        keys = np.vectorize(lambda s: 2 * model.varying_documents.keys_seen(s), otypes=[float])(seq_len)
    if model.latent:  # the latents' projections; the scores are q·k over head_dim, the values v_head_dim wide
        projections, out = model.latent.projection_params(d, h, hd)
        qkv, out_proj, score_value_width = 2.0 * tokens * projections, 2.0 * tokens * out, hd + model.latent.v_head_dim
    else:
        kv_projections = (1 if model.shared_kv else 2) * kv_share
        qkv, out_proj = 2.0 * tokens * d * (h + kv_projections * k) * hd, 2.0 * tokens * d * h * hd
        score_value_width = 2 * hd
    per_layer_input = tokens * model.per_layer_inputs.layer_flops_per_token(d) if model.per_layer_inputs else 0.0
    return LayerFlops(
        qkv=qkv,
        out_proj=out_proj,
        mlp=tokens * model.mlp_flops_per_token,
        attention=2.0 * tokens * keys * h * score_value_width / (2 if mask.causal else 1),
        per_layer_input=per_layer_input,
    )


def mean_layer_forward_flops(model: ModelSpec, seq_len, tokens) -> LayerFlops:
    """`layer_forward_flops` averaged over the model's layers (their masks, and the head shapes that go
    with them)."""
    kinds = [
        (count / model.num_layers, layer_forward_flops(model, seq_len, tokens, mask))
        for mask, count in model.layer_masks
    ]
    names = ("qkv", "out_proj", "mlp", "attention", "per_layer_input")
    return LayerFlops(*(sum(share * getattr(f, name) for share, f in kinds) for name in names))


def head_forward_flops(model: ModelSpec, tokens) -> float:
    """Forward FLOPs of the output projection to the vocabulary."""
    return 2.0 * tokens * model.hidden * model.vocab


def per_layer_input_projection_flops(model: ModelSpec, tokens) -> float:
    """Forward FLOPs of the input embedding's projection to every layer's inputs, once per step (0 for a
    model without per-layer inputs)."""
    p = model.per_layer_inputs
    return tokens * p.projection_flops_per_token(model.hidden, model.num_layers) if p else 0.0


def model_flops_per_step(model: ModelSpec, seq_len: int, global_batch: int) -> float:
    """Model FLOPs of one training step (forward + backward) over the whole batch."""
    tokens = seq_len * global_batch
    layers = sum(count * layer_forward_flops(model, seq_len, tokens, mask).total for mask, count in model.layer_masks)
    outside = head_forward_flops(model, tokens) + per_layer_input_projection_flops(model, tokens)
    return 3.0 * (layers + outside)
