"""Next-token cross-entropy, fused and chunked so neither the logits nor the gathered head exist whole.

Under `shard_map` the head is gathered one vocabulary piece at a time, each piece walking the device's
tokens in chunks with a running max, sum of exponentials and target logit; a custom VJP walks the
pieces again. Negative targets (`IGNORED_TARGET`) count for nothing; the mean is over the rest.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from cost_models.errors import CpplanError
from cost_models.vocabulary import AXES
from cost_models.work_layout import vocab_pieces  # shared with the cost model
from planner.plan import Plan
from runtime.layout import ACTIVATIONS, TOKENS, WEIGHT_AXES


def loss_chunk(plan: Plan) -> int:
    """Tokens per cross-entropy chunk on one device.

    Raises:
        CpplanError: the chunk does not divide the device's tokens.
    """
    local = plan.tokens_per_device
    chunk = min(plan.loss_chunk_tokens or local, local)
    if local % chunk:
        raise CpplanError(
            f"loss_chunk_tokens={plan.loss_chunk_tokens} does not divide the {local} tokens each device "
            f"holds; use a divisor of {local}."
        )
    return chunk


def _piece(w, j, size):
    """Head columns `[j·size, (j+1)·size)` of the local vocabulary slice, gathered to full hidden."""
    return jax.lax.all_gather(jax.lax.dynamic_slice_in_dim(w, j * size, size, axis=1), WEIGHT_AXES, axis=0, tiled=True)


def _targets_in_piece(targets, j, size, vocab_slice):
    """Target index inside piece j (clipped) and whether the target falls in it."""
    local = targets - (jax.lax.axis_index("tensor") * vocab_slice + j * size)
    return jnp.clip(local, 0, size - 1), (local >= 0) & (local < size)


TOKEN_AXES = tuple(a for a in AXES if a != "tensor")


def _vary(x, axes):
    """Marks a fresh array as varying over `axes` too (scan carries must keep their type under shard_map)."""
    return jax.lax.pcast(x, axes, to="varying")


def _statistics(h, w, t, pieces):
    """Per-token log-sum-exp over the whole vocabulary and target logit; h `[n, c, d]`, t `[n, c]`."""
    vocab_slice = w.shape[1]
    size = vocab_slice // pieces

    def piece_step(carry, j):
        wj = _piece(w, j, size)

        def chunk_step(_, xs):
            hi, ti, top, total, target = xs
            logits = jnp.dot(hi, wj, preferred_element_type=jnp.float32)
            new_top = jnp.maximum(top, logits.max(axis=-1))
            total = total * jnp.exp(top - new_top) + jnp.exp(logits - new_top[:, None]).sum(axis=-1)
            index, inside = _targets_in_piece(ti, j, size, vocab_slice)
            picked = jnp.take_along_axis(logits, index[:, None], axis=-1)[:, 0]
            return None, (new_top, total, target + jnp.where(inside, picked, 0.0))

        _, carry = jax.lax.scan(chunk_step, None, (h, t, *carry))
        return carry, None

    # t varies over the token axes; the statistics also vary over 'tensor' (the vocabulary slice)
    init = tuple(_vary(jnp.full_like(t, v, jnp.float32), ("tensor",)) for v in (-jnp.inf, 0.0, 0.0))
    (top, total, target), _ = jax.lax.scan(piece_step, init, jnp.arange(pieces))
    global_top = jax.lax.pmax(top, "tensor")
    lse = jnp.log(jax.lax.psum(total * jnp.exp(top - global_top), "tensor")) + global_top
    return lse, jax.lax.psum(target, "tensor")


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fused_loss(h, w, t, pieces):
    lse, target = _statistics(h, w, t, pieces)
    return jnp.sum(jnp.where(t >= 0, lse - target, 0.0))


def _fused_fwd(h, w, t, pieces):
    lse, target = _statistics(h, w, t, pieces)
    return jnp.sum(jnp.where(t >= 0, lse - target, 0.0)), (h, w, t, lse)


def _fused_bwd(pieces, residuals, g):
    h, w, t, lse = residuals
    vocab_slice = w.shape[1]
    size = vocab_slice // pieces

    def piece_step(carry, j):
        dh, dw = carry
        wj = _piece(w, j, size)

        def chunk_step(dwj, xs):
            hi, ti, lse_i = xs
            p = jnp.exp(jnp.dot(hi, wj, preferred_element_type=jnp.float32) - lse_i[:, None])
            index, inside = _targets_in_piece(ti, j, size, vocab_slice)
            onehot = (jnp.arange(size)[None, :] == index[:, None]) & inside[:, None]
            dz = (jnp.where(ti[:, None] >= 0, g, 0.0) * (p - onehot)).astype(hi.dtype)
            dwj = dwj + jnp.dot(hi.T, dz, preferred_element_type=jnp.float32)
            return dwj, jnp.dot(dz, wj.T, preferred_element_type=jnp.float32).astype(hi.dtype)

        dwj, dh_piece = jax.lax.scan(chunk_step, _vary(jnp.zeros(wj.shape, jnp.float32), AXES), (h, t, lse))
        # back to this device's shard, summed over the data-parallel replicas that share it
        shard = jax.lax.psum(jax.lax.psum_scatter(dwj, WEIGHT_AXES, scatter_dimension=0, tiled=True), "data")
        # written into the head's own layout: stacked by piece, the compiler would move the head and
        # both moments into that layout for the update (evidence: docs/provenance/runtime.md#loss)
        return (dh + dh_piece, jax.lax.dynamic_update_slice_in_dim(dw, shard.astype(w.dtype), j * size, axis=1)), None

    (dh, dw), _ = jax.lax.scan(
        piece_step, (_vary(jnp.zeros_like(h), ("tensor",)), jnp.zeros_like(w)), jnp.arange(pieces)
    )
    # every vocabulary slice ('tensor') contributed to dh; h is the same on all of them
    return jax.lax.psum(dh, "tensor"), dw, None


_fused_loss.defvjp(_fused_fwd, _fused_bwd)


def cross_entropy(hidden: jax.Array, head: jax.Array, targets: jax.Array, *, plan: Plan, mesh: Mesh) -> jax.Array:
    """Mean cross-entropy of `hidden` `[batch, seq, hidden]` times `head` `[hidden, vocab]` over the
    non-negative `targets` `[batch, seq]`, as a replicated fp32 scalar."""
    chunk = loss_chunk(plan)
    pieces = vocab_pieces(plan.model.vocab // plan.axis_size("tensor"))

    def local_loss(h, w, t):
        h = h.reshape(-1, chunk, h.shape[-1])
        total = _fused_loss(h, w, t.reshape(-1, chunk), pieces)
        return jax.lax.psum(total, TOKEN_AXES)

    total = jax.shard_map(
        local_loss, mesh=mesh, in_specs=(ACTIVATIONS, P(WEIGHT_AXES, "tensor"), TOKENS), out_specs=P()
    )(hidden, head, targets)
    # at least one: a batch whose every target crosses a document has loss 0, not NaN
    return total / jnp.maximum(jnp.sum(targets >= 0), 1).astype(jnp.float32)
