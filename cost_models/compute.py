"""Compute-side efficiencies from first principles: MXU tile padding, splash's whole blocks across the
causal diagonal, its SMEM mask metadata, what a kernel pays per grid step and per call, and its scoped
VMEM. The coefficients are chip-row figures; derivations: docs/provenance/cost_models.md#compute."""

from __future__ import annotations

import numpy as np

LANE_WIDTH = 128  # splash keeps its running max and sum 128 lanes wide
# FLOPs, not time: backward runs 5 matmuls (QKᵀ again, dV, dP, dQ, dK) vs 2 forward; the time
# ratio is a chip row's `attention_backward_over_forward`, measured where there is data
SPLASH_BACKWARD_OVER_FORWARD = 2.5
SPLASH_BACKWARD_GRIDS = 2  # splash's backward runs two kernels over the block grid (dq, then dk/dv)
FUSED_BACKWARD_GRIDS = 1  # splash's fused backward: one kernel forms dq, dk and dv together
# arrays each kernel reads or writes, (shaped like q, shaped like k): forward q, o | k, v;
# dq q, dO, dq | k, v; dk/dv q, dO | k, v, dk, dv
SPLASH_FORWARD_OPERANDS = (2, 2)
SPLASH_BACKWARD_OPERANDS = (3 + 2, 2 + 4)


def backward_core_share(sequences, cores_per_device):
    """The share of a device's TensorCores splash's backward kernels keep busy: their grids' own
    dimensions are all sequential, so the only one the compiler splits over a device's cores is the
    batch the calls are vmapped over, one sequence per core at a time (v5p's megacore: one sequence
    runs on one of its two cores, two on both, three on 3/4 of them; docs/measurements.md, "Which
    TensorCores splash's backward runs on")."""
    sequences = np.maximum(np.asarray(sequences, dtype=float), 1.0)
    return sequences / (cores_per_device * np.ceil(sequences / cores_per_device))


def splash_row_groups(kv_rows, cores_per_device):
    """The groups a runtime that splits a splash call's folded (sequence × KV head) rows over a device's
    cores vmaps the call over: one per core where the rows split evenly (each group's query heads keep
    their KV heads), else one. The vmapped groups are what `backward_core_share` spreads."""
    kv_rows = np.asarray(kv_rows, dtype=float)
    return np.where(np.mod(kv_rows, cores_per_device) == 0, float(cores_per_device), 1.0)


def tile_efficiency(dim, tile: int):
    """Useful fraction of an MXU of side `tile` for a dimension of `dim` (array or scalar)."""
    dim = np.asarray(dim, dtype=float)
    if tile <= 1:
        return np.ones_like(dim)
    return dim / (np.ceil(dim / tile) * tile)


def causal_block_fraction(length, block):
    """Work of a causal kernel over `length` tokens in `block`s, relative to full: n(n+1)/2 of n² blocks."""
    n = np.maximum(np.asarray(length, dtype=float) / block, 1.0)
    return (n + 1) / (2 * n)


def attention_extent(seq_len, ring, zigzag, *, block_q, block_kv, causal=True):
    """Query×key token pairs the busiest device computes per sequence and head, in whole blocks: over
    `ring` devices, with zigzag (rank i holds chunks i and 2·ring−1−i) or without, causal or full mask
    (`ModelSpec.causal`: every pair, on every rank alike)."""
    s = np.asarray(seq_len, dtype=float)
    ring = np.asarray(ring, dtype=float)
    block = np.maximum(block_q, block_kv)
    chunk = s / ring
    if not causal:
        return chunk * s  # the same on every rank, whatever the balancing and blocks
    plain = chunk**2 * ((ring - 1) + causal_block_fraction(chunk, block))
    half = chunk / 2
    balanced = half**2 * ((2 * ring - 1) + 2 * causal_block_fraction(half, block))
    return np.where(np.asarray(zigzag) & (ring > 1), balanced, plain)


def splash_index_bytes(largest_index):
    """Bytes of the smallest signed integer type holding `largest_index` (int8, int16, int32)."""
    largest_index = np.asarray(largest_index, dtype=float)
    return np.where(largest_index < 2**7, 1, np.where(largest_index < 2**15, 2, 4))


