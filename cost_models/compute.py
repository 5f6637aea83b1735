"""Compute-side efficiencies derived from first principles, not fitted.

- MXU tile padding: a matmul whose contracting or output-feature dimension is not a multiple
  of the systolic array's side wastes the padded part of the array.
- Splash attention works on whole (block_q × block_kv) blocks: blocks that cross the causal
  diagonal are computed in full, so a causal kernel over n blocks per side does n(n+1)/2
  blocks' work, not n²/2. With unequal blocks, one a multiple of the other, the larger one
  sets that waste: L²/2 + L·max(block_q, block_kv)/2 token pairs over L tokens.
- Splash prefetches its mask metadata into SMEM. cpplan's runtime evaluates the causal rule
  inside the kernel (a mask function), so per (q block × kv block) it keeps one int8
  `block_mask` entry and one `data_next` index, downcast to the smallest integer type that holds
  the block count (jax's splash_attention_mask_info downcasts SMEM arrays), shared by all heads.
  A full (non-causal) mask keeps none: the kernel visits every block.
- A kernel run as a grid pays per grid step, computed or skipped: a fixed cost, and where the
  kernel is interpreted (Pallas interpret mode on a host) a copy of every operand array it
  reads or writes — the discharged loop carries whole arrays, and XLA's CPU backend copies
  them at each step (read in the step's HLO as full-array dynamic-update-slice fusions).
  Mosaic kernels on a TPU move blocks only: their rows price the copies at 0. Blocks a causal
  mask cuts through also evaluate the mask rule per logit (measured on a host, where interpret
  mode makes that as dear as the block's matmuls, and fitted to tokamax's TPU timings).
- A call also pays, once, a number of passes over its operand arrays at HBM bandwidth (the
  layout copies and residuals around the kernel; fitted to tokamax's TPU timings, 0 on a host).
"""
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


def tile_efficiency(dim, tile: int):
    """Useful fraction of an MXU of side `tile` for a dimension of `dim` (array or scalar)."""
    dim = np.asarray(dim, dtype=float)
    if tile <= 1:
        return np.ones_like(dim)
    return dim / (np.ceil(dim / tile) * tile)


def causal_block_fraction(length, block):
    """Work of a causal kernel over `length` tokens in `block`-sized blocks, relative to full.

    n blocks per side, n(n+1)/2 computed: (n+1)/(2n) of the full n² (→ 1/2 for long kernels).
    """
    n = np.maximum(np.asarray(length, dtype=float) / block, 1.0)
    return (n + 1) / (2 * n)


def attention_extent(seq_len, ring, zigzag, *, block_q, block_kv, causal=True):
    """Query×key token pairs the busiest device computes per sequence and head, causal or full mask.

    Args:
        seq_len: tokens per sequence.
        ring: devices the sequence is split over for attention (1 = whole sequence local).
        zigzag: whether rank i holds chunks i and 2·ring−1−i.
        block_q: splash query block.
        block_kv: splash key/value block.
        causal: whether the model's mask is causal (`ModelSpec.causal`); a full mask computes
            every pair, on every rank alike, so zigzag and the blocks change nothing.
    Returns:
        Token pairs (arrays broadcast over the arguments; under a full mask over seq_len and ring).

    Causal pairs are counted in whole blocks: each query block computes the key blocks up to
    its last row; when one block size divides the other that is the square case with the
    larger block (see the module docstring).
    With no balancing the last rank sees all earlier blocks in full plus its own diagonal:
    (ring−1) full blocks + one causal one; with zigzag every rank does 2·ring−1 full quarter
    blocks and two causal ones. Under a full mask every rank sees its S/ring queries against
    all S keys.
    """
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
    """SMEM the splash kernel's mask metadata needs for one (q_len × kv_len) call, any shapes.

    Args:
        q_len: query tokens of the call.
        kv_len: key tokens of the call.
        block_q: splash query block.
        block_kv: splash key/value block.
    Returns:
        Bytes: one int8 mask entry and one index per (q block × kv block).
    """
    nq = np.ceil(np.asarray(q_len, dtype=float) / block_q)
    nk = np.ceil(np.asarray(kv_len, dtype=float) / block_kv)
    return nq * nk * (1 + splash_index_bytes(np.maximum(nq, nk) - 1))


