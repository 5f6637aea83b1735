"""Ring (ppermute) context parallelism over 'context'.

K/V travel around the ring in N−1 hops; the next hop's transfer is issued before the current
hop's attention so the two can overlap. Each hop attends with a small local mask chosen from
(my rank r, source rank s) — never an S×S mask:

- s == r: causal over the local block (the local order is increasing, zigzag or not);
- without zigzag: s < r full, s > r nothing;
- with zigzag (rank i holds chunks i and 2N−1−i): s < r, every query sees the source's first
  chunk only (full); s > r, only the second query chunk sees the source, and sees all of it;
- under a model's full mask (`ModelSpec.causal=False`, never zigzag): every step full, the local
  block included, on every rank.

Packed documents: segment ids travel round the ring with K/V, and each hop's splash call masks
by them too; a query that sees no key of a hop gets no weight in the merge. Hops are merged
with log-sum-exp. The backward is a custom VJP that walks the ring again:
splash's backward kernels get the merged output and log-sum-exp, and dK/dV accumulators travel
with K/V, arriving home after the N-th step.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from runtime import splash
from runtime.attention.base import AttentionLayout, fold_heads, unfold_heads

AXIS = "context"


def _shift(tree, n: int):
    """Sends every array to the next rank of the ring."""
    return jax.lax.ppermute(tree, AXIS, [(i, (i + 1) % n) for i in range(n)])


def _merge(out, lse, out_h, lse_h):
    new = jnp.logaddexp(lse, lse_h)
    out = out * jnp.exp(lse - new)[..., None] + out_h.astype(jnp.float32) * jnp.exp(lse_h - new)[..., None]
    return out, new


def _slice(ids, part: slice):
    return None if ids is None else ids[:, part]


def _hop_forward(q, k, v, q_ids, kv_ids, layout: AttentionLayout, past):
    """Output (fp32) and lse of a hop whose source is before (`past`) or after this rank."""
    length, half = q.shape[1], q.shape[1] // 2
    first, second = slice(None, half), slice(half, None)
    cfg = layout.kernel
    if not layout.zigzag:
        if not past:
            return jnp.zeros(q.shape, jnp.float32), jnp.full(q.shape[:2], -jnp.inf, jnp.float32)
        kernel = splash.full_kernel(length, length, cfg).with_segments(q_ids, kv_ids)
        out, lse = splash.attend_with_lse(kernel, q, k, v)
        return out.astype(jnp.float32), lse
    if past:
        kernel = splash.full_kernel(length, half, cfg).with_segments(q_ids, _slice(kv_ids, first))
        out, lse = splash.attend_with_lse(kernel, q, k[:, first], v[:, first])
        return out.astype(jnp.float32), lse
    kernel = splash.full_kernel(half, length, cfg).with_segments(_slice(q_ids, second), kv_ids)
    out, lse = splash.attend_with_lse(kernel, q[:, second], k, v)
    out = jnp.concatenate([jnp.zeros_like(out, jnp.float32), out.astype(jnp.float32)], axis=1)
    return out, jnp.concatenate([jnp.full_like(lse, -jnp.inf), lse], axis=1)


def _hop_backward(q, k, v, q_ids, kv_ids, out, lse, d_out, layout: AttentionLayout, past):
    """dq, dk, dv (fp32) of a hop whose source is before (`past`) or after this rank."""
    length, half = q.shape[1], q.shape[1] // 2
    first, second = slice(None, half), slice(half, None)
    cfg = layout.kernel
    f32 = lambda *xs: tuple(x.astype(jnp.float32) for x in xs)
    if not layout.zigzag:
        if not past:
            return f32(jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v))
        kernel = splash.full_kernel(length, length, cfg).with_segments(q_ids, kv_ids)
        return f32(*splash.attend_bwd(kernel, q, k, v, out, lse, d_out))
    if past:
        kernel = splash.full_kernel(length, half, cfg).with_segments(q_ids, _slice(kv_ids, first))
        dq, dk, dv = f32(*splash.attend_bwd(kernel, q, k[:, first], v[:, first], out, lse, d_out))
        pad = lambda x: jnp.concatenate([x, jnp.zeros_like(x)], axis=1)
        return dq, pad(dk), pad(dv)
    kernel = splash.full_kernel(half, length, cfg).with_segments(_slice(q_ids, second), kv_ids)
    dq, dk, dv = f32(*splash.attend_bwd(kernel, q[:, second], k, v, out[:, second], lse[:, second], d_out[:, second]))
    return jnp.concatenate([jnp.zeros_like(dq), dq], axis=1), dk, dv


def _source_is_past(hop: int, n: int):
    rank = jax.lax.axis_index(AXIS)
    return (rank - hop) % n < rank


def _hop(step, hop: int, layout: AttentionLayout, *args):
    """`_hop_forward` or `_hop_backward` of one hop: chosen at run time by where the source sits
    under a causal mask; whole (as from an earlier rank) under a full one."""
    if not layout.causal:
        return step(*args, layout=layout, past=True)
    return jax.lax.cond(
        _source_is_past(hop, layout.ring),
        partial(step, layout=layout, past=True),
        partial(step, layout=layout, past=False),
        *args,
    )


def _local_kernel(length: int, ids, layout: AttentionLayout) -> splash.Kernel:
    """The kernel of the rank's own block: causal, or full under the model's full mask."""
    return splash.block_kernel(length, length, layout.kernel, causal=layout.causal).with_segments(ids, ids)


def _forward(q, k, v, ids, layout: AttentionLayout):
    n, length = layout.ring, q.shape[1]
    out, lse = splash.attend_with_lse(_local_kernel(length, ids, layout), q, k, v)
    out = out.astype(jnp.float32)
    kv = (k, v, ids)
    for hop in range(1, n):
        kv = _shift(kv, n)
        out_h, lse_h = _hop(_hop_forward, hop, layout, q, kv[0], kv[1], ids, kv[2])
        out, lse = _merge(out, lse, out_h, lse_h)
    return out.astype(q.dtype), lse


@partial(jax.custom_vjp, nondiff_argnums=(4,))
def ring_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None, layout: AttentionLayout
) -> jax.Array:
    """Ring attention of folded `[heads, ring_block, d]` blocks (q pre-scaled); `segment_ids` or None."""
    return _forward(q, k, v, segment_ids, layout)[0]


def _ring_fwd(q, k, v, ids, layout):
    out, lse = _forward(q, k, v, ids, layout)
    # named like splash's residuals, so that a policy keeping "context" does not walk the ring again
    out, lse = (checkpoint_name(x, splash.RESIDUALS_NAME) for x in (out, lse))
    return out, (q, k, v, ids, out, lse)


def _ring_bwd(layout, residuals, d_out):
    q, k, v, ids, out, lse = residuals
    n, length = layout.ring, q.shape[1]
    local = _local_kernel(length, ids, layout)
    dq, dk, dv = (x.astype(jnp.float32) for x in splash.attend_bwd(local, q, k, v, out, lse, d_out))
    kv_ids = ids
    kv = (k, v)
    for hop in range(1, n):
        kv, kv_ids = _shift((kv, kv_ids), n)
        dk, dv = _shift((dk, dv), n)
        dq_h, dk_h, dv_h = _hop(_hop_backward, hop, layout, q, *kv, ids, kv_ids, out, lse, d_out)
        dq, dk, dv = dq + dq_h, dk + dk_h, dv + dv_h
    if n > 1:
        dk, dv = _shift((dk, dv), n)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


ring_attention.defvjp(_ring_fwd, _ring_bwd)


def attention(
    q: jax.Array, k: jax.Array, v: jax.Array, layout: AttentionLayout, segment_ids: jax.Array | None = None
) -> jax.Array:
    """Attention of local `[batch, seq/N, heads, d]` blocks (q pre-scaled); `segment_ids` `[batch, seq/N]` or None."""
    out = ring_attention(fold_heads(q), fold_heads(k), fold_heads(v), segment_ids, layout)
    return unfold_heads(out, q.shape[0])
