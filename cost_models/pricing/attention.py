"""The attention of one decoder layer on one device: splash's MXU work over the blocks it computes (whole
blocks across the causal diagonal; under a kernel that prunes by segment ids, the expected tiles that
documents of varying length leave), what its grids pay per step and each call once, the backward at the
chip's measured ratio to the forward, and the merge in HBM of several calls' results (the ring's hops)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from cost_models.candidates import Candidates
from cost_models.compute import (
    SPLASH_BACKWARD_OVER_FORWARD,
    attention_extent,
    backward_core_share,
    fused_backward_key_chunks,
    splash_row_groups,
    splash_smem_bytes,
    splash_step_costs,
    tile_efficiency,
)
from cost_models.document_tiles import expected_computed_tiles, rows_per_call
from cost_models.masks import CallBlocks, call_blocks
from cost_models.pricing.rows import distinct_rows
from cost_models.strategies import KernelCall, Layout, StrategySpec
from cost_models.strategies.base import all_fused
from cost_models.targets import TRAITS, Target, TargetTraits


@dataclass(frozen=True)
class AttentionTimes:
    """One decoder layer's attention on one device (arrays over candidates)."""

    layout: Layout  # how the kernel lies on a device under the strategy
    forward_flops: np.ndarray  # executed by the forward kernel, whole blocks included
    math_forward_s: np.ndarray  # MXU time of the forward kernel's computed blocks
    grid_forward_s: np.ndarray  # per-step costs of the forward grids (steps computed or skipped)
    grid_backward_s: np.ndarray  # per-step costs of the backward grids (dq, dk/dv)
    merge_forward_s: np.ndarray  # HBM passes folding the calls' outputs together, laying gathered K/V out
    merge_backward_s: np.ndarray  # HBM passes adding up the calls' gradients, laying gathered dK/dV back
    forward_s: np.ndarray
    backward_s: np.ndarray
    recompute_s: np.ndarray  # forward passes the remat policy runs again in the backward
    executed_flops: np.ndarray  # forward, backward and recomputation
    smem_bytes: np.ndarray  # the kernel's mask metadata in SMEM

    @property
    def total_s(self) -> np.ndarray:
        return self.forward_s + self.backward_s + self.recompute_s


def key_chunks(x: Candidates, layout: Layout, call: KernelCall, in_chunks: bool):
    """The chunks of its keys a call's fused backward runs over where the runtime chunks them (`in_chunks`,
    `TargetTraits.fused_backward_in_key_chunks`), else 1, as where it runs the dq and dK/dV kernels (the
    price and the memory both read it)."""
    if not in_chunks or not np.any(call.fused_backward):
        return 1.0
    chunks = fused_backward_key_chunks(
        x.sequences_per_device * layout.q_heads,
        call.q_len,
        call.kv_len,
        head_dim=x.model.head_dim,
        block_kv=x.block_kv,
        act_bytes=x.act_bytes,
        hbm_bytes=x.topology.chip.hbm_bytes_per_device,
    )
    return np.where(call.fused_backward, chunks, 1.0)


def backward_over_forward(chip, calls, core_share) -> np.ndarray:
    """The backward kernels' MXU time over the forward's on a device: the chip's fused-backward
    ratio per core, times its unfused factor where the calls run the dq and dk/dv kernels, over the
    share of the device's cores the backward keeps busy (`core_share`). A device's calls all run one kind."""
    factor = np.where(all_fused(calls), 1.0, chip.attention_unfused_backward_factor)
    return chip.attention_backward_over_forward * factor / core_share