def splash_grid_steps(heads, q_len, kv_len, *, block_q, block_kv):
    """Grid steps of one splash kernel over `heads` (batch folded in) × q blocks × kv blocks;
    the blocks are those in effect (no longer than their lengths)."""
    return np.asarray(heads, dtype=float) * np.ceil(np.asarray(q_len, dtype=float) / block_q) * \
        np.ceil(kv_len / block_kv)


def splash_operand_bytes(q_heads, kv_heads, q_len, kv_len, *, head_dim, act_bytes, operands):
    """Bytes of the arrays a kernel reads or writes, `operands` = (count shaped like q, like k)."""
    q_array = np.asarray(q_heads, dtype=float) * q_len * head_dim * act_bytes
    kv_array = np.asarray(kv_heads, dtype=float) * kv_len * head_dim * act_bytes
    return operands[0] * q_array + operands[1] * kv_array


def splash_partial_elements(heads, q_len, *, block_q, block_kv, causal):
    """Logit elements of the blocks a causal mask cuts through, where the mask rule is evaluated.

    Each query block crosses the diagonal over its own width, touching kv blocks worth
    `max(block_q, block_kv)` keys: `q_len · max(bq, bk)` elements per head; none for a full mask.
    """
    return np.where(causal, np.asarray(heads, dtype=float) * q_len * np.maximum(block_q, block_kv), 0.0)


DQ_PARTIAL_BYTES = 4  # the fused backward's dq partials are fp32


def dq_partial_bytes(q_heads, q_len, kv_len, *, head_dim, block_kv):
    """HBM bytes the fused backward's dq partials cost outside the kernel: one fp32 [q_len,
    head_dim] per head and key block, read back by the sum after the kernel, plus the sum's result.
    The kernel's own writes of them stream out while it computes (a block of 512 × 128 fp32 values
    per grid step is far under HBM bandwidth)."""
    q_elements = np.asarray(q_heads, dtype=float) * q_len * head_dim
    return DQ_PARTIAL_BYTES * q_elements * (np.ceil(kv_len / np.minimum(block_kv, kv_len)) + 1)


def splash_step_costs(q_heads, kv_heads, q_len, kv_len, *, head_dim, act_bytes, block_q, block_kv,
                      per_step_s, per_step_byte_s, per_masked_element_s=0.0, per_call_byte_s=(0.0, 0.0),
                      causal=False, fused_backward=False, hbm_s_per_byte=0.0, backward_core_share=1.0):
    """(forward, backward) seconds one splash call pays beyond the FLOPs of its computed blocks.

    Each of the three kernels (forward, dq, dk/dv) pays `per_step_s` per grid step, plus
    `per_step_byte_s` per byte of its operand arrays per step, plus `per_masked_element_s` per
    logit of the blocks a causal mask cuts through (the mask rule is evaluated there); forward
    and backward each pay their `per_call_byte_s` once per byte of their operand arrays.

    Args:
        q_heads: query heads of the call, batch folded in.
        kv_heads: key/value heads of the call, batch folded in.
        q_len: query tokens.
        kv_len: key tokens.
        head_dim: dimensions per head.
        act_bytes: bytes per value of q, k, v and their gradients.
        block_q: splash query block (clamped to `q_len`).
        block_kv: splash key/value block (clamped to `kv_len`).
        per_step_s: seconds per grid step.
        per_step_byte_s: seconds per grid step per byte of operand arrays.
        per_masked_element_s: seconds per logit where the causal rule is evaluated.
        per_call_byte_s: (forward, backward) seconds per byte of their operand arrays, once per
            call (passes over them / HBM bandwidth).
        causal: whether the call's mask is causal.
        fused_backward: the backward is splash's fused kernel (one grid; `dq_partial_bytes`
            moved at `hbm_s_per_byte`), not the dq and dk/dv kernels.
        hbm_s_per_byte: seconds per byte of HBM traffic outside the kernels.
        backward_core_share: the share of the device's cores the backward's grids run on (their
            per-step costs scale by its inverse).
    Returns:
        (forward seconds, backward seconds).
    """
    bq, bk = np.minimum(block_q, q_len), np.minimum(block_kv, kv_len)
    steps = splash_grid_steps(q_heads, q_len, kv_len, block_q=bq, block_kv=bk)
    shape = dict(q_heads=q_heads, kv_heads=kv_heads, q_len=q_len, kv_len=kv_len, head_dim=head_dim,
                 act_bytes=act_bytes)
    masked = per_masked_element_s * splash_partial_elements(q_heads, q_len, block_q=bq, block_kv=bk, causal=causal)
    forward_bytes = splash_operand_bytes(**shape, operands=SPLASH_FORWARD_OPERANDS)
    backward_bytes = splash_operand_bytes(**shape, operands=SPLASH_BACKWARD_OPERANDS)
    grids = FUSED_BACKWARD_GRIDS if fused_backward else SPLASH_BACKWARD_GRIDS
    partials = hbm_s_per_byte * dq_partial_bytes(q_heads, q_len, kv_len, head_dim=head_dim, block_kv=bk) \
        if fused_backward else 0.0
    fwd = steps * (per_step_s + per_step_byte_s * forward_bytes) + masked + per_call_byte_s[0] * forward_bytes
    bwd = (steps * (grids * per_step_s + per_step_byte_s * backward_bytes) + grids * masked) / backward_core_share \
        + per_call_byte_s[1] * backward_bytes + partials
    return fwd, bwd


