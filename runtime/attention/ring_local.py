"""The ring's splash calls under a local mask (sliding window or chunks), for `ring.py`'s hop loop.

Each call attends some of the rank's queries to one contiguous run of a block's keys, its tables and
in-kernel mask from `cost_models.masks` at the call's offsets (`splash.mask_kernel`). Natural order: one
call per step (own block, then each past source). Zigzag (rank i holds chunks i and 2N−1−i): a call per
run of keys, the rank's queries in one call when both chunks may see it: own block, all queries × own
first chunk and second × second; a past source, all × its first chunk (its second lies after every
query); a later source, the second query chunk × each of its chunks. A query that sees no key of a call
gets no weight in the merge.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from runtime import splash
from runtime.attention.base import AttentionLayout
from runtime.layout import token_order

ALL = slice(None)


@dataclass(frozen=True)
class Call:
    """One splash call of a step: which local queries and keys, and per rank the queries' positions
    `[ranks, len]` and the first key's `[ranks]`."""

    q_part: slice
    kv_part: slice
    q_positions: np.ndarray
    kv_first: np.ndarray


def calls(layout: AttentionLayout, hop: int, past: bool) -> list[Call]:
    """The calls of step `hop` (0: the rank's own block) for ranks whose source is before them (`past`) or not."""
    n, block = layout.ring, layout.ring_block
    order = token_order(layout.seq_len, n, layout.zigzag).reshape(n, block)
    source = (np.arange(n) - hop) % n
    if not layout.zigzag:  # keys `hop` blocks back on every rank that runs it: one static table
        return [Call(ALL, ALL, order, order[:, 0] - hop * block)] if past else []
    half = block // 2
    first, second = slice(None, half), slice(half, None)
    key_runs = order[source, 0], order[source, half]
    if hop == 0:
        return [Call(ALL, first, order, key_runs[0]), Call(second, second, order[:, half:], key_runs[1])]
    if past:
        return [Call(ALL, first, order, key_runs[0])]
    return [Call(second, part, order[:, half:], start) for part, start in zip((first, second), key_runs)]


def _kernel(call: Call, kv_len: int, q_ids, kv_ids, layout: AttentionLayout) -> splash.Kernel:
    config = layout.kernel
    if layout.zigzag:  # a query block must not straddle the rank's two chunks
        config = dataclasses.replace(config, block_q=min(config.block_q, layout.ring_block // 2))
    rank = jax.lax.axis_index("context")
    kernel = splash.mask_kernel(
        layout.mask, call.q_positions, call.kv_first, kv_len, rank, config, seq_len=layout.seq_len
    )
    slice_ids = lambda ids, part: None if ids is None else ids[:, part]
    return kernel.with_segments(slice_ids(q_ids, call.q_part), slice_ids(kv_ids, call.kv_part))


def _merge(out, lse, out_h, lse_h):
    """`out`, `lse` merged by log-sum-exp with a call's; rows that saw no key (`lse` −inf, output NaN
    from splash's 0/0) add nothing."""
    new = jnp.logaddexp(lse, lse_h)
    safe = jnp.where(jnp.isfinite(new), new, 0.0)
    seen = jnp.where(jnp.isfinite(lse_h)[..., None], out_h.astype(jnp.float32), 0.0)
    return out * jnp.exp(lse - safe)[..., None] + seen * jnp.exp(lse_h - safe)[..., None], new


def forward(q, k, v, q_ids, kv_ids, out, lse, *, layout: AttentionLayout, hop: int, past: bool):
    """`out` (fp32) and `lse` merged with step `hop`'s calls."""
    for call in calls(layout, hop, past):
        qp, kp = call.q_part, call.kv_part
        kernel = _kernel(call, k[:, kp].shape[1], q_ids, kv_ids, layout)
        merged = _merge(out[:, qp], lse[:, qp], *splash.attend_with_lse(kernel, q[:, qp], k[:, kp], v[:, kp]))
        out, lse = out.at[:, qp].set(merged[0]), lse.at[:, qp].set(merged[1])
    return out, lse


def backward(q, k, v, q_ids, kv_ids, out, lse, d_out, grads, *, layout: AttentionLayout, hop: int, past: bool):
    """The fp32 accumulators `grads` = (dq, dk, dv) plus step `hop`'s calls' shares."""
    dq, dk, dv = grads
    for call in calls(layout, hop, past):
        qp, kp = call.q_part, call.kv_part
        kernel = _kernel(call, k[:, kp].shape[1], q_ids, kv_ids, layout)
        parts = splash.attend_bwd(kernel, q[:, qp], k[:, kp], v[:, kp], out[:, qp], lse[:, qp], d_out[:, qp])
        f32 = [h.astype(jnp.float32) for h in parts]
        dq, dk, dv = dq.at[:, qp].add(f32[0]), dk.at[:, kp].add(f32[1]), dv.at[:, kp].add(f32[2])
    return dq, dk, dv


def own_forward(q, k, v, ids, layout: AttentionLayout):
    """The rank's own block: fp32 output and log-sum-exp."""
    out = jnp.zeros(q.shape, jnp.float32)
    lse = jnp.full(q.shape[:2], -jnp.inf, jnp.float32)
    return forward(q, k, v, ids, ids, out, lse, layout=layout, hop=0, past=True)


def own_backward(q, k, v, ids, out, lse, d_out, layout: AttentionLayout):
    """The rank's own block's (dq, dk, dv), fp32."""
    zeros = tuple(jnp.zeros(x.shape, jnp.float32) for x in (q, k, v))
    return backward(q, k, v, ids, ids, out, lse, d_out, zeros, layout=layout, hop=0, past=True)
