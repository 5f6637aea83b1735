"""Context-parallel attention: one module per strategy, one entry point.

`context_attention(q, k, v, plan=..., mesh=...)` takes global `[batch, seq, heads, head_dim]`
arrays in natural token order and returns the attention output in the same layout, under the
mask of the plan's model (causal, or full where `ModelSpec.causal` is False); the
model calls `sharded_attention`, which expects tokens already in the plan's (load-balanced)
order. Both scale q by 1/sqrt(head_dim) once and run the plan's strategy under `shard_map`.
Both take optional `segment_ids` `[batch, seq]` of packed documents: a query then sees only
earlier keys (any key, under a full mask) of its own document. Every strategy carries them.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from cost_models.chips import ChipKind
from cost_models.errors import CpplanError
from cost_models.vocabulary import CPStrategy, LoadBalance
from planner.plan import Plan
from runtime.attention import all_gather, ring, single, ulysses, usp
from runtime.attention.base import AttentionLayout
from runtime.layout import HEADS, TOKENS, token_order
from runtime.splash import KernelConfig

STRATEGIES = {
    CPStrategy.NONE: single,
    CPStrategy.ALL_GATHER: all_gather,
    CPStrategy.ULYSSES: ulysses,
    CPStrategy.RING: ring,
    CPStrategy.USP: usp,
}


def attention_layout(plan: Plan, *, interpret: bool) -> AttentionLayout:
    """The static attention layout of a plan (splash in interpret mode on CPU)."""
    smem = plan.topology_spec.chip.smem_bytes if not interpret else 0
    return AttentionLayout(seq_len=plan.seq_len, ring=plan.axis_size("context"),
                           ulysses=plan.axis_size("context_ulysses"),
                           zigzag=plan.load_balance is LoadBalance.ZIGZAG,
                           kernel=KernelConfig(plan.block_q, plan.block_kv, interpret, smem), causal=plan.model.causal)


def is_interpret(mesh: Mesh) -> bool:
    """Splash runs in interpret mode on anything but TPU devices."""
    return mesh.devices.flat[0].platform != ChipKind.TPU.jax_platform


def sharded_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, plan: Plan, mesh: Mesh,
                      segment_ids: jax.Array | None = None) -> jax.Array:
    """Attention (under the model's mask) of global arrays whose tokens are already in the plan's order.

    Args:
        q: `[batch, seq, heads, head_dim]`.
        k: `[batch, seq, kv_heads, head_dim]`.
        v: like k.
        plan: the plan (strategy, mesh sizes, load balancing, blocks).
        mesh: the mesh built by `runtime.build_mesh(plan)`.
        segment_ids: `[batch, seq]` int32 document ids of packed sequences (same order), or None.
    Returns:
        `[batch, seq, heads, head_dim]`, sharded like q.
    """
    layout = attention_layout(plan, interpret=is_interpret(mesh))
    module = STRATEGIES[plan.cp_strategy]
    q = q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)
    if segment_ids is None:
        fn = jax.shard_map(lambda a, b, c: module.attention(a, b, c, layout), mesh=mesh,
                           in_specs=(HEADS, HEADS, HEADS), out_specs=HEADS, check_vma=False)
        return fn(q, k, v)
    fn = jax.shard_map(lambda a, b, c, ids: module.attention(a, b, c, layout, ids), mesh=mesh,
                       in_specs=(HEADS, HEADS, HEADS, TOKENS), out_specs=HEADS, check_vma=False)
    return fn(q, k, v, segment_ids.astype(jnp.int32))


def context_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, plan: Plan, mesh: Mesh,
                      segment_ids: jax.Array | None = None) -> jax.Array:
    """Attention (under the model's mask) of global arrays in natural token order, run as the plan says.

    Args:
        q: `[batch, seq, heads, head_dim]`, natural token order.
        k: `[batch, seq, kv_heads, head_dim]`.
        v: like k.
        plan: the plan; its seq_len must equal the arrays' sequence length.
        mesh: the mesh built by `runtime.build_mesh(plan)`.
        segment_ids: `[batch, seq]` int32 document ids of packed sequences, natural order, or None.
    Returns:
        `[batch, seq, heads, head_dim]` in natural token order.
    Raises:
        CpplanError: the arrays do not match the plan, or the plan cannot run.
    """
    if q.shape[1] != plan.seq_len or k.shape[1] != plan.seq_len:
        raise CpplanError(f"arrays have {q.shape[1]} tokens but the plan has seq_len={plan.seq_len}; "
                          f"make a plan for this length.")
    plan.check()
    order = token_order(plan.seq_len, plan.axis_size("context"), plan.load_balance is LoadBalance.ZIGZAG)
    inverse = jnp.asarray(order.argsort())
    order = jnp.asarray(order)
    q, k, v = (jnp.take(x, order, axis=1) for x in (q, k, v))
    if segment_ids is not None:
        segment_ids = jnp.take(segment_ids, order, axis=1)
    out = sharded_attention(q, k, v, plan=plan, mesh=mesh, segment_ids=segment_ids)
    return jnp.take(out, inverse, axis=1)
