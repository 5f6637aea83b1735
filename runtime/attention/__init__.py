"""Context-parallel attention: one module per strategy, run under `shard_map` with the model's mask.

`context_attention` takes tokens in natural order, `sharded_attention` (the model's entry) in the
plan's order; both scale q once and accept `segment_ids` of packed documents.
"""

from __future__ import annotations

import importlib
import math
from types import ModuleType

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from cost_models.chips import ChipKind
from cost_models.errors import CpplanError
from cost_models.masks import AttentionMask
from cost_models.vocabulary import CPStrategy, LoadBalance
from planner.plan import Plan
from runtime.attention.base import AttentionLayout
from runtime.layout import HEADS, TOKENS, token_order
from runtime.splash import KernelConfig

# strategy → the module whose `attention(q, k, v, layout, segment_ids=None)` runs it on one device's shard
IMPLEMENTATIONS: dict[CPStrategy, ModuleType] = {}


def implementation(strategy: CPStrategy) -> ModuleType:
    """The module running a strategy: registered in `IMPLEMENTATIONS`, else `runtime/attention/<name>.py`.

    Raises:
        CpplanError: the strategy has no runtime.
    """
    if strategy not in IMPLEMENTATIONS:
        try:
            IMPLEMENTATIONS[strategy] = importlib.import_module(f"{__name__}.{strategy.value}")
        except ModuleNotFoundError:
            raise CpplanError(
                f"cpplan's runtime has no attention for strategy {strategy.value!r} (no module "
                f"runtime/attention/{strategy.value}.py); plan with another strategy."
            ) from None
    return IMPLEMENTATIONS[strategy]


def model_mask(plan: Plan) -> AttentionMask:
    """The mask every layer of the plan's model has.

    Raises:
        CpplanError: the layers' masks differ (local and global layers): the caller names the layer's.
    """
    masks = [mask for mask, _ in plan.model.layer_masks]
    if len(masks) > 1:
        raise CpplanError(
            f"model {plan.model.name!r} mixes layer masks ({', '.join(m.describe() for m in masks)}); "
            f"pass the layer's mask (`plan.model.layer_mask(i)`)."
        )
    return masks[0]


def attention_layout(plan: Plan, *, interpret: bool, mask: AttentionMask | None = None) -> AttentionLayout:
    """The static attention layout of a plan (splash in interpret mode on CPU) for a layer with `mask`
    (None: the mask all the model's layers have)."""
    chip = plan.topology_spec.chip
    smem = chip.smem_bytes if not interpret else 0
    mask = mask or model_mask(plan)
    return AttentionLayout(
        seq_len=plan.seq_len,
        ring=plan.axis_size("context"),
        ulysses=plan.axis_size("context_ulysses"),
        zigzag=plan.load_balance is LoadBalance.ZIGZAG,
        kernel=KernelConfig(
            plan.block_q,
            plan.block_kv,
            interpret,
            smem,
            fused_backward=plan.runs_fused_backward(mask),
            cores=chip.cores_per_device,
            hbm_bytes=chip.hbm_bytes_per_device,
        ),
        mask=mask,
    )


def is_interpret(mesh: Mesh) -> bool:
    """Splash runs in interpret mode on anything but TPU devices."""
    return mesh.devices.flat[0].platform != ChipKind.TPU.jax_platform


def sharded_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    plan: Plan,
    mesh: Mesh,
    segment_ids: jax.Array | None = None,
    mask: AttentionMask | None = None,
) -> jax.Array:
    """Attention of global `[batch, seq, heads, head_dim]` q (k/v: kv_heads) already in the plan's
    token order, on `runtime.build_mesh(plan)`; `segment_ids` `[batch, seq]` or None; the layer's
    `mask` (None: the one every layer of the model has). Sharded like q.
    """
    layout = attention_layout(plan, interpret=is_interpret(mesh), mask=mask)
    module = implementation(plan.strategy_for(layout.mask))
    q = q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)
    if segment_ids is None:
        fn = jax.shard_map(
            lambda a, b, c: module.attention(a, b, c, layout),
            mesh=mesh,
            in_specs=(HEADS, HEADS, HEADS),
            out_specs=HEADS,
            check_vma=False,
        )
        return fn(q, k, v)
    fn = jax.shard_map(
        lambda a, b, c, ids: module.attention(a, b, c, layout, ids),
        mesh=mesh,
        in_specs=(HEADS, HEADS, HEADS, TOKENS),
        out_specs=HEADS,
        check_vma=False,
    )
    return fn(q, k, v, segment_ids.astype(jnp.int32))


def context_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    plan: Plan,
    mesh: Mesh,
    segment_ids: jax.Array | None = None,
    mask: AttentionMask | None = None,
) -> jax.Array:
    """Like `sharded_attention`, for arrays (and `segment_ids`) in natural token order; returns natural order.

    Raises:
        CpplanError: the arrays do not match the plan, or the plan cannot run.
    """
    if q.shape[1] != plan.seq_len or k.shape[1] != plan.seq_len:
        raise CpplanError(
            f"arrays have {q.shape[1]} tokens but the plan has seq_len={plan.seq_len}; make a plan for this length."
        )
    plan.check()
    order = token_order(plan.seq_len, plan.axis_size("context"), plan.load_balance is LoadBalance.ZIGZAG)
    inverse = jnp.asarray(order.argsort())
    order = jnp.asarray(order)
    q, k, v = (jnp.take(x, order, axis=1) for x in (q, k, v))
    if segment_ids is not None:
        segment_ids = jnp.take(segment_ids, order, axis=1)
    out = sharded_attention(q, k, v, plan=plan, mesh=mesh, segment_ids=segment_ids, mask=mask)
    return jnp.take(out, inverse, axis=1)
