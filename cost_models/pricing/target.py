"""What a runtime target changes in a step's memory (`cost_models.targets`): the loss's logits, where
the layer gradients live, the ring kernel's dq partials, the next layer's host reads, and what its compiler
holds through the layers' backward (a deferred head gradient, offloaded MLP values) or recomputes above its
rematerialization limit."""

from __future__ import annotations

import math

import numpy as np

from cost_models.candidates import Candidates
from cost_models.compute import dq_partials
from cost_models.pricing.memory import checkpoint_placed, peak_bytes, recomputed_checkpoint
from cost_models.remat import ATTENTION_OUTPUT, MLP_INPUT_CHECKPOINTS
from cost_models.strategies import STRATEGIES, Layout
from cost_models.targets import TargetTraits
from cost_models.vocabulary import Placement
from cost_models.work_layout import residual_tokens

# XLA's rematerialization pass (libtpu 0.0.52) runs with a memory limit of 95% of the chip's HBM less the
# arguments not aliased to outputs (the flag `xla_jf_rematerialization_percent_shared_memory_limit`, default
# 95: its log line `HloRematerialization() with memory limit of 90.88GiB` for a v5p program of 64 MiB of
# arguments, 95.66 with the flag at 100, 86.09 at 90; 89.94 on tpu7x): a program between that limit and the
# HBM has values recomputed (docs/maxtext_offload.md, "XLA's rematerialization limit")
XLA_REMAT_HBM_FRACTION = 0.95


def vocab_tiles(tokens_per_device: float, loss_chunk_tokens: int) -> int:
    """MaxText's `num_vocab_tiling` for a loss chunk of `loss_chunk_tokens` tokens (0: one tile):
    the fewest tiles of at most that many tokens that split a device's tokens evenly (MaxText
    requires per_device_batch_size × max_target_length to divide by it, configs/pyconfig)."""
    if not loss_chunk_tokens or tokens_per_device <= loss_chunk_tokens:
        return 1
    tokens = int(tokens_per_device)
    least = math.ceil(tokens / loss_chunk_tokens)
    return next((n for n in range(least, tokens + 1) if tokens % n == 0), 1)