def price_attention(
    x: Candidates, strategy: StrategySpec, *, traits: TargetTraits = TRAITS[Target.CPPLAN]
) -> AttentionTimes:
    """Prices one decoder layer's attention for every candidate of `strategy` as the runtime of `traits`
    runs it: on tokamax's ring kernel (`tokamax_ring_kernel`, MaxText) the calls are the spec's
    `maxtext_kernel_calls`; where its kernel skips the tiles of other documents (`prunes_documents`),
    documents of varying length cost the tiles they leave, not whole rows."""
    model, chip = x.model, x.topology.chip
    layout = strategy.layout(x)
    if traits.tokamax_ring_kernel:
        calls = strategy.maxtext_kernel_calls(x, layout)
    else:
        calls = strategy.kernel_calls(x, layout)
    blocks = [local_blocks(x, call) if call.local else None for call in calls]
    documents = model.varying_documents if traits.prunes_documents(strategy) else None
    if documents is not None:  # the pairs of the tiles the documents are expected to leave, call by call
        # a local call is placed in the row already; a global one's tiles are counted where its rank's
        # queries lie (`rank_query_calls`)
        counted = calls if x.attention_mask.local else rank_query_calls(x, layout)
        extent = sum(call.count * pruned_tiles(x, call) * math.prod(call_tile(x, call)) for call in counted)
    elif x.attention_mask.local:  # the pairs of the blocks the mask leaves, call by call
        extent = sum(call.count * b.computed * math.prod(call_tile(x, call)) for call, b in zip(calls, blocks))
    else:
        # the virtual devices of a host share its cores: an idle rank's share goes to the busy ones,
        # so the step costs the average rank's work (the balanced extent), not the busiest rank's
        extent = attention_extent(
            x.seq_len,
            layout.ring,
            x.zigzag | x.shared_cores,
            block_q=x.block_q,
            block_kv=x.block_kv,
            causal=model.causal,
        )
    efficiency = chip.attention_efficiency * tile_efficiency(model.head_dim, chip.mxu_tile)
    core_share = backward_core_share(vmapped_rows(x, layout, traits), chip.cores_per_device)
    forward_flops = 4.0 * x.sequences_per_device * layout.q_heads * model.head_dim * extent
    math_forward_s = forward_flops / (x.topology.peak_flops_per_device * efficiency)
    # the kernels' grids visit every (q block × kv block) of every call, computed or skipped
    grid_forward_s = grid_backward_s = 0.0
    hbm_s_per_byte = 1.0 / x.topology.hbm_bw_per_device
    for call, call_blocks_ in zip(calls, blocks):
        fwd, bwd = splash_step_costs(
            x.sequences_per_device * layout.q_heads,
            x.sequences_per_device * layout.kv_heads,
            call.q_len,
            call.kv_len,
            head_dim=model.head_dim,
            act_bytes=x.act_bytes,
            block_q=np.minimum(x.block_q, call.q_block_cap),
            block_kv=x.block_kv,
            per_step_s=chip.attention_block_overhead_s,
            per_step_byte_s=chip.attention_step_s_per_operand_byte,
            per_masked_element_s=chip.attention_masked_element_s,
            per_call_byte_s=(
                chip.attention_operand_passes * hbm_s_per_byte,
                chip.attention_backward_operand_passes * hbm_s_per_byte,
            ),
            causal=call.causal,
            fused_backward=call.fused_backward,
            hbm_s_per_byte=hbm_s_per_byte,
            backward_core_share=core_share,
            dq_reduction_steps=x.dq_reduction_steps if traits.ring_dq_partials else 0,
            dq_partials_in_q_dtype=traits.fused_dq_partials_in_q_dtype,
            local_blocks=call_blocks_,
            key_chunks=key_chunks(x, layout, call, traits.fused_backward_in_key_chunks),
        )
        grid_forward_s = grid_forward_s + call.count * fwd
        grid_backward_s = grid_backward_s + call.count * bwd
    merge_forward_bytes, merge_backward_bytes = strategy.merge_bytes(x, layout, calls)
    if traits.zigzag_kv_reorder_passes is not None:
        # the target lays gathered zigzag K/V out in natural order for the kernel, their gradients back
        reordered = np.where(x.zigzag, strategy.gathered_kv_bytes(x, layout), 0.0)
        merge_forward_bytes = merge_forward_bytes + traits.zigzag_kv_reorder_passes[0] * reordered
        merge_backward_bytes = merge_backward_bytes + traits.zigzag_kv_reorder_passes[1] * reordered
    merge_forward_s, merge_backward_s = merge_forward_bytes * hbm_s_per_byte, merge_backward_bytes * hbm_s_per_byte
    forward_s = math_forward_s + grid_forward_s + merge_forward_s
    recomputed = x.remat_columns.recompute_attention
    return AttentionTimes(
        layout=layout,
        forward_flops=forward_flops,
        math_forward_s=math_forward_s,
        grid_forward_s=grid_forward_s,
        grid_backward_s=grid_backward_s,
        merge_forward_s=merge_forward_s,
        merge_backward_s=merge_backward_s,
        forward_s=forward_s,
        backward_s=(
            backward_over_forward(chip, calls, core_share) * math_forward_s + grid_backward_s + merge_backward_s
        ),
        recompute_s=recomputed * forward_s,
        executed_flops=forward_flops * (1 + SPLASH_BACKWARD_OVER_FORWARD + recomputed),
        smem_bytes=smem_bytes(x, layout, calls, blocks),
    )


