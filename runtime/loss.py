"""Next-token cross-entropy, chunked so the full logits never exist at once.

Runs under `shard_map`: each device gathers the output head over the weight-sharding axes,
keeps its vocabulary slice ('tensor'), and walks its local tokens in chunks of
`plan.loss_chunk_tokens` (0: one chunk). Each chunk's logits are recomputed in the backward
pass (`jax.checkpoint`), so peak memory is one chunk's logits, not tokens × vocabulary × 4 bytes.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from cost_models.errors import CpplanError
from cost_models.vocabulary import AXES
from planner.plan import Plan
from runtime.layout import ACTIVATIONS, TOKENS, WEIGHT_AXES


def loss_chunk(plan: Plan) -> int:
    """Tokens per cross-entropy chunk on one device.

    Raises:
        CpplanError: the chunk does not divide the device's tokens.
    """
    local = plan.global_batch * plan.seq_len // (plan.axis_size("data") * plan.axis_size("fsdp") * plan.cp_degree)
    chunk = plan.loss_chunk_tokens or local
    chunk = min(chunk, local)
    if local % chunk:
        raise CpplanError(f"loss_chunk_tokens={plan.loss_chunk_tokens} does not divide the {local} tokens each device "
                          f"holds; use a divisor of {local}.")
    return chunk


def _chunk_loss(hidden, targets, head):
    """Summed cross-entropy of one chunk: hidden `[c, d]`, targets `[c]`, head slice `[d, V/t]`."""
    logits = jnp.dot(hidden, head, preferred_element_type=jnp.float32)
    top = jax.lax.pmax(jax.lax.stop_gradient(logits.max(axis=-1)), "tensor")
    lse = jnp.log(jax.lax.psum(jnp.exp(logits - top[:, None]).sum(axis=-1), "tensor")) + top
    vocab_slice = logits.shape[-1]
    local = targets - jax.lax.axis_index("tensor") * vocab_slice
    inside = (local >= 0) & (local < vocab_slice)
    picked = jnp.take_along_axis(logits, jnp.clip(local, 0, vocab_slice - 1)[:, None], axis=-1)[:, 0]
    target_logit = jax.lax.psum(jnp.where(inside, picked, 0.0), "tensor")
    return jnp.sum(lse - target_logit)


def cross_entropy(hidden: jax.Array, head: jax.Array, targets: jax.Array, *, plan: Plan, mesh: Mesh) -> jax.Array:
    """Mean next-token cross-entropy over the global batch.

    Args:
        hidden: `[batch, seq, hidden]` final hidden states.
        head: `[hidden, vocab]` output projection.
        targets: `[batch, seq]` int32 next tokens (same token order as hidden).
        plan: gives the chunk size and shardings.
        mesh: the plan's mesh.
    Returns:
        A replicated fp32 scalar.
    """
    chunk = loss_chunk(plan)

    def local_loss(h, w, t):
        w = jax.lax.all_gather(w, WEIGHT_AXES, axis=0, tiled=True)
        h = h.reshape(-1, h.shape[-1])
        t = t.reshape(-1)
        n = h.shape[0] // chunk
        body = jax.checkpoint(_chunk_loss)
        sums = jax.lax.map(lambda xs: body(xs[0], xs[1], w), (h.reshape(n, chunk, -1), t.reshape(n, chunk)))
        total = sums.sum()
        # the chunk sums are already identical across 'tensor'; add up the token shards
        return jax.lax.psum(total, tuple(a for a in AXES if a != "tensor"))

    total = jax.shard_map(local_loss, mesh=mesh, in_specs=(ACTIVATIONS, P(WEIGHT_AXES, "tensor"), TOKENS),
                          out_specs=P())(hidden, head, targets)
    return total / (plan.global_batch * plan.seq_len)
