"""USP: Ulysses all-to-all over 'context_ulysses' inside, ring over 'context' across.

The all-to-all gathers each ring block for heads/u heads; the ring then runs exactly as in
`ring.py` on those blocks; a second all-to-all restores the sequence split.
"""
from __future__ import annotations

import jax

from runtime.attention import ring, ulysses
from runtime.attention.base import AttentionLayout, fold_heads, unfold_heads


def attention(q: jax.Array, k: jax.Array, v: jax.Array, layout: AttentionLayout) -> jax.Array:
    """Causal attention of local `[batch, seq/(r·u), heads, d]` blocks (q pre-scaled)."""
    q, k, v = ulysses.gather_sequence(q, k, v, layout)
    out = ring.ring_attention(fold_heads(q), fold_heads(k), fold_heads(v), layout)
    return ulysses.scatter_sequence(unfold_heads(out, q.shape[0]))
