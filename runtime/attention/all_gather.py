"""All-gather context parallelism: gather K/V (and segment ids) over 'context', attend local queries to all.

Gathered keys return to natural order and queries carry global positions, so one splash call with the
layer's mask per rank suffices (its rank's block-table row picked at run time); autodiff makes dK/dV a reduce-scatter.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from runtime import splash
from runtime.attention.base import AttentionLayout, fold_heads, unfold_heads
from runtime.layout import natural_chunk_slots, token_order


def _natural_order(x: jax.Array, n: int, seq: int) -> jax.Array:
    """Gathered zigzag chunks `[batch, seq, ...]` back in natural order."""
    chunks = x.reshape(x.shape[0], 2 * n, seq // (2 * n), *x.shape[2:])
    return jnp.take(chunks, jnp.asarray(natural_chunk_slots(n)), axis=1).reshape(x.shape)


def attention(
    q: jax.Array, k: jax.Array, v: jax.Array, layout: AttentionLayout, segment_ids: jax.Array | None = None
) -> jax.Array:
    """Attention of local `[batch, seq/N, heads, d]` blocks (q pre-scaled); `segment_ids` `[batch, seq/N]` or None."""
    n, seq = layout.ring, layout.seq_len
    gathered = [jax.lax.all_gather(x, "context", axis=1, tiled=True) for x in (k, v, segment_ids) if x is not None]
    if layout.zigzag and n > 1:
        gathered = [_natural_order(x, n, seq) for x in gathered]
    k_all, v_all, kv_ids = (gathered + [None])[:3]
    config = layout.kernel
    if layout.zigzag and n > 1:  # a query block must not straddle the rank's two chunks
        config = dataclasses.replace(config, block_q=min(config.block_q, seq // (2 * n)))
    positions = token_order(seq, n, layout.zigzag).reshape(n, seq // n)
    rank = jax.lax.axis_index("context")
    if layout.mask.local:  # the gathered keys start at position 0 on every rank
        kernel = splash.mask_kernel(layout.mask, positions, np.zeros(n, dtype=np.int64), seq, rank, config)
    elif layout.causal:
        kernel = splash.causal_kernel_per_rank(positions, seq, rank, config)
    else:  # every local query sees every gathered key, wherever the rank sits
        kernel = splash.full_kernel(q.shape[1], seq, config)
    out = splash.attend(kernel.with_segments(segment_ids, kv_ids), fold_heads(q), fold_heads(k_all), fold_heads(v_all))
    return unfold_heads(out, q.shape[0])