def splash_smem_bytes(q_len, kv_len, *, block_q, block_kv):
    """SMEM of splash's mask metadata for one (q_len × kv_len) call: per (q block × kv block) one int8 mask
    entry and one block index in the smallest integer type that holds it, shared by all heads."""
    nq = np.ceil(np.asarray(q_len, dtype=float) / block_q)
    nk = np.ceil(np.asarray(kv_len, dtype=float) / block_kv)
    return nq * nk * (1 + splash_index_bytes(np.maximum(nq, nk) - 1))


def splash_grid_steps(heads, q_len, kv_len, *, block_q, block_kv):
    """Grid steps of one splash kernel over `heads` (batch folded in) × q blocks × kv blocks;
    the blocks are those in effect (no longer than their lengths)."""
    return (
        np.asarray(heads, dtype=float) * np.ceil(np.asarray(q_len, dtype=float) / block_q) * np.ceil(kv_len / block_kv)
    )


def splash_operand_bytes(q_heads, kv_heads, q_len, kv_len, *, head_dim, act_bytes, operands):
    """Bytes of the arrays a kernel reads or writes, `operands` = (count shaped like q, like k)."""
    q_array = np.asarray(q_heads, dtype=float) * q_len * head_dim * act_bytes
    kv_array = np.asarray(kv_heads, dtype=float) * kv_len * head_dim * act_bytes
    return operands[0] * q_array + operands[1] * kv_array


def splash_partial_elements(heads, q_len, *, block_q, block_kv, causal):
    """Logit elements of the blocks a causal mask cuts through, where the mask rule is evaluated:
    `q_len · max(block_q, block_kv)` per head; none for a full mask."""
    return np.where(causal, np.asarray(heads, dtype=float) * q_len * np.maximum(block_q, block_kv), 0.0)


DQ_PARTIAL_BYTES = 4  # tokamax's fused backward keeps its dq partials in fp32
# tokamax's fused backward accepts one rolled count of dq partials, or none (MaxText's dq_reduction_steps)
DQ_REDUCTION_STEPS = 3


def dq_partials(kv_len, block_kv, *, reduction_steps=0, act_bytes=2, in_q_dtype=False):
    """(partials, bytes per element) of the fused backward's dq: one partial per key block, fp32 in tokamax's
    kernel and in q's dtype where `in_q_dtype` (jax's splash, `_splash_attention_bwd_dkv`); or, with
    `reduction_steps` (tokamax's `dq_reduction_steps`) and more key blocks than that, that many partials
    in the compute dtype, key block j adding into partial j mod steps (tokamax's splash_attention_kernel)."""
    blocks = np.ceil(np.asarray(kv_len, dtype=float) / np.minimum(block_kv, kv_len))
    rolled = (reduction_steps > 0) & (blocks > reduction_steps)
    wide = act_bytes if in_q_dtype else DQ_PARTIAL_BYTES
    return np.where(rolled, reduction_steps, blocks), np.where(rolled, act_bytes, wide)


def dq_partial_bytes(
    q_heads, q_len, kv_len, *, head_dim, block_kv, reduction_steps=0, act_bytes=2, in_q_dtype=False, key_chunks=1
):
    """HBM bytes the fused backward's dq partials cost outside the kernel: each partial [q_len, head_dim]
    per head (`dq_partials`) read back by the sum after the kernel, plus the sum's result (the kernel's own
    writes stream out while it computes); over `key_chunks` (`fused_backward_key_chunks`) each chunk's sum
    is also added into the fp32 accumulator, read and written."""
    count, nbytes = dq_partials(
        kv_len, block_kv, reduction_steps=reduction_steps, act_bytes=act_bytes, in_q_dtype=in_q_dtype
    )
    chunks = np.asarray(key_chunks, dtype=float)
    accumulated = np.where(chunks > 1, chunks * (nbytes + 2 * DQ_ACCUMULATOR_BYTES), nbytes)
    return dq_elements(q_heads, q_len, head_dim) * (nbytes * count + accumulated)


def dq_elements(q_heads, q_len, head_dim):
    """Values of one dq array (a partial, or the sum) of `q_heads` heads (the batch folded in)."""
    return np.asarray(q_heads, dtype=float) * q_len * head_dim