def splash_vmem_bytes(block_q, block_kv, *, head_dim, act_bytes):
    """Scoped VMEM of one splash grid step: the fp32 logits of a block pair and their
    probabilities in the compute dtype, the fp32 output accumulator and running max and sum, and
    the q, k, v and output blocks double-buffered. For blocks of 2048, head_dim 128, bf16 it gives
    31 MiB against the compiler's 27.9M: it errs towards refusing."""
    logits = block_q * block_kv * (4 + act_bytes)
    accumulators = block_q * (head_dim + 2 * LANE_WIDTH) * 4
    blocks = 2 * (2 * block_q + 2 * block_kv) * head_dim * act_bytes
    return logits + accumulators + blocks


def splash_vmem_problem(block_q, block_kv, *, head_dim, act_bytes, chip) -> "str | None":
    """None when a splash grid step fits the most scoped VMEM the chip's compiler grants (its
    default, raised by flag as far as splash compiles: `chip.scoped_vmem_max_bytes`), else the
    rule with its numbers; a chip that interprets kernels has no limit."""
    if chip.kind.interprets_kernels:
        return None
    need = splash_vmem_bytes(block_q, block_kv, head_dim=head_dim, act_bytes=act_bytes)
    if need <= chip.scoped_vmem_max_bytes:
        return None
    return (f"splash blocks {int(block_q)}×{int(block_kv)} need about {need / 2**20:.1f} MiB of scoped VMEM per grid "
            f"step > the most {chip.name}'s compiler grants, {chip.scoped_vmem_max_bytes / 2**20:.0f} MiB")


SCOPED_VMEM_FLAG = "--xla_tpu_scoped_vmem_limit_kib"  # the TPU compiler's flag raising the limit


def scoped_vmem_limit_kib(block_q, block_kv, *, head_dim, act_bytes, chip) -> "int | None":
    """The `SCOPED_VMEM_FLAG` value a TPU compile of these blocks needs: the chip's raised limit
    where a grid step needs more than the compiler's default and fits that; else None (the
    default suffices, or nothing does: `splash_vmem_problem` refuses the blocks)."""
    if chip.kind.interprets_kernels:
        return None
    need = splash_vmem_bytes(block_q, block_kv, head_dim=head_dim, act_bytes=act_bytes)
    return chip.scoped_vmem_max_bytes // 1024 if chip.scoped_vmem_bytes < need <= chip.scoped_vmem_max_bytes else None
