"""Ring (ppermute) context parallelism over 'context'.

K/V travel around the ring in N−1 hops; the next hop's transfer is issued before the current
hop's attention so the two can overlap. Each hop attends with a small local mask chosen from
(my rank r, source rank s) — never an S×S mask:

- s == r: causal over the local block (the local order is increasing, zigzag or not);
- without zigzag: s < r full, s > r nothing;
- with zigzag (rank i holds chunks i and 2N−1−i): s < r, every query sees the source's first
  chunk only (full); s > r, only the second query chunk sees the source, and sees all of it;
- under a model's full mask (`ModelSpec.causal=False`, never zigzag): every step full, the local
  block included, on every rank;
- under a local mask (sliding window, chunks): only the first `hops_needed` hops
  (`AttentionLayout.hops`), each with the mask at its offset (below); no K/V travel further.

Packed documents: segment ids travel round the ring with K/V, and each hop's splash call masks
by them too; a query that sees no key of a hop gets no weight in the merge. Hops are merged
with log-sum-exp. The backward is a custom VJP that walks the ring again:
splash's backward kernels get the merged output and log-sum-exp, and dK/dV accumulators travel
with K/V, and one more transfer over the rest of the ring brings them home.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from runtime import splash
from runtime.attention.base import AttentionLayout, fold_heads, unfold_heads

AXIS = "context"


def _shift(tree, n: int, distance: int = 1):
    """Sends every array `distance` ranks on round the ring."""
    return jax.lax.ppermute(tree, AXIS, [(i, (i + distance) % n) for i in range(n)])


def _merge(out, lse, out_h, lse_h):
    """`out`, `lse` merged by log-sum-exp with a call's. Rows that saw no key of the call (`lse_h` −inf,
    output NaN from splash's 0/0: every tile of theirs pruned, or masked out of a window) keep their
    accumulators, which the rank's own block, merged first, makes finite (a query sees itself).
    Both choices are of computed values: a constant in a hop's branch (a zero for the unseen rows) is
    hoisted out of the layer loop by the compiler and held through it, one full-size fp32 buffer per hop
    (docs/provenance/strategies_and_validation.md#ring)."""
    seen = jnp.isfinite(lse_h)
    new = jnp.logaddexp(lse, lse_h)
    merged = out * jnp.exp(lse - new)[..., None] + out_h.astype(jnp.float32) * jnp.exp(lse_h - new)[..., None]
    return jnp.where(seen[..., None], merged, out), jnp.where(seen, new, lse)


def _slice(ids, part: slice):
    return None if ids is None else ids[:, part]


def _hop_forward(q, k, v, q_ids, kv_ids, out, lse, layout: AttentionLayout, past):
    """`out` (fp32) and `lse` merged with a hop whose source is before (`past`) or after this rank.

    A hop merges into the accumulators in place, rather than returning a padded output for a merge
    outside: the padding (zeros, −inf) depends only on the rank, so the compiler hoists every hop's
    out of the layer loop and holds them all through it (docs/provenance/strategies_and_validation.md#ring)."""
    length, half = q.shape[1], q.shape[1] // 2
    first, second = slice(None, half), slice(half, None)
    cfg = layout.kernel
    if not layout.zigzag:
        if not past:
            return out, lse
        kernel = splash.full_kernel(length, length, cfg).with_segments(q_ids, kv_ids)
        return _merge(out, lse, *splash.attend_with_lse(kernel, q, k, v))
    if past:
        kernel = splash.full_kernel(length, half, cfg).with_segments(q_ids, _slice(kv_ids, first))
        return _merge(out, lse, *splash.attend_with_lse(kernel, q, k[:, first], v[:, first]))
    kernel = splash.full_kernel(half, length, cfg).with_segments(_slice(q_ids, second), kv_ids)
    out_2, lse_2 = _merge(out[:, second], lse[:, second], *splash.attend_with_lse(kernel, q[:, second], k, v))
    return out.at[:, second].set(out_2), lse.at[:, second].set(lse_2)


def _hop_backward(q, k, v, q_ids, kv_ids, out, lse, d_out, grads, layout: AttentionLayout, past):
    """The fp32 accumulators `grads` = (dq, dk, dv) plus a hop whose source is before (`past`) or
    after this rank; added in place for the reason `_hop_forward` merges in place."""
    length, half = q.shape[1], q.shape[1] // 2
    first, second = slice(None, half), slice(half, None)
    cfg = layout.kernel
    dq, dk, dv = grads
    if not layout.zigzag:
        if not past:
            return grads
        kernel = splash.full_kernel(length, length, cfg).with_segments(q_ids, kv_ids)
        return tuple(
            g + h.astype(jnp.float32) for g, h in zip(grads, splash.attend_bwd(kernel, q, k, v, out, lse, d_out))
        )
    if past:
        kernel = splash.full_kernel(length, half, cfg).with_segments(q_ids, _slice(kv_ids, first))
        dq_h, dk_h, dv_h = splash.attend_bwd(kernel, q, k[:, first], v[:, first], out, lse, d_out)
        add_first = lambda g, h: g.at[:, first].add(h.astype(jnp.float32))
        return dq + dq_h.astype(jnp.float32), add_first(dk, dk_h), add_first(dv, dv_h)
    kernel = splash.full_kernel(half, length, cfg).with_segments(_slice(q_ids, second), kv_ids)
    dq_h, dk_h, dv_h = splash.attend_bwd(kernel, q[:, second], k, v, out[:, second], lse[:, second], d_out[:, second])
    f32 = jnp.float32
    return dq.at[:, second].add(dq_h.astype(f32)), dk + dk_h.astype(f32), dv + dv_h.astype(f32)


# -- under a local mask (sliding window, chunks) ---------------------------------------------------
# Natural order only (a local mask refuses zigzag): each step attends the rank's queries to one block
# `hop` blocks back, its tables and in-kernel mask from `cost_models.masks` at that offset
# (`splash.mask_kernel`; one static table, as every rank that runs the step has the same offset). A
# query that sees no key of a step gets no weight in the merge.


def _windowed_kernel(hop: int, q_ids, kv_ids, layout: AttentionLayout) -> splash.Kernel:
    n, block = layout.ring, layout.ring_block
    positions = np.arange(layout.seq_len).reshape(n, block)
    rank = jax.lax.axis_index("context")
    kernel = splash.mask_kernel(
        layout.mask, positions, positions[:, 0] - hop * block, block, rank, layout.kernel, seq_len=layout.seq_len
    )
    return kernel.with_segments(q_ids, kv_ids)


def _windowed_forward(q, k, v, q_ids, kv_ids, out, lse, *, layout: AttentionLayout, hop: int, past: bool):
    """`out` (fp32) and `lse` merged with step `hop` (0: the rank's own block); nothing from a later source."""
    if not past:
        return out, lse
    kernel = _windowed_kernel(hop, q_ids, kv_ids, layout)
    return _merge(out, lse, *splash.attend_with_lse(kernel, q, k, v))


def _windowed_backward(q, k, v, q_ids, kv_ids, out, lse, d_out, grads, *, layout: AttentionLayout, hop, past):
    """The fp32 accumulators `grads` = (dq, dk, dv) plus step `hop`'s share."""
    if not past:
        return grads
    parts = splash.attend_bwd(_windowed_kernel(hop, q_ids, kv_ids, layout), q, k, v, out, lse, d_out)
    return tuple(g + h.astype(jnp.float32) for g, h in zip(grads, parts))


def _windowed_own_forward(q, k, v, ids, layout: AttentionLayout):
    """The rank's own block: fp32 output and log-sum-exp."""
    out = jnp.zeros(q.shape, jnp.float32)
    lse = jnp.full(q.shape[:2], -jnp.inf, jnp.float32)
    return _windowed_forward(q, k, v, ids, ids, out, lse, layout=layout, hop=0, past=True)


def _windowed_own_backward(q, k, v, ids, out, lse, d_out, layout: AttentionLayout):
    """The rank's own block's (dq, dk, dv), fp32."""
    zeros = tuple(jnp.zeros(x.shape, jnp.float32) for x in (q, k, v))
    return _windowed_backward(q, k, v, ids, ids, out, lse, d_out, zeros, layout=layout, hop=0, past=True)


def _source_is_past(hop: int, n: int):
    rank = jax.lax.axis_index(AXIS)
    return (rank - hop) % n < rank


def _hop(step, hop: int, layout: AttentionLayout, *args):
    """`_hop_forward` or `_hop_backward` of one hop (their `_windowed_` namesakes under a local mask):
    chosen at run time by where the source sits under a causal mask; whole (as from an earlier rank)
    under a full one."""
    if layout.mask.local:
        step = partial({_hop_forward: _windowed_forward, _hop_backward: _windowed_backward}[step], hop=hop)
    if not layout.causal:
        return step(*args, layout=layout, past=True)
    return jax.lax.cond(
        _source_is_past(hop, layout.ring),
        partial(step, layout=layout, past=True),
        partial(step, layout=layout, past=False),
        *args,
    )


def _after_previous_hop(*values):
    """`values`, each ready only once all are. A hop's kernel and the next hop's transfer take their
    inputs through it with the previous hop's accumulators, so one hop's fp32 results and two hops'
    K/V are live at a time, and the backward's K/V are sent again rather than kept from the forward.
    Without it the compiler ran every hop's kernel as soon as its K/V arrived, holding each result
    until the chain of merges reached it, and under full remat reused the recomputed forward's
    transfers in the backward, holding every hop's K/V through it
    (docs/provenance/strategies_and_validation.md#ring)."""
    return jax.lax.optimization_barrier(values)


def _local_kernel(length: int, ids, layout: AttentionLayout) -> splash.Kernel:
    """The kernel of the rank's own block: causal, or full under the model's full mask."""
    return splash.block_kernel(length, length, layout.kernel, mask=layout.mask).with_segments(ids, ids)


def _own_forward(q, k, v, ids, layout: AttentionLayout):
    """The rank's own block: fp32 output and log-sum-exp."""
    if layout.mask.local:
        return _windowed_own_forward(q, k, v, ids, layout)
    out, lse = splash.attend_with_lse(_local_kernel(q.shape[1], ids, layout), q, k, v)
    return out.astype(jnp.float32), lse


def _own_backward(q, k, v, ids, out, lse, d_out, layout: AttentionLayout):
    """The rank's own block's (dq, dk, dv), fp32."""
    if layout.mask.local:
        return _windowed_own_backward(q, k, v, ids, out, lse, d_out, layout)
    local = _local_kernel(q.shape[1], ids, layout)
    return tuple(x.astype(jnp.float32) for x in splash.attend_bwd(local, q, k, v, out, lse, d_out))


def _forward(q, k, v, ids, layout: AttentionLayout):
    n, hops = layout.ring, layout.hops
    out, lse = _own_forward(q, k, v, ids, layout)
    arriving = _shift((k, v, ids), n) if hops else None
    for hop in range(1, hops + 1):
        q_now, out, lse, (k_now, v_now, kv_ids) = _after_previous_hop(q, out, lse, arriving)
        if hop < hops:
            arriving = _shift((k_now, v_now, kv_ids), n)  # travels during this hop's kernel
        out, lse = _hop(_hop_forward, hop, layout, q_now, k_now, v_now, ids, kv_ids, out, lse)
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
    n, hops = layout.ring, layout.hops
    dq, dk, dv = _own_backward(q, k, v, ids, out, lse, d_out, layout)
    arriving = _shift(_after_previous_hop(k, v, ids, d_out)[:3], n) if hops else None
    for hop in range(1, hops + 1):
        q_now, dq, (k_now, v_now, kv_ids) = _after_previous_hop(q, dq, arriving)
        if hop < hops:
            arriving = _shift((k_now, v_now, kv_ids), n)
        dk, dv = _shift((dk, dv), n)
        dq, dk, dv = _hop(_hop_backward, hop, layout, q_now, k_now, v_now, ids, kv_ids, out, lse, d_out, (dq, dk, dv))
    if n > 1 and hops:  # dK/dV of the source `hops` ranks back: home over the rest of the ring
        dk, dv = _shift((dk, dv), n, n - hops)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


ring_attention.defvjp(_ring_fwd, _ring_bwd)


def attention(
    q: jax.Array, k: jax.Array, v: jax.Array, layout: AttentionLayout, segment_ids: jax.Array | None = None
) -> jax.Array:
    """Attention of local `[batch, seq/N, heads, d]` blocks (q pre-scaled); `segment_ids` `[batch, seq/N]` or None."""
    out = ring_attention(fold_heads(q), fold_heads(k), fold_heads(v), segment_ids, layout)
    return unfold_heads(out, q.shape[0])