def target_memory(
    x: Candidates, memory: dict[str, np.ndarray], layout: Layout, traits: TargetTraits
) -> dict[str, np.ndarray]:
    """The memory components of `price_memory` (cpplan's runtime) as the target's runtime holds them."""
    if (
        traits.loss_splits_vocabulary
        and traits.layer_gradients_all_step
        and not traits.ring_dq_partials
        and not traits.offload_defers_head_gradient
        and not traits.offload_holds_mlp_backward
        and not traits.offload_defers_mlp_weight_gradients
        and not traits.offload_reads_next_layer_early
        and traits.head_gradient_loop_devices is None
    ):
        return memory
    out = dict(memory)
    m = x.model
    tokens = np.asarray(x.tokens_per_device, dtype=float)
    if traits.offload_reads_next_layer_early:
        # the next layer's offloaded values, read from the host into HBM while this layer's attention backward
        # runs, beside this layer's (`fetched_ahead`, priced on the MLP's side): a step with a layer loop
        # (docs/memory_offload.md, "The README's 256K plan: the next layer's host reads")
        ahead = tokens * x.held_remat_columns.fetched_ahead / x.tensor * x.act_bytes
        out["attention_working_set"] = out["attention_working_set"] + np.where(x.without_layer_loop, 0.0, ahead)
    if not traits.loss_splits_vocabulary:
        tiles = np.vectorize(lambda t: vocab_tiles(t, x.loss_chunk_tokens), otypes=[float])(tokens)
        # each tile's logits over the whole vocabulary (split over tensor with the output head)
        out["logits"] = tokens / tiles * m.vocab / x.tensor * traits.logit_bytes
        # what cpplan's chunked loss holds of its input (its loop's copy, the gradient the loop sums) was read
        # from cpplan's compiles; a whole-vocabulary loss's was not, and its compiles were priced within
        # 10% by the logits alone (docs/memory_offload.md, "The flat program's loss, by what it holds")
        out["loss_input"] = np.zeros_like(tokens)
    if not traits.layer_gradients_all_step:
        layer_grads = out["layer_grads"]
        out["layer_grads"] = np.zeros_like(layer_grads)
        # at the step's end the update reads every gradient, these too
        out["update_gradients"] = out["update_gradients"] + layer_grads
        # held through a layer's backward whichever of its sides (attention or MLP) is live
        out["attention_working_set"] = out["attention_working_set"] + layer_grads
        out["mlp_working_set"] = out["mlp_working_set"] + layer_grads
        # the output head gathered whole for the loss's matmul, and its fp32 gradient before the reduce-scatter
        out["head_buffers"] = np.full_like(tokens, m.vocab * m.hidden * (x.act_bytes + 4)) / x.tensor
    if traits.ring_dq_partials and STRATEGIES[x.strategy].maxtext_ring_kernel:
        # the fused backward's dq partials of the ring block (one fp32 per key block, or the rolled few of
        # dq_reduction_steps), all written before they are summed, freed after the sum: held on the
        # attention's side of a layer's backward
        count, nbytes = dq_partials(
            layout.kv_len, x.block_kv, reduction_steps=x.dq_reduction_steps, act_bytes=x.act_bytes
        )
        partials = x.sequences_per_device * count * nbytes * layout.q_heads * layout.q_len * m.head_dim
        out["attention_buffers"] = out["attention_buffers"] + np.where(np.asarray(layout.ring) > 1, partials, 0.0)
    held = held_through_backward_bytes(x, traits)
    # XLA's rematerialization recomputes the MLP's deferred values, one at a time, while holding them passes its
    # memory limit: the v5p-16 ring compiles recompute one a layer (ring 4 × tensor 2, `fusion.768.remat`) and
    # two (ring 2 × tensor 4, `fusion.813.remat`, `fusion.814.remat`); the all-gather one, under it, none
    limit = x.topology.chip.hbm_bytes_per_device * XLA_REMAT_HBM_FRACTION
    # it may recompute every one but a projection's output and the gradient they are formed from
    for _ in range(2 * m.mlp_inputs - 1):
        over = peak_bytes(with_held(out, held, held["head_gradient"])) > limit
        held = {**held, "mlp_backward": np.where(over, held["mlp_backward"] - held["mlp_value"], held["mlp_backward"])}
    holding = with_held(out, held, held["head_gradient"])
    # XLA's rematerialization recomputes a deferred matmul's output where holding it passes its memory limit:
    # the logits, where the chip fuses the logit gradient into the head's matmul (a logit gradient written by
    # its own fusion is recomputed only from the logits, as large: nothing to gain), and only where the
    # recompute's inputs are the smaller (a few tokens a device against the head's gathered weight are not)
    recomputed = (
        (peak_bytes(holding) > limit)
        & x.topology.chip.logit_gradient_fused_into_head_matmul
        & (held["head_gradient"] > held["head_recompute_inputs"])
    )
    if not recomputed.any():
        return holding
    return with_held(out, held, np.where(recomputed, held["head_recompute_inputs"], held["head_gradient"]))


def with_held(memory: dict, held: dict, head: np.ndarray) -> dict:
    """`memory` with what is held through a layer's backward: `head` on both sides, the MLP's on the attention's."""
    out = dict(memory)
    out["attention_working_set"] = out["attention_working_set"] + head + held["mlp_backward"]
    out["mlp_working_set"] = out["mlp_working_set"] + head
    return out


