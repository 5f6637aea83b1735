"""HBM held per device over a step, by component, and its peak.

Phases: a layer's forward (`FORWARD_MEMORY`), what lives all step (`STATIC_MEMORY`) with a layer's
backward (`layer_bytes`: the larger of its attention side, `ATTENTION_SIDE`, and its MLP side), the loss
(`LOSS_MEMORY`) on all that but the layers' gradients (`LOSS_STATE`), and at the step's end the optimizer's
update (`UPDATE_MEMORY`). Evidence: docs/provenance/cost_models.md#memory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from cost_models.candidates import Candidates
from cost_models.chips import ChipKind
from cost_models.compute import DQ_ACCUMULATOR_BYTES, dq_elements, dq_partials
from cost_models.pricing.attention import key_chunks
from cost_models.pricing.experts import (
    expert_matrix_params,
    gathered_mlp_matrix_params,
    receive_buffer_bytes,
    routed_copy_bytes,
)
from cost_models.pricing.offload import state_bytes
from cost_models.remat import ATTENTION_OUTPUT, choice_placements
from cost_models.strategies import STRATEGIES, Layout
from cost_models.strategies.base import SPLASH_LANES, CPCost, laid_out_values, lane_ratio
from cost_models.vocabulary import HostState, Placement
from cost_models.work_layout import MLP_CHUNK_TOKENS, residual_tokens, vocab_pieces

STATIC_MEMORY = ("params", "layer_grads", "head_grad", "optimizer", "activations", "weight_casts", "relaid_table")
# the layers' backward forms their gradients after the loss: the loss holds the rest of the step's state
LOSS_STATE = tuple(k for k in STATIC_MEMORY if k != "layer_grads")
ATTENTION_SIDE = ("attention_working_set", "attention_buffers", "lse_relayout", "collective_buffers")
LOSS_MEMORY = ("logits", "head_buffers", "loss_input", "flat_program_held")
UPDATE_MEMORY = (
    "params",
    "layer_grads",
    "head_grad",
    "update_gradients",
    "optimizer",
    "optimizer_update",
    "relaid_table",
    "relaid_update",
)
# before any gradient is formed: the state the forward holds and one layer's forward
FORWARD_MEMORY = (
    "params",
    "optimizer",
    "activations",
    "weight_casts",
    "relaid_table",
    "forward_working_set",
    "flat_program_held",
)
# A table slice is copied where its lane padding is under 1/RELAID_PADDING_PARTS of it: deviceless compiles
# copied slices padded by 6.7% and 20% (960, 120 and 320 columns) and none padded by a third or more (192,
# 288, 64 and 16 columns)
RELAID_PADDING_PARTS = 3
# components most plans do not hold, left out of `explain`'s lines where zero
HELD_BY_FEW = ("flat_program_held", "relaid_table", "relaid_update")
# The price is what a step's buffers need packed. libtpu's default placement leaves up to 15% of the
# temporary allocation between them; this one packs them (same schedule, same live peak), and every
# TPU compile and run of cpplan's, and its MaxText export, asks for it (docs/measurements.md,
# "The compiler packs the heap when asked").
PACKED_PLACEMENT_FLAG = "--xla_tpu_buffer_assignment_algorithm=BEST_OF_SPATIAL_TEMPORAL"


def layer_bytes(memory: dict):
    """A layer's backward: the larger of its attention side (with the collectives' buffers) and its MLP side."""
    return np.maximum(sum(memory[k] for k in ATTENTION_SIDE), memory["mlp_working_set"])


def loss_bytes(memory: dict):
    """HBM per device at the loss: the step's state less the layers' gradients, and the loss's own values."""
    return sum(memory[k] for k in LOSS_STATE + LOSS_MEMORY)


def backward_bytes(memory: dict):
    """HBM per device in the backward: the larger of a layer's backward on the static part and the loss."""
    return np.maximum(sum(memory[k] for k in STATIC_MEMORY) + layer_bytes(memory), loss_bytes(memory))


def update_bytes(memory: dict):
    """HBM per device in the optimizer's update at the step's end (independent of the tokens)."""
    return sum(memory[k] for k in UPDATE_MEMORY)


def forward_bytes(memory: dict):
    """HBM per device in a layer's forward, where the layer's kept values are formed beside the stacks."""
    return sum(memory[k] for k in FORWARD_MEMORY)