# a fused backward call's dq partials may hold this share of a chip's HBM; past it cpplan's runtime runs
# the call over chunks of its keys (one kernel call each, its partials summed before the next)
DQ_PARTIALS_HBM_SHARE = 0.125
DQ_ACCUMULATOR_BYTES = 4  # the chunks' dq sums add up in fp32


def fused_backward_key_chunks(q_heads, q_len, kv_len, *, head_dim, block_kv, act_bytes, hbm_bytes):
    """The chunks of its keys cpplan's runtime runs a fused backward call over (`runtime.splash.attend_bwd`):
    one where the call's dq partials (jax's splash: one per key block, in q's dtype) fit
    `DQ_PARTIALS_HBM_SHARE` of `hbm_bytes`, else the fewest that bring one chunk's under it, a power of two
    dividing the key blocks, or one chunk per key block where none does; one where `hbm_bytes` is 0."""
    blocks, nbytes = dq_partials(kv_len, block_kv, act_bytes=act_bytes, in_q_dtype=True)
    partials = blocks * nbytes * dq_elements(q_heads, q_len, head_dim)
    budget = DQ_PARTIALS_HBM_SHARE * np.asarray(hbm_bytes, dtype=float)
    need = np.where(budget > 0, partials / np.where(budget > 0, budget, 1.0), 1.0)
    power = 2.0 ** np.ceil(np.log2(np.maximum(need, 1.0)))
    return np.where(power <= 1, 1.0, np.where((power < blocks) & (np.mod(blocks, power) == 0), power, blocks))


def splash_step_costs(
    q_heads,
    kv_heads,
    q_len,
    kv_len,
    *,
    head_dim,
    act_bytes,
    block_q,
    block_kv,
    per_step_s,
    per_step_byte_s,
    per_masked_element_s=0.0,
    per_call_byte_s=(0.0, 0.0),
    causal=False,
    fused_backward=False,
    hbm_s_per_byte=0.0,
    backward_core_share=1.0,
    dq_reduction_steps=0,
    dq_partials_in_q_dtype=False,
    local_blocks=None,
    key_chunks=1,
):
    """(forward, backward) seconds one splash call pays beyond the FLOPs of its computed blocks.

    Each kernel (forward; dq and dk/dv, or the fused backward) pays per grid step `per_step_s` plus
    `per_step_byte_s` per byte of its operand arrays, plus `per_masked_element_s` per logit where the causal
    rule is evaluated; forward and backward each pay `per_call_byte_s` once per operand byte. The backward's
    grids run on `backward_core_share` of the device's cores, and a fused backward also moves its dq
    partials (`dq_partials` under `dq_reduction_steps` and `dq_partials_in_q_dtype`) at `hbm_s_per_byte`;
    `fused_backward` is one bool or a column of them. A fused backward run over `key_chunks` chunks of its keys
    (`fused_backward_key_chunks`) is that many calls, each reading all of the query side's operands and its
    chunk of the key side's. Blocks are clamped to the lengths; heads have the batch folded in.
    Under a local mask `local_blocks` (`masks.CallBlocks` columns) gives the shrunk grids and the blocks
    where the rule is evaluated.
    """
    bq, bk = np.minimum(block_q, q_len), np.minimum(block_kv, kv_len)
    steps = splash_grid_steps(q_heads, q_len, kv_len, block_q=bq, block_kv=bk)
    shape = dict(q_heads=q_heads, kv_heads=kv_heads, q_len=q_len, kv_len=kv_len, head_dim=head_dim, act_bytes=act_bytes)
    masked = per_masked_element_s * splash_partial_elements(q_heads, q_len, block_q=bq, block_kv=bk, causal=causal)
    grids = np.where(fused_backward, FUSED_BACKWARD_GRIDS, SPLASH_BACKWARD_GRIDS)
    backward_steps = grids * steps
    if local_blocks is not None:  # grids shrunk to the blocks the mask leaves (splash's process_mask)
        heads = np.asarray(q_heads, dtype=float)
        steps = heads * np.floor(q_len / bq) * local_blocks.row_width
        dkv_steps = heads * np.floor(kv_len / bk) * local_blocks.column_width
        backward_steps = np.where(fused_backward, dkv_steps, steps + dkv_steps)
        masked = per_masked_element_s * heads * local_blocks.partial * bq * bk
    forward_bytes = splash_operand_bytes(**shape, operands=SPLASH_FORWARD_OPERANDS)
    chunks = np.where(fused_backward, key_chunks, 1.0)
    chunk_shape = dict(shape, kv_len=np.asarray(kv_len, dtype=float) / chunks)
    backward_bytes = splash_operand_bytes(**chunk_shape, operands=SPLASH_BACKWARD_OPERANDS)
    partials = np.where(
        fused_backward,
        hbm_s_per_byte
        * dq_partial_bytes(
            q_heads,
            q_len,
            kv_len,
            head_dim=head_dim,
            block_kv=bk,
            reduction_steps=dq_reduction_steps,
            act_bytes=act_bytes,
            in_q_dtype=dq_partials_in_q_dtype,
            key_chunks=chunks,
        ),
        0.0,
    )
    fwd = steps * (per_step_s + per_step_byte_s * forward_bytes) + masked + per_call_byte_s[0] * forward_bytes
    bwd = (
        (backward_steps * (per_step_s + per_step_byte_s * backward_bytes / grids) + grids * masked)
        / backward_core_share
        + per_call_byte_s[1] * chunks * backward_bytes
        + partials
    )
    return fwd, bwd


