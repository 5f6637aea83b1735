"""USP: Ulysses all-to-all over 'context_ulysses' gathers each ring block for heads/u heads, then
`ring.py` runs over 'context' on those blocks; a second all-to-all restores the sequence split."""

from __future__ import annotations

import jax

from runtime.attention import ring, ulysses
from runtime.attention.base import AttentionLayout, fold_heads, unfold_heads


def attention(
    q: jax.Array, k: jax.Array, v: jax.Array, layout: AttentionLayout, segment_ids: jax.Array | None = None
) -> jax.Array:
    """Attention of local `[batch, seq/(r·u), heads, d]` blocks (q pre-scaled); `segment_ids` likewise or None."""
    q, k, v = ulysses.gather_sequence(q, k, v, layout)
    ids = ulysses.gather_segment_ids(segment_ids)
    out = ring.ring_attention(fold_heads(q), fold_heads(k), fold_heads(v), ids, layout)
    return ulysses.scatter_sequence(unfold_heads(out, q.shape[0]))
