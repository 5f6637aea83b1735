"""No context parallelism: each device holds whole sequences and runs one splash call with the layer's
mask (causal, full, a sliding window or chunks)."""

from __future__ import annotations

import jax

from runtime import splash
from runtime.attention.base import AttentionLayout, fold_heads, unfold_heads


def attention(
    q: jax.Array, k: jax.Array, v: jax.Array, layout: AttentionLayout, segment_ids: jax.Array | None = None
) -> jax.Array:
    """Attention of local `[batch, seq, heads, d]` blocks holding whole sequences (q pre-scaled);
    `segment_ids` `[batch, seq]` (packed documents) or None."""
    kernel = splash.block_kernel(q.shape[1], k.shape[1], layout.kernel, mask=layout.mask)
    kernel = kernel.with_segments(segment_ids, segment_ids)
    out = splash.attend(kernel, fold_heads(q), fold_heads(k), fold_heads(v))
    return unfold_heads(out, q.shape[0])
