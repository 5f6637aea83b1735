"""HBM held per device over a step, by component, and its peak.

HBM is held in phases: what lives all step (`STATIC_MEMORY`: through the forward, the loss and the
backward), then the larger of a layer's backward (`LAYER_MEMORY`) and the loss (`LOSS_MEMORY`); at
the step's end, with the activations and the layer weights' compute-dtype copies gone, the
optimizer's update (`UPDATE_MEMORY`: the weights, every gradient and the moments, and the update's
own temporaries). Within a layer's backward the attention side (its values and the
strategy's buffers, and the weights being gathered) and the MLP side (one chunk of tokens, and
the MLP's weights and gradient sums its chunk loop holds) are not live at once: the layer holds the
larger of the two (where the attention's recomputation runs first, the MLP side holds that too:
on every chip where the policy recomputes the out projection as well, whose input it is, and on
chips whose schedule runs it first anyway, the row's `attention_before_mlp_backward`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from cost_models.candidates import Candidates
from cost_models.chips import ChipKind
from cost_models.remat import ATTENTION_OUTPUT, POLICIES, placements
from cost_models.strategies import STRATEGIES, Layout
from cost_models.strategies.base import SPLASH_LANES
from cost_models.vocabulary import Placement
from cost_models.work_layout import MLP_CHUNK_TOKENS, residual_tokens, vocab_pieces

STATIC_MEMORY = ("params", "grads", "optimizer", "activations", "weight_casts")
LAYER_MEMORY = ("attention_working_set", "attention_buffers", "mlp_working_set", "collective_buffers")
LOSS_MEMORY = ("logits", "head_buffers")
UPDATE_MEMORY = ("params", "grads", "update_gradients", "optimizer", "optimizer_update")


def layer_bytes(memory: dict):
    """A layer's backward: the larger of its attention side (with the collectives' buffers) and
    its MLP side (arrays or floats)."""
    return np.maximum(memory["attention_working_set"] + memory["attention_buffers"] + memory["collective_buffers"],
                      memory["mlp_working_set"])


def backward_bytes(memory: dict):
    """HBM per device during the backward: the static part plus the larger of a layer's backward
    and the loss (arrays or floats). It grows with the tokens a device holds."""
    static = sum(memory[k] for k in STATIC_MEMORY)
    return static + np.maximum(layer_bytes(memory), sum(memory[k] for k in LOSS_MEMORY))


def update_bytes(memory: dict):
    """HBM per device during the optimizer's update at the step's end (arrays or floats); it does
    not depend on the tokens."""
    return sum(memory[k] for k in UPDATE_MEMORY)


def peak_bytes(memory: dict):
    """Peak HBM per device: the backward's, or the update's where that holds more (short
    sequences), arrays or floats."""
    return np.maximum(backward_bytes(memory), update_bytes(memory))


@dataclass(frozen=True)
class MemoryBytes:
    """Bytes per device by component (arrays over candidates); names as `Estimate.hbm_bytes` has them."""

    params: np.ndarray
    grads: np.ndarray  # what the backward holds: the layers' gradients, the head's in the compute dtype
    update_gradients: np.ndarray  # the rest of the gradients, formed at the step's end
    optimizer: np.ndarray
    activations: np.ndarray  # what each layer keeps for its backward, all layers
    weight_casts: np.ndarray  # every layer's weight shards in the compute dtype, through the forward and backward
    attention_working_set: np.ndarray  # one layer's backward, attention side
    attention_buffers: np.ndarray
    mlp_working_set: np.ndarray  # one layer's backward, one MLP chunk
    collective_buffers: np.ndarray
    logits: np.ndarray
    head_buffers: np.ndarray
    # the output head's update at the step's end, beyond its gradient (in `grads` + `update_gradients`)
    optimizer_update: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def layer_gradient_bytes(x: Candidates) -> np.ndarray:
    """Every decoder layer's weight gradients on a device, in the parameters' dtype (split over the
    weight-sharding group and tensor, as the weights are)."""
    return x.model.num_layers * x.model.params_per_layer / (x.weight_group * x.tensor) * x.param_bytes


def price_memory(x: Candidates, layout: Layout, context_buffer_bytes, *,
                 mlp_chunk_tokens: int | None = MLP_CHUNK_TOKENS,
                 head_gradient_in_head_layout: bool) -> MemoryBytes:
    """HBM each candidate holds per device, by component.

    Args:
        x: the candidates.
        layout: how the attention kernel lies on a device.
        context_buffer_bytes: what the strategy's own traffic holds at the peak of one layer.
        mlp_chunk_tokens: tokens per device of one MLP chunk in a layer's backward, or None where
            the MLP runs on all of them at once (the target's `mlp_chunk_tokens`).
        head_gradient_in_head_layout: whether the loss forms the head's gradient in the head's own
            layout, so the update moves no layouts (the target's `head_gradient_in_head_layout`).
    Returns:
        Their `MemoryBytes`.
    """
    m, tensor, tokens = x.model, x.tensor, x.tokens_per_device
    a, pb = x.act_bytes, x.param_bytes
    remat = x.held_remat_columns  # an offload that does not leave HBM is held as a kept value
    group = x.weight_group
    shards = group * tensor
    # every kept value is split over tensor: heads and MLP columns, or the sequence between the
    # tensor-parallel matmuls (sequence parallelism)
    saved = remat.saved_on_device / tensor * a
    # one layer's backward: the gradient of every value, and the values the policy does not keep
    # on device (recomputed, or back from the host; the kept ones are counted in `activations`).
    # The attention side for every token (the residual and, in a sequential block, the out
    # projection feeding the second norm, on the residual stream's tokens, `residual_tokens`; the
    # normed input gathered whole, q/k/v and the attention output split by heads); the MLP's for one
    # chunk of tokens (each chunk is its own checkpoint: kept MLP values are read chunk by chunk)
    residual_values = 1 if m.decoder_block.parallel else 2
    attention_values = (tokens * (m.hidden + (2 * m.num_heads + 2 * m.num_kv_heads) * m.head_dim / tensor)
                        + residual_tokens(tokens, tensor) * residual_values * m.hidden)
    mlp_side = m.mlp_inputs * m.intermediate / tensor + m.hidden  # its input projections' outputs and its input
    mlp_tokens = np.minimum(mlp_chunk_tokens or np.inf, tokens)
    loss_tokens = np.minimum(x.loss_chunk_tokens or np.inf, tokens)
    # one piece's columns for each tensor degree present (a search prices few degrees over many rows)
    degrees, which = np.unique(np.asarray(tensor, dtype=int), return_inverse=True)
    piece_of_degree = np.array([(m.vocab // t) / vocab_pieces(m.vocab // t) for t in degrees])
    head_piece = piece_of_degree[which].reshape(np.shape(tensor))
    largest_matrix = m.hidden * max(m.intermediate, m.num_heads * m.head_dim) / tensor
    mlp_matrix = m.hidden * m.intermediate / tensor
    # the chunk loop reads every MLP matrix for every chunk, so all are gathered before it and held
    # through it; it carries each matrix's weight gradient summed over the chunks in the compute
    # dtype, and forms a chunk's new sum while the carried one is read (with one chunk there is no
    # sum to carry: each gradient is formed once)
    mlp_loop_matrices = 2 * m.mlp_matrices + (tokens > mlp_tokens)
    layer_grads = layer_gradient_bytes(x)
    head_shard = m.hidden * m.vocab / shards
    # kept MLP values are not read in place: the layer's backward slices its layer's out of the
    # stacked residuals (a dynamic slice XLA copies), and the chunk loop each chunk's out of that
    # copy (counted with the chunk's values); with one chunk the two slices are one
    kept_mlp_copy = np.where(tokens > mlp_tokens, tokens * remat.kept_mlp_side / tensor, 0.0)
    attention_early = (attention_before_mlp_backward(x, layout) * x.sequences_per_device * m.head_dim
                       * (3 * layout.q_len * layout.q_heads + 2 * layout.kv_len * layout.kv_heads))
    # the layer's offloaded values its attention's backward reads, back from the host since its
    # backward began (the layer loop's host reads run an iteration ahead: `READ_BY_ATTENTION_BACKWARD`)
    fetched_ahead = tokens * remat.fetched_ahead / tensor
    # where the MLP's input is recomputed through the attention, the attention's forward runs again
    # before the MLP's backward, and what its own backward reads (the attention side's values, less
    # those kept on device or fetched ahead from the host, counted as such) is held through the MLP's
    # (and, where the chip's compiler keeps it so, the kernel's log-sum-exp in its lane-wide output)
    rerun = attention_values_through_mlp_backward(x)
    attention_first = rerun * np.maximum(
        attention_values - tokens * (remat.kept_attention_side + remat.fetched_ahead) / tensor, 0.0)
    lse_first = rerun * x.topology.chip.splash_lse_lanes_held * lse_lane_bytes(x, layout)
    return MemoryBytes(
        # every weight is split over the weight-sharding group and tensor, the input embedding
        # included (its embed dimension over both)
        params=m.num_params / shards * pb,
        # through the backward: the layers' gradients in the parameters' dtype, and the output
        # head's in the compute dtype (the loss's backward forms it piece by piece as the matmuls'
        # output); the input embedding's is formed from the first layer's input gradient, after every
        # layer's backward, and both are brought to the parameters' dtype for the update (deviceless
        # compiles of bench_memory's rows: no gradient of the embedding or fp32 gradient of the head
        # is live in a layer's backward; benchmarks/results/memory/weight_casts.md)
        grads=layer_grads + head_shard * a,
        update_gradients=m.num_params / shards * pb - layer_grads - head_shard * a,
        # AdamW's first moment in its own dtype (`mu_dtype`), its second in the parameters'
        optimizer=m.num_params / shards * (x.mu_bytes + pb),
        activations=m.num_layers * tokens * saved,
        # the layers' weights enter the layer in the compute dtype; the cast of each layer's slice is
        # hoisted out of the layer loop onto the stacked shards, made once in the forward and read by
        # the backward's loop again, so every layer's copy is held until the last layer's backward
        # (deviceless v5p and tpu7x compiles of bench_memory's rows: `convert` of each stacked weight,
        # e.g. bf16[2,512,14336], 104 MiB at 2 layers and 416 MiB at 8 of Llama 3.1 8B over 8
        # devices; see benchmarks/results/memory/weight_casts.md). None when the two dtypes are one;
        # the norms' scales are cast to fp32 inside the norm, not copied.
        weight_casts=m.num_layers * (m.params_per_layer - m.decoder_block.norms * m.hidden) / shards * a
        * (pb != a),
        attention_working_set=(2 * attention_values - tokens * remat.kept_attention_side / tensor) * a,
        # the MLP's input gathered over tensor and its gradient for every token (the chunk loop's
        # input and output) and, over tensor, its output's gradient gathered too; one chunk's values
        # (kept ones copied) and their gradients, the layer's kept MLP values copied, the chunk
        # loop's weights and gradient sums, the attention's values run before the MLP's backward (a
        # chip's schedule, or the policy's), and the offloaded values fetched ahead
        mlp_working_set=((2 + (tensor > 1)) * tokens * m.hidden + mlp_tokens * 2 * mlp_side + kept_mlp_copy
                         + mlp_loop_matrices * mlp_matrix + attention_early + attention_first + fetched_ahead) * a
        + lse_first,
        # the strategy's buffers, and one fp32 value per local query and head
        attention_buffers=context_buffer_bytes + x.sequences_per_device * layout.q_len * layout.q_heads * 4,
        # on the attention side, the weights' traffic: matrices gathered one by one (the one in use,
        # the next one arriving) and an unreduced gradient on its way to the reduce-scatter (in the
        # compiles, the MLP's three bf16 weight gradients, reduced after the attention's backward)
        collective_buffers=largest_matrix * (2 * a + pb),
        # fp32 logits of one chunk of tokens against one piece of the vocabulary (the gradient
        # formed in place, fused with the softmax)
        logits=loss_tokens * head_piece * 4,
        # the gathered head piece (the head enters the loss in the compute dtype) and its fp32 gradient
        head_buffers=m.hidden * head_piece * (a + 4),
        # the layout moves were read from TPU compiles; a host lays its arrays out otherwise, so there
        # it is left out; a gradient in the head's layout needs none
        optimizer_update=head_shard * optimizer_update_bytes_per_head_weight(
            param_bytes=pb, mu_bytes=x.mu_bytes, relayout_off_core=x.topology.chip.relayout_off_tensorcore)
        * (x.topology.chip.kind is ChipKind.TPU and not head_gradient_in_head_layout),
    )


def attention_before_mlp_backward(x: Candidates, layout: Layout) -> np.ndarray:
    """Per candidate, 1.0 where its layer backward holds the attention's recomputed forward (the
    kernel's q, K, V and output) and its output's gradient through the MLP's backward: the chip
    schedules that work first (its row's `attention_before_mlp_backward`: with the attention
    output recomputed and the MLP's input not needing it, the tpu7x compiler runs the attention
    forward again and the out projection's backward before the MLP's chunk loop and holds them
    through it; a ring's loop of hops stays after it), the attention is one kernel call
    (no loop of ring hops), the policy recomputes it, and the MLP's input does not wait for it
    (out_proj kept on device or on the host).

    Args:
        x: the candidates.
        layout: how the attention kernel lies on a device.
    Returns:
        0.0 or 1.0 per candidate.
    """
    if not x.topology.chip.attention_before_mlp_backward:
        return np.zeros(np.shape(x.remat))
    one_call = sum(np.asarray(call.count, dtype=float) for call in STRATEGIES[x.strategy].kernel_calls(x, layout)) == 1
    free = recomputed_checkpoint(x, ATTENTION_OUTPUT) & ~recomputed_checkpoint(x, "out_proj")
    return (free & one_call).astype(float)


def attention_values_through_mlp_backward(x: Candidates) -> np.ndarray:
    """Per candidate, 1.0 where the policy recomputes both the attention output and the out
    projection (`full`, `save_qkv_proj`, ...) of a sequential block: the MLP's input is then
    recomputed through the attention, so on every chip the attention's forward runs again before
    the MLP's backward, and what the attention's backward reads is held through the MLP's
    (deviceless compiles of bench_memory's `full` rows at tensor 2, v5p and tpu7x: the attention's
    normed input gathered, q, K, V, the kernel's output and the residual stream's values live in the
    MLP's chunk loop; benchmarks/results/bench_memory_offload.md, session 12).

    Args:
        x: the candidates.
    Returns:
        0.0 or 1.0 per candidate.
    """
    if x.model.decoder_block.parallel:  # the MLP's input is the layer input's norm: it waits for no attention
        return np.zeros(np.shape(x.remat))
    return (recomputed_checkpoint(x, ATTENTION_OUTPUT) & recomputed_checkpoint(x, "out_proj")).astype(float)


def recomputed_checkpoint(x: Candidates, name: str) -> np.ndarray:
    """Per candidate, whether its policy (its `custom` placements included) recomputes the
    checkpoint `name`."""
    remat = np.array([placements(policy, x.remat_custom)[name] is Placement.REMAT for policy in POLICIES])
    return remat[x.remat]


def lse_lane_bytes(x: Candidates, layout: Layout) -> np.ndarray:
    """Bytes of splash's log-sum-exp residual as its forward kernel writes it: fp32, one row of
    `SPLASH_LANES` per local query and head (jax's splash_attention_kernel; its `[..., 0]` is the
    value the backward reads)."""
    return x.sequences_per_device * layout.q_len * layout.q_heads * SPLASH_LANES * 4


def optimizer_update_bytes_per_head_weight(*, param_bytes: int, mu_bytes: int, relayout_off_core: bool) -> int:
    """Bytes the output head's AdamW update holds per head weight beyond its gradient (counted in
    `grads` + `update_gradients`), where the gradient reaches it stacked by vocabulary piece.

    A loss whose backward reduce-scatters the head's gradient piece by vocabulary piece and stacks
    the pieces hands it over as `[pieces, hidden/g, piece]`, not in the head's `[hidden/g, vocab/t]`
    layout (cpplan's loss did until it wrote each piece into the head's layout; read from its
    deviceless TPU compiles then). The compiler moves the head and both moments into the
    gradient's layout for the update (and the results back), and forms the two gradient terms,
    `(1-b1)·g` and `(1-b2)·g²`, in fp32; these take the place of the head's gradient counted in `grads` + `update_gradients`.
    Where the move runs off the TensorCore (the chip row's `relayout_off_tensorcore`: SparseCore
    data-format calls, whose outputs an elementwise update does not write over) the three updated
    arrays are new buffers too.

    Args:
        param_bytes: bytes of a weight and of the second moment.
        mu_bytes: bytes of the first moment.
        relayout_off_core: whether the chip's compiler moves layouts off the TensorCore.
    Returns:
        Bytes per weight of the head's shard.
    """
    moved = param_bytes + mu_bytes + param_bytes  # the head, mu and nu in the gradient's layout
    gradient_terms = 2 * 4 - param_bytes
    return moved + gradient_terms + (moved if relayout_off_core else 0)