def peak_bytes(memory: dict):
    """Peak HBM per device: the backward's, or the update's where that holds more (short sequences), or a
    layer's forward's where that does (many kept values a layer)."""
    return np.maximum(np.maximum(backward_bytes(memory), update_bytes(memory)), forward_bytes(memory))


@dataclass(frozen=True)
class MemoryBytes:
    """Bytes per device by component (arrays over candidates); names as `Estimate.hbm_bytes` has them."""

    params: np.ndarray
    layer_grads: np.ndarray  # the layers' gradients, formed in their backward and held to the update
    head_grad: np.ndarray  # the output head's gradient in the compute dtype, formed in the loss
    update_gradients: np.ndarray  # the rest of the gradients, formed at the step's end
    optimizer: np.ndarray
    activations: np.ndarray  # what each layer keeps for its backward, all layers
    weight_casts: np.ndarray  # every layer's weight shards in the compute dtype, through the forward and backward
    attention_working_set: np.ndarray  # one layer's backward, attention side
    attention_buffers: np.ndarray
    # where the log-sum-exp's relayout before the backward's kernels holds more than the attention side, the excess
    lse_relayout: np.ndarray
    mlp_working_set: np.ndarray  # one layer's backward, one MLP chunk
    collective_buffers: np.ndarray
    # one layer's forward at its MLP: the layer's kept values in their own buffers, the residual stream,
    # the MLP's input and its matrices
    forward_working_set: np.ndarray
    logits: np.ndarray
    head_buffers: np.ndarray
    # the loss's input: the last layer's output on the residual stream's tokens; on every token its normed
    # value gathered, the loss loop's copy of it and the gradient the loop sums for it
    loss_input: np.ndarray
    # what an offloading program left with no layer loop holds through the forward and the loss beyond a loop
    # (docs/memory_offload.md, "The flat program's loss, by what it holds")
    flat_program_held: np.ndarray
    # the output head's update at the step's end, beyond its gradient (in the gradients + `update_gradients`)
    optimizer_update: np.ndarray
    # a tied embedding table's copy in the layout its lookup reads, held all step (`relaid_table_values`)
    relaid_table: np.ndarray
    # at the update, the table's moments (and an untied table) copied into that layout
    relaid_update: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def layer_gradient_bytes(x: Candidates) -> np.ndarray:
    """Every decoder layer's weight gradients on a device, in the gradients' dtype (the parameters' unless
    the plan casts them: `Plan.grad_dtype`), split over the weight-sharding group and tensor as the weights are."""
    return x.model.num_layers * x.model.params_per_layer / (x.weight_group * x.tensor) * x.grad_bytes


def reduce_scatter_scratch(x: Candidates, operand_bytes, devices) -> np.ndarray:
    """The HBM scratch a reduce-scatter of `operand_bytes` over `devices` holds while it runs, bytes: on chips
    whose SparseCore runs it (`reduce_scatter_scratch`), the operand less twice the result, (n - 2)/n of it."""
    n = np.asarray(devices, dtype=float)
    return x.topology.chip.reduce_scatter_scratch * operand_bytes * np.maximum(n - 2, 0.0) / n


def fused_dq_partials_held(x: Candidates, layout: Layout, in_key_chunks: bool = False) -> np.ndarray:
    """Bytes the fused backward's dq partials hold (jax's splash: one per key block in q's dtype, all
    written before the sum after the kernel), the largest call's: a device's calls run one after another,
    each summed before the next (0 where the calls run the dq and dK/dV kernels). A call run over chunks of
    its keys (`in_key_chunks`: `key_chunks`) holds one chunk's partials and the fp32 sum of those before."""
    held = np.zeros_like(np.asarray(x.tokens_per_device, dtype=float))
    for call in STRATEGIES[x.strategy].kernel_calls(x, layout):
        if np.any(call.fused_backward):
            count, nbytes = dq_partials(call.kv_len, x.block_kv, act_bytes=x.act_bytes, in_q_dtype=True)
            chunks = key_chunks(x, layout, call, in_key_chunks)
            dq = dq_elements(x.sequences_per_device * layout.q_heads, call.q_len, x.model.head_dim)
            partials = dq * (count / chunks * nbytes + np.where(chunks > 1, DQ_ACCUMULATOR_BYTES, 0.0))
            held = np.maximum(held, np.where(call.fused_backward, partials, 0.0))
    return held


