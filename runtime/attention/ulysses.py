"""Ulysses context parallelism over 'context_ulysses': an all-to-all trades the sequence split for a
head split (kv heads replicated first when fewer than the degree), a second one restores it. USP reuses both.
"""

from __future__ import annotations

import jax

from runtime import splash
from runtime.attention.base import AttentionLayout, fold_heads, repeat_kv_for, unfold_heads

AXIS = "context_ulysses"


def gather_sequence(q, k, v, layout: AttentionLayout):
    """All-to-all: `[b, s/u, h, d]` → `[b, s, h/u, d]` (kv heads replicated to a multiple of u)."""
    k, v = repeat_kv_for(k, layout.ulysses), repeat_kv_for(v, layout.ulysses)
    return tuple(jax.lax.all_to_all(x, AXIS, split_axis=2, concat_axis=1, tiled=True) for x in (q, k, v))


def gather_segment_ids(segment_ids: jax.Array | None) -> jax.Array | None:
    """`[b, s/u]` → `[b, s]`: the ids of the whole sequence block, in the order the all-to-all
    concatenates it (they have no heads to split)."""
    return None if segment_ids is None else jax.lax.all_gather(segment_ids, AXIS, axis=1, tiled=True)


def scatter_sequence(out: jax.Array) -> jax.Array:
    """All-to-all back: `[b, s, h/u, d]` → `[b, s/u, h, d]`."""
    return jax.lax.all_to_all(out, AXIS, split_axis=1, concat_axis=2, tiled=True)


def attention(
    q: jax.Array, k: jax.Array, v: jax.Array, layout: AttentionLayout, segment_ids: jax.Array | None = None
) -> jax.Array:
    """Attention of local `[batch, seq/u, heads, d]` blocks (q pre-scaled); `segment_ids` `[batch, seq/u]` or None."""
    q, k, v = gather_sequence(q, k, v, layout)
    ids = gather_segment_ids(segment_ids)
    kernel = splash.block_kernel(q.shape[1], k.shape[1], layout.kernel, mask=layout.mask).with_segments(ids, ids)
    out = unfold_heads(splash.attend(kernel, fold_heads(q), fold_heads(k), fold_heads(v)), q.shape[0])
    return scatter_sequence(out)
