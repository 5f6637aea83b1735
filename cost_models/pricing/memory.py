"""HBM held per device over a step, by component, and its peak.

HBM is held in phases: what lives all step (`STATIC_MEMORY`), then the larger of a layer's
backward (`LAYER_MEMORY`) and the loss (`LOSS_MEMORY`). Within a layer's backward the attention
side (its values and the strategy's buffers) and the MLP side (one chunk of tokens) are not live
at once: the layer holds the larger of the two, and the weight being gathered with either.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from cost_models.candidates import Candidates
from cost_models.strategies import Layout
from cost_models.work_layout import MLP_CHUNK_TOKENS, vocab_pieces

STATIC_MEMORY = ("params", "grads", "optimizer", "activations")
LAYER_MEMORY = ("attention_working_set", "attention_buffers", "mlp_working_set", "collective_buffers")
LOSS_MEMORY = ("logits", "head_buffers")


def layer_bytes(memory: dict):
    """A layer's backward: the larger of its attention side and its MLP side, and the collectives'
    buffers (arrays or floats)."""
    return np.maximum(memory["attention_working_set"] + memory["attention_buffers"],
                      memory["mlp_working_set"]) + memory["collective_buffers"]


def peak_bytes(memory: dict):
    """Peak HBM per device: the static part plus the larger of the two phases (arrays or floats)."""
    static = sum(memory[k] for k in STATIC_MEMORY)
    return static + np.maximum(layer_bytes(memory), sum(memory[k] for k in LOSS_MEMORY))


@dataclass(frozen=True)
class MemoryBytes:
    """Bytes per device by component (arrays over candidates); names as `Estimate.hbm_bytes` has them."""

    params: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray  # what each layer keeps for its backward, all layers
    attention_working_set: np.ndarray  # one layer's backward, attention side
    attention_buffers: np.ndarray
    mlp_working_set: np.ndarray  # one layer's backward, one MLP chunk
    collective_buffers: np.ndarray
    logits: np.ndarray
    head_buffers: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def price_memory(x: Candidates, layout: Layout, context_buffer_bytes) -> MemoryBytes:
    """HBM each candidate holds per device, by component.

    Args:
        x: the candidates.
        layout: how the attention kernel lies on a device.
        context_buffer_bytes: what the strategy's own traffic holds at the peak of one layer.
    Returns:
        Their `MemoryBytes`.
    """
    m, tensor, tokens = x.model, x.tensor, x.tokens_per_device
    a, pb = x.act_bytes, x.param_bytes
    remat = x.remat_columns
    group = x.weight_group
    shards = group * tensor
    # every kept value is split over tensor: heads and MLP columns, or the sequence between the
    # tensor-parallel matmuls (sequence parallelism)
    saved = remat.saved_on_device / tensor * a
    # one layer's backward: the gradient of every value, and the values the policy does not keep
    # on device (recomputed, or back from the host; the kept ones are counted in `activations`).
    # The attention side for every token (the residual and, in a sequential block, the out
    # projection feeding the second norm, a tensor-th of them under sequence parallelism, the normed
    # input gathered whole, q/k/v and the attention output split by heads); the MLP's for one chunk
    # of tokens (each chunk is its own checkpoint: kept MLP values are read chunk by chunk)
    residual_values = 1 if m.decoder_block.parallel else 2
    attention_side = (m.hidden * (1 + residual_values / tensor)
                      + (2 * m.num_heads + 2 * m.num_kv_heads) * m.head_dim / tensor)
    mlp_side = m.mlp_inputs * m.intermediate / tensor + m.hidden  # its input projections' outputs and its input
    mlp_tokens = np.minimum(MLP_CHUNK_TOKENS, tokens)
    loss_tokens = np.minimum(x.loss_chunk_tokens or np.inf, tokens)
    head_piece = np.vectorize(lambda t: (m.vocab // int(t)) / vocab_pieces(m.vocab // int(t)), otypes=[float])(tensor)
    largest_matrix = m.hidden * max(m.intermediate, m.num_heads * m.head_dim) / tensor
    return MemoryBytes(
        # every weight is split over the weight-sharding group and tensor, the input embedding
        # included (its embed dimension over both)
        params=m.num_params / shards * pb,
        grads=m.num_params / shards * pb,
        # AdamW's first moment in its own dtype (`mu_dtype`), its second in the parameters'
        optimizer=m.num_params / shards * (x.mu_bytes + pb),
        activations=m.num_layers * tokens * saved,
        attention_working_set=tokens * (2 * attention_side - remat.kept_attention_side / tensor) * a,
        # the MLP's input gathered over tensor and its gradient for every token (the chunk loop's
        # input and output), and one chunk's values
        mlp_working_set=(2 * tokens * m.hidden + mlp_tokens * (2 * mlp_side - remat.kept_mlp_side / tensor)) * a,
        # the strategy's buffers, and one fp32 value per local query and head
        attention_buffers=context_buffer_bytes + x.sequences_per_device * layout.q_len * layout.q_heads * 4,
        # weights are gathered matrix by matrix: the one in use, the next one arriving, and the
        # unreduced fp32 gradient of one matrix on its way to the reduce-scatter
        collective_buffers=largest_matrix * (2 * a + pb),
        # fp32 logits of one chunk of tokens against one piece of the vocabulary (the gradient
        # formed in place, fused with the softmax)
        logits=loss_tokens * head_piece * 4,
        # the gathered head piece (the head enters the loss in the compute dtype) and its fp32 gradient
        head_buffers=m.hidden * head_piece * (a + 4),
    )