def splash_vmem_bytes(block_q, block_kv, *, head_dim, act_bytes):
    """Scoped VMEM of the largest splash grid step a training step runs: a block pair's fp32 logits and
    compute-dtype probabilities, the fp32 output accumulator and running max and sum, and the q, k, v and
    output blocks double-buffered; and, for the fused backward's dK/dV step, its fp32 dK and dV accumulators,
    its fp32 dq partial block and the dO block double-buffered, and the log-sum-exp and its delta lane-wide.
    It errs towards refusing (docs/provenance/cost_models.md#compute; the fused step compiled at 38.06 MiB at
    blocks of 2048 and heads of 128, this gives 38.0: docs/compiler_aborts.md)."""
    logits = block_q * block_kv * (4 + act_bytes)
    accumulators = block_q * (head_dim + 2 * LANE_WIDTH) * 4
    blocks = 2 * (2 * block_q + 2 * block_kv) * head_dim * act_bytes
    fused_backward = 2 * block_kv * head_dim * 4 + 2 * block_q * (head_dim * (4 + act_bytes) + LANE_WIDTH * 4)
    return logits + accumulators + blocks + fused_backward


def splash_vmem_problem(block_q, block_kv, *, head_dim, act_bytes, chip) -> "str | None":
    """None when a splash grid step fits the most scoped VMEM the chip's compiler grants (its
    default, raised by flag as far as splash compiles: `chip.scoped_vmem_max_bytes`), else the
    rule with its numbers; a chip that interprets kernels has no limit."""
    if chip.kind.interprets_kernels:
        return None
    need = splash_vmem_bytes(block_q, block_kv, head_dim=head_dim, act_bytes=act_bytes)
    if need <= chip.scoped_vmem_max_bytes:
        return None
    return (
        f"splash blocks {int(block_q)}×{int(block_kv)} need about {need / 2**20:.1f} MiB of scoped VMEM per grid "
        f"step > the most {chip.name}'s compiler grants, {chip.scoped_vmem_max_bytes / 2**20:.0f} MiB"
    )


SCOPED_VMEM_FLAG = "--xla_tpu_scoped_vmem_limit_kib"  # the TPU compiler's flag raising the limit


def scoped_vmem_flag(limit_kib: int | None) -> str:
    """The compiler flag raising the scoped VMEM limit to `limit_kib` ("" for None: the default)."""
    return "" if limit_kib is None else f"{SCOPED_VMEM_FLAG}={limit_kib}"


def scoped_vmem_limit_kib(block_q, block_kv, *, head_dim, act_bytes, chip) -> "int | None":
    """The `SCOPED_VMEM_FLAG` value a TPU compile of these blocks needs: the chip's raised limit
    where a grid step needs more than the compiler's default and fits that; else None (the
    default suffices, or nothing does: `splash_vmem_problem` refuses the blocks)."""
    if chip.kind.interprets_kernels:
        return None
    need = splash_vmem_bytes(block_q, block_kv, head_dim=head_dim, act_bytes=act_bytes)
    return chip.scoped_vmem_max_bytes // 1024 if chip.scoped_vmem_bytes < need <= chip.scoped_vmem_max_bytes else None
