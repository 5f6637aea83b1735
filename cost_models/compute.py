"""Compute-side efficiencies derived from first principles, not fitted.

- MXU tile padding: a matmul whose contracting or output-feature dimension is not a multiple
  of the systolic array's side wastes the padded part of the array.
- Splash attention works on whole (block_q × block_kv) blocks: blocks that cross the causal
  diagonal are computed in full, so a causal kernel over n blocks per side does n(n+1)/2
  blocks' work, not n²/2.
- Splash prefetches its mask metadata into SMEM. cpplan's runtime evaluates the causal rule
  inside the kernel (a mask function), so per (q block × kv block) it keeps one int8
  `block_mask` entry and one `data_next` index, downcast to the smallest integer type that holds
  the block count (jax's splash_attention_mask_info downcasts SMEM arrays), shared by all heads.
"""
from __future__ import annotations

import numpy as np

SPLASH_BACKWARD_OVER_FORWARD = 2.5  # backward: 5 matmuls (QKᵀ again, dV, dP, dQ, dK) vs 2 forward
SPLASH_BACKWARD_GRIDS = 2  # splash's backward runs two kernels over the block grid (dq, then dk/dv)


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


def causal_attention_extent(seq_len, ring, zigzag, block):
    """Query×key token pairs the busiest device computes per sequence and head, whole blocks.

    Args:
        seq_len: tokens per sequence.
        ring: devices the sequence is split over for attention (1 = whole sequence local).
        zigzag: whether rank i holds chunks i and 2·ring−1−i.
        block: splash block size.
    With no balancing the last rank sees all earlier blocks in full plus its own diagonal:
    (ring−1) full blocks + one causal one; with zigzag every rank does 2·ring−1 full quarter
    blocks and two causal ones.
    """
    s = np.asarray(seq_len, dtype=float)
    ring = np.asarray(ring, dtype=float)
    chunk = s / ring
    plain = chunk**2 * ((ring - 1) + causal_block_fraction(chunk, block))
    half = chunk / 2
    balanced = half**2 * ((2 * ring - 1) + 2 * causal_block_fraction(half, block))
    return np.where(np.asarray(zigzag) & (ring > 1), balanced, plain)


def splash_index_bytes(largest_index):
    """Bytes of the smallest signed integer type holding `largest_index` (int8, int16, int32)."""
    largest_index = np.asarray(largest_index, dtype=float)
    return np.where(largest_index < 2**7, 1, np.where(largest_index < 2**15, 2, 4))


def splash_smem_bytes(q_len, kv_len, block):
    """SMEM the splash kernel's mask metadata needs for one (q_len × kv_len) call, any shapes."""
    nq = np.ceil(np.asarray(q_len, dtype=float) / block)
    nk = np.ceil(np.asarray(kv_len, dtype=float) / block)
    return nq * nk * (1 + splash_index_bytes(np.maximum(nq, nk) - 1))