def vmapped_rows(x: Candidates, layout: Layout, traits: TargetTraits) -> np.ndarray:
    """How many calls the runtime vmaps its splash calls into, the only grid dimensions the backward's
    kernels let the compiler split over a device's cores: the device's sequences, or, where the runtime
    splits a call's rows over the cores, that many groups of them (of each packed row's own)."""
    sequences, cores = x.sequences_per_device, x.topology.chip.cores_per_device
    if not traits.splash_rows_split_over_cores:
        return sequences
    if x.model.documents:  # each row's ids apply to its heads alone
        return sequences * splash_row_groups(layout.kv_heads, cores)
    return splash_row_groups(sequences * layout.kv_heads, cores)


def smem_bytes(x: Candidates, layout: Layout, calls, blocks) -> np.ndarray:
    """SMEM of the largest call's mask tables: a causal call's whole table, a local call's shrunk one
    (its widest row of key blocks), none for a full mask."""
    if x.attention_mask.local:
        return np.max(
            [
                splash_smem_bytes(c.q_len, b.row_width * x.block_kv, block_q=x.block_q, block_kv=x.block_kv)
                for c, b in zip(calls, blocks)
            ],
            axis=0,
        )
    if x.model.causal:
        return splash_smem_bytes(layout.q_len, layout.kv_len, block_q=x.block_q, block_kv=x.block_kv)
    return np.zeros(np.shape(x.ring))


def call_tile(x: Candidates, call: KernelCall) -> tuple[np.ndarray, np.ndarray]:
    """The query and key blocks of `call`'s tiles for every candidate: the plan's, within the call's
    lengths, the query block within `q_block_cap` too."""
    return np.minimum(np.minimum(x.block_q, call.q_block_cap), call.q_len), np.minimum(x.block_kv, call.kv_len)


def per_call_shape(x: Candidates, call: KernelCall, count, *extra) -> np.ndarray:
    """`count(q_start, q_len, kv_start, kv_len, block_q, block_kv, *extra)` (a tuple of numbers) for every
    candidate, as `[..., fields]` columns, computed once per distinct call shape (a search prices many
    candidates over few shapes); `extra` are further per-candidate integer columns."""
    n = np.shape(x.ring)
    bq, bk = call_tile(x, call)
    columns = [
        np.broadcast_to(np.asarray(v, dtype=float), n)
        for v in (call.q_start, call.q_len, call.kv_start, call.kv_len, bq, bk, *extra)
    ]
    shapes = np.stack(columns, axis=-1).reshape(-1, len(columns)).astype(np.int64)
    unique, which = distinct_rows(shapes)
    found = np.array([count(*map(int, row)) for row in unique], dtype=float)
    return found[which.reshape(-1)].reshape(*n, found.shape[-1])


def local_blocks(x: Candidates, call: KernelCall) -> CallBlocks:
    """`call_blocks` of a local-mask call for every candidate, as columns."""
    found = per_call_shape(x, call, lambda *shape: dataclasses.astuple(call_blocks(call.mask, *shape)))
    return CallBlocks(*np.moveaxis(found, -1, 0))


def rank_query_calls(x: Candidates, layout: Layout) -> tuple[KernelCall, ...]:
    """Calls whose tiles are one context rank's queries against every key of the row (a causal mask keeps
    the earlier ones), for counting what documents leave: however a strategy splits them into calls
    (one gathered call, a ring's hops), a rank computes the pairs of its own queries. The rank the step
    waits for: in natural order the last; under zigzag (balanced) the first, whose two chunks are the
    row's first and last; where the devices share a host's cores, the average rank (the row over the
    ranks)."""
    row, ring = x.seq_len, np.asarray(layout.ring, dtype=float)
    chunk = row / ring
    zigzag = np.asarray(x.zigzag & ~x.shared_cores, dtype=float)
    shared = np.asarray(x.shared_cores, dtype=float) * np.ones_like(ring)
    natural = (1.0 - zigzag) * (1.0 - shared)
    half = chunk / 2
    return (
        KernelCall(natural, chunk, row, q_start=row - chunk),
        KernelCall(zigzag, half, row, q_block_cap=half),
        KernelCall(zigzag, half, row, q_block_cap=half, q_start=row - half),
        KernelCall(shared / ring, row, row),
    )


def pruned_tiles(x: Candidates, call: KernelCall) -> np.ndarray:
    """The tiles a kernel that prunes by segment ids is expected to compute in `call`, for every candidate:
    its rows are a device's sequences, vmapped into one call that shares one schedule."""
    mask, documents = call.mask or x.attention_mask, x.model.varying_documents
    rows = rows_per_call(x.sequences_per_device)

    def count(*shape):
        return (expected_computed_tiles(mask, *shape[:6], documents, shape[6]),)

    return per_call_shape(x, call, count, rows)[..., 0]