def kept_copy_values(x: Candidates, mlp_chunk_tokens: int | None = MLP_CHUNK_TOKENS) -> tuple[np.ndarray, np.ndarray]:
    """Values per device a layer loop copies, each layer, of what the remat policy keeps on device: every
    kept value, formed in its own buffer, into the layer stacks as the layer's forward ends; and the MLP's
    kept values out of the stacks in the layer's backward, where its chunk loop slices them (one slice with
    one chunk). Read from the compiles' buffers (docs/provenance/cost_models.md#memory). A step of one layer
    has no loop and no stacks: none."""
    tokens, remat, loop = x.tokens_per_device, x.held_remat_columns, ~x.without_layer_loop
    to_stacks = np.where(loop, tokens * remat.saved_on_device / x.tensor, 0.0)
    mlp_tokens = np.minimum(mlp_chunk_tokens or np.inf, tokens)
    from_stacks = np.where((tokens > mlp_tokens) & loop, tokens * remat.kept_mlp_side / x.tensor, 0.0)
    return to_stacks, from_stacks


def price_memory(
    x: Candidates,
    layout: Layout,
    context: CPCost,
    *,
    mlp_chunk_tokens: int | None = MLP_CHUNK_TOKENS,
    head_gradient_in_head_layout: bool,
    kv_buffers_working_set: bool = False,
    layers_switch_masks: bool = False,
    fused_dq_partials_in_q_dtype: bool = False,
    fused_backward_in_key_chunks: bool = False,
    expert_buffers_worst_case: bool = False,
    grouped_matmul_backward: bool = False,
    table_split_on_hidden: bool = False,
) -> MemoryBytes:
    """HBM each candidate holds per device, by component; `context` is the strategy's traffic (its buffers
    at a layer's peak), the keyword arguments the target's traits of the same names (`expert_buffers_worst_case`:
    the expert all-to-alls' receive buffers sized as MaxText allocates them, `receive_buffer_rows`;
    `grouped_matmul_backward`: a mixture-of-experts layer's backward as MaxText's grouped matmuls run it)."""
    m, tensor, tokens = x.model, x.tensor, x.tokens_per_device
    a, pb = x.act_bytes, x.param_bytes
    remat = x.held_remat_columns  # an offload that does not leave HBM is held as a kept value
    group = x.weight_group
    shards = group * tensor
    # kept on the host between steps or not (`HostState`), the weights and moments are in HBM all step:
    # MaxText 0.2.5 brings them in at its start (docs/maxtext_offload.md, "State on the host")
    state = state_bytes(m, weight_shards=shards, param_bytes=pb, mu_bytes=x.mu_bytes)
    # every kept value is split over tensor: heads, MLP columns, or the sequence between the matmuls
    saved = remat.saved_on_device / tensor * a
    # one layer's backward: the gradient of every value, and the values not kept on device; the
    # attention side for every token, the MLP's for one chunk (each chunk is its own checkpoint)
    # the residual stream's values (a parallel block's one, a sequential block's two) on its tokens
    residual_stream = residual_tokens(tokens, tensor) * (1 if m.decoder_block.parallel else 2) * m.hidden
    # q, K, V, the output and their gradients in splash's layout, the head lane-padded
    head = m.head_dim * lane_ratio(x)
    attention_values = tokens * (m.hidden + (2 * m.num_heads + 2 * m.num_kv_heads) * head / tensor) + residual_stream
    # a chunk's input projections' outputs and its own copy of the MLP's input, which an MLP with no chunk
    # loop does not make (`mlp_input_copies`)
    mlp_side = m.mlp_inputs * m.mlp_width / tensor + mlp_input_copies(mlp_chunk_tokens) * m.hidden
    mlp_tokens = np.minimum(mlp_chunk_tokens or np.inf, tokens)
    loss_tokens = np.minimum(x.loss_chunk_tokens or np.inf, tokens)
    # one piece's columns for each tensor degree present (a search prices few degrees over many rows)
    degrees, which = np.unique(np.asarray(tensor, dtype=int), return_inverse=True)
    piece_of_degree = np.array([(m.vocab // t) / vocab_pieces(m.vocab // t) for t in degrees])
    head_piece = piece_of_degree[which].reshape(np.shape(tensor))
    # a mixture of experts' matrices as gathered: each device's E/e experts (`gathered_mlp_matrix_params`)
    gathered_mlp = gathered_mlp_matrix_params(x)
    largest_matrix = np.maximum(gathered_mlp, m.hidden * m.num_heads * m.head_dim) / tensor
    mlp_matrix = gathered_mlp / tensor
    expert_buffers = receive_buffer_bytes(x, worst_case=expert_buffers_worst_case)
    # the chunk loop holds every MLP matrix, gathered before it, and carries each one's weight-gradient
    # sum in the compute dtype, forming a chunk's new sum while reading the carried one (one chunk: none)
    mlp_loop_matrices = 2 * m.mlp_matrices + (tokens > mlp_tokens)
    held_matrices = mlp_loop_matrices * mlp_matrix
    routed_copies = 0.0
    if grouped_matmul_backward and m.experts:
        # MaxText's grouped matmuls form the experts' weight gradients after the input gradients, the gathered
        # matrices' last readers: an expert layer holds its gathered matrices or their gradients, never both;
        # without expert parallelism it holds routed copies instead of receive buffers (`routed_copy_bytes`)
        # (MaxText 0.2.5's DeepSeek-V3 compile at EP 1, docs/moe_compiled.md, "shard_exp_on_fsdp")
        dense = (m.hidden * m.intermediate if m.moe_layers < m.num_layers else 0) / tensor
        held_matrices = np.maximum(mlp_loop_matrices * dense, m.mlp_matrices * expert_matrix_params(x) / tensor)
        routed_copies = routed_copy_bytes(x)
    layer_grads = layer_gradient_bytes(x)
    head_shard = m.hidden * m.vocab / shards
    relaid = relaid_table_values(x, shards) * table_split_on_hidden
    # kept MLP values are not read in place: the layer's backward copies its layer's slice of the
    # stacked residuals, the chunk loop each chunk's slice of that copy; a step of one layer has no layer
    # loop and no stack, and its chunk loop slices the kept values directly
    kept_in_stacks, kept_mlp_copy = kept_copy_values(x, mlp_chunk_tokens)
    q_values, kv_values = laid_out_values(x, layout)
    # the layer input's gradient, formed for every token, is scattered back over tensor on either side
    input_gradient_scratch = reduce_scatter_scratch(x, tokens * m.hidden * a, tensor)
    # the gathered K/V a strategy holds through the MLP's backward as its buffers (bytes), counted in the
    # MLP's side once, so not again among the attention's values run early
    gathered_kv_held = kv_buffers_working_set * gathered_before_mlp_backward(x) * context.held_through_mlp_backward
    attention_early = attention_before_mlp_backward(x, layers_switch_masks) * (
        3 * q_values + 2 * kv_values * (np.asarray(gathered_kv_held) == 0)
    )
    # offloaded values the attention's backward reads, fetched an iteration ahead (`READ_BY_ATTENTION_BACKWARD`)
    fetched_ahead = tokens * remat.fetched_ahead / tensor
    # where the MLP's input is recomputed through the attention, what the attention's backward reads (less
    # what is kept or fetched ahead) is held through the MLP's, with the lane-wide log-sum-exp on some chips
    rerun = attention_values_through_mlp_backward(x)
    attention_first = rerun * np.maximum(
        attention_values - tokens * (remat.kept_attention_side + remat.fetched_ahead) / tensor, 0.0
    )
    lse_first = rerun * x.topology.chip.splash_lse_lanes_held * lse_lane_bytes(x, layout)
    kept_attention = tokens * remat.kept_attention_side / tensor
    whole_working_set = (2 * attention_values - kept_attention) * a
    # the fused backward's dq partials, held while its kernel runs (summed into dq before the next kernel)
    partials = fused_dq_partials_held(x, layout, fused_backward_in_key_chunks) if fused_dq_partials_in_q_dtype else 0.0
    # where the target's backward holds K/V as the strategy's buffers, it holds less than the whole set, and
    # the kept operands' kernel layout as its own values, not as copies among the buffers
    beside_kv = kv_buffers_working_set & (np.asarray(context.kv_in_working_set) == 0)
    kv_narrowed = (
        working_set_beside_kv(x) * a + context.beside_kv_excess + relaid_output_held(x) * context.relaid_output_bytes
    )
    # where K/V are in the working set, the whole set is held after the fused kernel (its partials summed) and
    # the kernel's own set with the partials while it runs: the larger of the two moments, less the partials
    # counted among the buffers (`fused_kernel_working_set`)
    kv_in_set = np.maximum(
        whole_working_set - partials, fused_kernel_working_set(x, attention_values - kept_attention) * a
    )
    kernels_working_set = np.where(beside_kv, kv_narrowed, kv_in_set)
    # the scatter's scratch is held at the backward's end, after the moment `lse_relayout` prices
    attention_working_set = kernels_working_set + input_gradient_scratch
    # the strategy's buffers, and one fp32 value per local query and head
    per_query = x.sequences_per_device * layout.q_len * layout.q_heads * 4
    attention_buffers = context.buffer_bytes + per_query - beside_kv * context.operand_copies_bytes + partials
    # on a chip that holds splash's log-sum-exp lane-wide, the copy that slices it for the backward's kernels
    # holds it twice, where only the recomputed values are held: not yet q/K/V's gradients, the residual
    # stream's, nor the strategy's gradient buffers; that moment's excess over the kernels'
    # (docs/provenance/cost_models.md#memory)
    not_yet_formed = (
        tokens * (m.num_heads + 2 * m.num_kv_heads) * head / tensor * a
        + residual_stream * a
        + context.buffer_bytes
        - context.buffer_bytes_before_backward
    )
    # (before the fused kernel, so without its partials where K/V are in the working set)
    lse_moment = 2 * lse_lane_bytes(x, layout) - not_yet_formed + whole_working_set
    lse_relayout = (
        x.topology.chip.splash_lse_lanes_held
        * (np.asarray(context.reads_own_lse) > 0)
        * np.maximum(lse_moment - np.where(beside_kv, kv_narrowed, kv_in_set + partials), 0.0)
    )
    return MemoryBytes(
        # every weight is split over the weight-sharding group and tensor, the input embedding included
        params=state[HostState.PARAMS],
        # through the backward: the layers' gradients in the parameters' dtype and the head's in the
        # compute dtype; the embedding's gradient is formed after the layers (docs/provenance/cost_models.md#memory)
        layer_grads=layer_grads,
        head_grad=head_shard * a,
        update_gradients=m.num_params / shards * x.grad_bytes - layer_grads - head_shard * a,
        # AdamW's first moment in its own dtype (`mu_dtype`), its second in the parameters'
        optimizer=state[HostState.OPTIMIZER],
        # each layer's per-layer input (Gemma 4 E2B, E4B) is formed before the layers and read in its backward
        activations=m.num_layers
        * (
            tokens * saved
            + lse_lanes_kept(x) * lse_lane_bytes(x, layout)
            + tokens * per_layer_input_values(m) / tensor * a
        ),
        # every layer's weight shards cast to the compute dtype once, outside the layer loop, and held
        # until the last layer's backward (none when the dtypes match; norm scales are cast in the norm)
        weight_casts=m.num_layers * (m.params_per_layer - m.decoder_block.norms * m.hidden) / shards * a * (pb != a),
        attention_working_set=attention_working_set,
        # the MLP's input and gradients for every token; on the residual stream's tokens, the layer output's
        # gradient and (sequential block) the residual the MLP's norm read, both needed after the chunk loop;
        # one chunk's values and gradients; kept MLP values copied; the chunk loop's matrices and sums;
        # attention values run early; values fetched ahead; the gathered K/V of an attention that reruns
        # before the MLP's backward or does not rerun (cpplan's); the scatter of the input's gradient
        mlp_working_set=(
            (2 + (tensor > 1)) * tokens * m.hidden
            + residual_stream
            + mlp_tokens * 2 * mlp_side
            + kept_mlp_copy
            + held_matrices
            + attention_early
            + attention_first
            + fetched_ahead
        )
        * a
        + lse_first
        + gathered_kv_held
        + input_gradient_scratch
        + expert_buffers
        + routed_copies,
        attention_buffers=attention_buffers,
        lse_relayout=lse_relayout,
        # the weights' traffic: the matrix in use, the next one arriving, an unreduced gradient to scatter
        collective_buffers=largest_matrix * (2 * a + pb),
        # a layer of a loop forms its kept values in their own buffers and copies them into the stacks
        # when it ends; at its MLP they are all formed, beside the residual stream's values (the layer
        # input, and a sequential block's residual sum), the MLP's input gathered and its matrices, and on
        # some chips the kernel's lane-wide log-sum-exp
        forward_working_set=kept_in_stacks * a
        + (residual_stream + tokens * m.hidden + m.mlp_matrices * mlp_matrix) * a
        + forward_lse_lanes_held(x, context) * lse_lane_bytes(x, layout)
        + expert_buffers,
        # fp32 logits of one chunk of tokens against one vocabulary piece (the gradient formed in place)
        logits=loss_tokens * head_piece * 4,
        # the gathered head piece (the head enters the loss in the compute dtype) and its fp32 gradient
        head_buffers=m.hidden * head_piece * (a + 4),
        loss_input=(residual_tokens(tokens, tensor) + 3 * tokens) * m.hidden * a,
        flat_program_held=flat_program_held(x, residual_stream, mlp_tokens, mlp_matrix),
        # layout moves read from TPU compiles (a host lays arrays out otherwise); none in the head's layout
        optimizer_update=head_shard
        * optimizer_update_bytes_per_head_weight(
            param_bytes=pb, mu_bytes=x.mu_bytes, relayout_off_core=x.topology.chip.relayout_off_tensorcore
        )
        * (x.topology.chip.kind is ChipKind.TPU and not head_gradient_in_head_layout),
        relaid_table=relaid * m.tie_embeddings * pb,
        relaid_update=relaid * ((not m.tie_embeddings) * pb + x.mu_bytes + pb),
    )


def relaid_table_values(x: Candidates, shards) -> np.ndarray:
    """Values of a copy of the embedding table's slice on a device, padded to the chip's lanes, where the
    table is split on its hidden dimension over `shards` devices (cpplan's runtime, `runtime.model.embed_lookup`)
    and the slice's width is off a TPU's lanes by less than `RELAID_PADDING_PARTS` allows; 0 elsewhere.

    Such a table enters the step laid out vocabulary-minor, which pads it least, and the compiler copies it
    into the rows-minor layout the lookup and the update read: a tied table's copy from the forward to the
    update, an untied one's at the update, and the table's two moments there too (Gemma 3's hidden of 3840
    over 4 devices). Padded more, it is read in place (docs/measurements.md, "An embedding slice off the
    lanes")."""
    lanes = x.topology.chip.kind.lanes
    width = x.model.hidden / np.asarray(shards)
    padded = np.ceil(width / lanes) * lanes
    copied = (
        (x.topology.chip.kind is ChipKind.TPU) & (padded > width) & ((padded - width) * RELAID_PADDING_PARTS < width)
    )
    return np.where(copied, padded * x.model.vocab, 0.0)


def per_layer_input_values(model) -> int:
    """Values per token a layer's per-layer input holds (its width; 0 for a model without)."""
    return model.per_layer_inputs.width if model.per_layer_inputs else 0


def mlp_input_copies(mlp_chunk_tokens: int | None) -> int:
    """Hidden-size values per chunk token an MLP's backward holds as the chunk's own copy of its input (and
    as many for that copy's gradient), beyond the input and its gradient counted for every token: 1 where a
    chunk loop slices the tokens (`mlp_chunk_tokens`: cpplan's); 0 where the MLP has no chunk loop (None:
    MaxText's `MlpBlock`, whose compiles hold its values for every token at once), which reads its input
    whole and forms one gradient of it: those are the values counted for every token (docs/measurements.md,
    "The MLP with no chunk loop holds its input once")."""
    return 0 if mlp_chunk_tokens is None else 1


def flat_program_held(x: Candidates, residual_stream, mlp_tokens, mlp_matrix) -> np.ndarray:
    """What an offloading step left with no layer loop (`Candidates.flat_offload`) holds through its forward and
    its loss beyond what a loop holds, bytes per device (docs/memory_offload.md, "The flat program's loss,
    by what it holds"): every layer's offloaded attention-side values (and layer input), their device copies
    kept until the host writes end in the backward; two chunks of the MLP's offloaded values (the last one
    written, the first one fetched back); every layer's residual-stream values that a loop's backward
    recomputes, which the schedule computes in the forward; the last layer's gathered MLP matrices, and on
    chips that hold another layer's weights (`flat_offload_holds_layer_weights`) those too."""
    m, tensor, tokens = x.model, x.tensor, x.tokens_per_device
    host = x.remat_columns  # the offloads as placed: a flat program's do leave HBM by its backward
    attention_side = host.saved_on_host - host.offloaded_mlp_side
    layer_weights = (m.largest_layer_params - m.decoder_block.norms * m.hidden) / tensor
    held = (
        m.num_layers * (tokens * attention_side / tensor + residual_stream)
        + 2 * mlp_tokens * host.offloaded_mlp_side / tensor
        + m.mlp_matrices * mlp_matrix
        + x.topology.chip.flat_offload_holds_layer_weights * layer_weights
    )
    return x.flat_offload * held * x.act_bytes


def working_set_beside_kv(x: Candidates) -> np.ndarray:
    """Values per device the attention's backward holds where K/V and their gradients are the strategy's
    buffers (a ring's hop, all-gather's call): what its kernels read (q, the attention's output and its
    gradient), the call's dq, the residual stream's gradient, and where q is recomputed, the attention's
    input, which the projections' weight gradients read afterwards. The input's gradient is not formed
    yet (docs/provenance/strategies_and_validation.md#ring, #all_gather there)."""
    m, tensor, tokens = x.model, x.tensor, x.tokens_per_device
    q_width = m.num_heads * m.head_dim * lane_ratio(x) / tensor
    input_held = recomputed_checkpoint(x, "query_proj")
    return tokens * (4 * q_width + input_held * m.hidden) + residual_tokens(tokens, tensor) * m.hidden


def fused_kernel_working_set(x: Candidates, values) -> np.ndarray:
    """Values per device the attention's backward holds while its fused kernel runs, where K/V are in the
    working set (not a strategy's buffers): the attention side's `values` not kept (q, K, V, the output, the
    input, the residual stream's), the output's gradient the kernel reads and the dq it forms; the gradients of
    K/V, the input and the residual stream are formed after it (docs/provenance/cost_models.md#memory)."""
    q_width = x.model.num_heads * x.model.head_dim * lane_ratio(x) / x.tensor
    return values + x.tokens_per_device * 2 * q_width


def relaid_output_held(x: Candidates) -> np.ndarray:
    """Per candidate, 1.0 where the attention output laid out anew for the out projection's weight gradient
    (`CPCost.relaid_output_bytes`) is held through a backward whose K/V are the strategy's buffers, else 0.0:
    on a chip that moves layouts off the TensorCore (`relayout_off_tensorcore`: into new buffers), where the
    output and the out projection are recomputed, the move is made for the recomputed out projection, before
    the backward's hops, and the weight gradient reads it after them
    (docs/provenance/strategies_and_validation.md#usp)."""
    if not x.topology.chip.relayout_off_tensorcore:
        return np.zeros(np.shape(x.remat))
    return output_and_projection_recomputed(x).astype(float)


def forward_lse_lanes_held(x: Candidates, context: CPCost) -> np.ndarray:
    """Per candidate, 1.0 where a layer's forward holds splash's log-sum-exp lane-wide, as the kernel writes
    it, to the layer's end, else 0.0: on a chip that slices it only beside the stacks
    (`forward_lse_lanes_held`), a layer of a loop whose policy keeps the attention output, where the
    backward reads its own kernel's log-sum-exp (`CPCost.reads_own_lse`: not a ring's, merged over hops)."""
    if not x.topology.chip.forward_lse_lanes_held:
        return np.zeros(np.shape(x.remat))
    held = checkpoint_placed(x, ATTENTION_OUTPUT, Placement.DEVICE) & ~x.without_layer_loop
    return held * (np.asarray(context.reads_own_lse) > 0)


def lse_lanes_kept(x: Candidates) -> np.ndarray:
    """Per candidate, 1.0 where the attention's log-sum-exp is kept for the backward lane-wide, as the
    kernel writes it (`lse_lane_bytes`), else 0.0: on a chip that holds the kernel's lane-wide output
    (`splash_lse_lanes_held`), a step with no layer loop (`Candidates.without_layer_loop`) whose policy keeps
    the attention output on device has no stack that would slice it, so each layer's stays so from the
    forward through the loss."""
    if not x.topology.chip.splash_lse_lanes_held:
        return np.zeros(np.shape(x.remat))
    return (checkpoint_placed(x, ATTENTION_OUTPUT, Placement.DEVICE) & x.without_layer_loop).astype(float)


def attention_before_mlp_backward(x: Candidates, layers_switch_masks: bool) -> np.ndarray:
    """Per candidate, 1.0 where its layer backward holds the attention's recomputed forward (q, K, V,
    output) and its output's gradient through the MLP's backward, else 0.0: where the chip schedules that
    work first (`attention_before_mlp_backward`; a ring's forward hops too, its backward hops after), the
    attention reruns (the policy recomputes its output, or the target runs a model of several masks as a
    switch, `layers_switch_masks`, which the backward reruns whole whatever the policy keeps), and the
    MLP's input does not wait for it (the out projection or the output kept).
    """
    if not x.topology.chip.attention_before_mlp_backward:
        return np.zeros(np.shape(x.remat))
    output_recomputed = recomputed_checkpoint(x, ATTENTION_OUTPUT)
    reruns = output_recomputed | (layers_switch_masks and len(x.model.layer_masks) > 1)
    free = ~output_recomputed | ~recomputed_checkpoint(x, "out_proj")
    return (reruns & free).astype(float)


def attention_values_through_mlp_backward(x: Candidates) -> np.ndarray:
    """Per candidate, 1.0 where a sequential block's policy recomputes both the attention output and the
    out projection (`full`, `save_qkv_proj`, ...), else 0.0: the MLP's input is then recomputed through the
    attention, so on every chip what the attention's backward reads is held through the MLP's."""
    if x.model.decoder_block.parallel:  # the MLP's input is the layer input's norm: it waits for no attention
        return np.zeros(np.shape(x.remat))
    return output_and_projection_recomputed(x).astype(float)


def output_and_projection_recomputed(x: Candidates) -> np.ndarray:
    """Per candidate, whether its policy recomputes both the attention output and the out projection, which
    the recomputed forward then forms from it."""
    return recomputed_checkpoint(x, ATTENTION_OUTPUT) & recomputed_checkpoint(x, "out_proj")


def gathered_before_mlp_backward(x: Candidates) -> np.ndarray:
    """Per candidate, 1.0 where a strategy's gathered K/V are held through the MLP's backward, else 0.0:
    where the attention's forward reruns before it (`attention_values_through_mlp_backward`), whose K/V
    the backward reuses, or does not rerun (its output kept), the backward's gather being scheduled then;
    not where the rerun follows the MLP's backward (docs/provenance/strategies_and_validation.md#all_gather)."""
    kept_output = ~recomputed_checkpoint(x, ATTENTION_OUTPUT)
    return np.maximum(attention_values_through_mlp_backward(x), kept_output.astype(float))


def checkpoint_placed(x: Candidates, name: str, placement: Placement) -> np.ndarray:
    """Per candidate, whether its policy (`custom` placements included) puts the checkpoint `name` at `placement`."""
    return _placed_by_choice(name, placement, x.remat_custom, x.remat_presets)[x.remat]


@lru_cache(maxsize=256)
def _placed_by_choice(name: str, placement: Placement, custom: tuple, presets: tuple) -> np.ndarray:
    """Per remat choice (`choice_placements`' order), whether it puts `name` at `placement`: asked for each
    checkpoint by every pricing of a search."""
    table = np.array([chosen[name] is placement for chosen in choice_placements(custom, presets)])
    table.flags.writeable = False  # shared by every caller
    return table


def recomputed_checkpoint(x: Candidates, name: str) -> np.ndarray:
    """Per candidate, whether its policy (`custom` placements included) recomputes the checkpoint `name`."""
    return checkpoint_placed(x, name, Placement.REMAT)


def lse_lane_bytes(x: Candidates, layout: Layout) -> np.ndarray:
    """Bytes of splash's log-sum-exp residual as its forward kernel writes it: fp32, one row of
    `SPLASH_LANES` per local query and head (jax's splash_attention_kernel; its `[..., 0]` is the
    value the backward reads)."""
    return x.sequences_per_device * layout.q_len * layout.q_heads * SPLASH_LANES * 4


def optimizer_update_bytes_per_head_weight(*, param_bytes: int, mu_bytes: int, relayout_off_core: bool) -> int:
    """Bytes the output head's AdamW update holds per head weight beyond its gradient, where the gradient
    reaches it stacked by vocabulary piece (`[pieces, hidden/g, piece]`, not the head's layout).

    The compiler moves the head and both moments into the gradient's layout (and back) and forms the two
    gradient terms, `(1-b1)·g` and `(1-b2)·g²`, in fp32, in place of the gradient counted in `grads` +
    `update_gradients`. Where the move runs off the TensorCore (`relayout_off_core`: SparseCore data-format
    calls, whose outputs an elementwise update does not write over) the three updated arrays are new too.
    """
    moved = param_bytes + mu_bytes + param_bytes  # the head, mu and nu in the gradient's layout
    gradient_terms = 2 * 4 - param_bytes
    return moved + gradient_terms + (moved if relayout_off_core else 0)