def held_through_backward_bytes(x: Candidates, traits: TargetTraits) -> dict[str, np.ndarray]:
    """What the target's compiler holds through a layer's backward, bytes per device per candidate.

    `head_gradient`: the loss's logit gradient and the final norm's output, through both sides, where the
    head's weight gradient is deferred past the layers (under offload, or as a windowed-einsum loop; a
    loss of one vocabulary tile only). `head_recompute_inputs`: what is held instead where the compiler
    recomputes the logits after the layers' backward: the head's gathered weight and the final layer's fp32
    output. `mlp_backward`: the MLP's input-projection outputs and their gradients for every token, through
    the attention's side, where the policy offloads them; where it offloads other values and recomputes
    the MLP but not the attention's output, the operands of the MLP's weight gradients, formed after the
    attention's backward: those outputs and gradients, the gated product formed from them, the MLP's input
    and the layer output's gradient (docs/maxtext_offload.md, "The MLP's weight gradients after the
    attention's backward"). `mlp_value`: one of those deferred MLP values (an output, a gradient or the gated
    product), which the compiler recomputes where holding it passes its rematerialization limit, all but
    one projection's output and the gradient they are formed from (with the MLP's input and the layer
    output's gradient).
    """
    # offloads that stay in HBM (a step of one layer) are held as kept values there: nothing comes back from the host
    m, columns = x.model, x.held_remat_columns
    tokens = np.asarray(x.tokens_per_device, dtype=float)
    offloads = np.asarray(columns.saved_on_host) > 0
    head = tokens * (m.vocab / x.tensor + m.hidden) * x.act_bytes
    recompute_inputs = m.vocab / x.tensor * m.hidden * x.act_bytes + tokens * m.hidden * 4
    offloads_mlp = np.any([checkpoint_placed(x, n, Placement.OFFLOAD) for n in MLP_INPUT_CHECKPOINTS], axis=0)
    mlp_offloaded = offloads & offloads_mlp
    mlp = 2 * m.mlp_inputs * tokens * m.mlp_width / x.tensor * x.act_bytes
    # the attention's output at hand (kept or fetched), the MLP's input is formed without the attention and
    # the MLP's backward runs first; its weight gradients wait for the attention's backward, and the peeled
    # layer of an offloading step forms the gated product then, from the recomputed projections' outputs
    mlp_first = offloads & ~offloads_mlp & ~recomputed_checkpoint(x, ATTENTION_OUTPUT)
    mlp_first &= traits.offload_defers_mlp_weight_gradients
    mlp_first_inputs = (tokens + residual_tokens(tokens, x.tensor)) * m.hidden * x.act_bytes
    mlp_weight_gradient_operands = (2 * m.mlp_inputs + 1) * tokens * m.mlp_width / x.tensor * x.act_bytes
    mlp_held = np.where(mlp_offloaded & traits.offload_holds_mlp_backward, mlp, 0.0)
    # a loss of several vocabulary tiles (MaxText's vocabulary_tiling: a custom VJP whose backward
    # scans the tiles) sums the head's gradient in its own loop: nothing is left to defer
    one_tile = np.vectorize(lambda t: vocab_tiles(t, x.loss_chunk_tokens), otypes=[float])(tokens) == 1
    if traits.head_gradient_loop_devices is None:
        loop = np.zeros_like(tokens, dtype=bool)
    else:
        least, most = traits.head_gradient_loop_devices
        group = np.asarray(x.weight_group)
        loop = (group >= least) & (group <= most)
    deferred = one_tile & ((offloads & traits.offload_defers_head_gradient) | loop)
    return {
        "head_gradient": np.where(deferred, head, 0.0),
        "head_recompute_inputs": np.where(deferred, recompute_inputs, 0.0),
        "mlp_backward": mlp_held + np.where(mlp_first, mlp_weight_gradient_operands + mlp_first_inputs, 0.0),
        "mlp_value": np.where(mlp_first, tokens * m.mlp_width / x.tensor * x.act_bytes, 0.0),
    }


def target_smem_bytes(x: Candidates, layout: Layout, shared_bytes: np.ndarray, traits: TargetTraits) -> np.ndarray:
    """SMEM of the splash mask metadata as the target builds it: cpplan's one table (`shared_bytes`), or
    heads × q blocks × kv blocks × the target's bytes per block pair."""
    if not traits.per_head_metadata or not STRATEGIES[x.strategy].maxtext_per_head_metadata:
        return shared_bytes
    return per_head_smem_bytes(
        layout.q_heads, layout.q_len, layout.kv_len, block_q=x.block_q, block_kv=x.block_kv, traits=traits
    )


def per_head_smem_bytes(heads, q_len, kv_len, *, block_q, block_kv, traits: TargetTraits):
    """SMEM of per-head splash metadata for `heads` heads of (q_len × kv_len) at these blocks."""
    blocks = np.ceil(np.asarray(q_len, dtype=float) / block_q) * np.ceil(np.asarray(kv_len, dtype=float) / block_kv)
    return np.asarray(heads, dtype=float) * blocks * traits.smem_bytes_per_block_pair
