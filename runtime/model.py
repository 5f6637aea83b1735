"""A Llama-style decoder in flax, sized by a `ModelSpec`: sequential (Llama), parallel (MaxText) or Gemma 3's
blocks (four norms scaling by 1 + w, q/k norms, embeddings scaled by √hidden), q/k/v with or without biases
(Qwen2's), gated or plain MLP or a mixture of experts (`runtime.experts`), layers stacked with `nn.scan`
and rematerialised under MaxText's checkpoint names. Weights are ZeRO-3 sharded and gathered layer by
layer; the residual stream is split over the sequence, 'tensor' included (sequence parallelism);
attention is the plan's strategy, with each layer's mask: a model whose layers mix masks (local and
global) scans each layer's mask index with it and switches to that mask's attention (and RoPE, where local
layers turn at their own: Gemma 3's); a model of one mask runs it unconditionally.
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from cost_models.models import DecoderBlock
from cost_models.remat import LAYER_INPUT, MLP_INPUT_CHECKPOINTS, QKV_CHECKPOINTS, kept_names, offloaded_names
from cost_models.vocabulary import BATCH_AXES, SEQUENCE_AXES, RematPolicy
from cost_models.work_layout import MLP_CHUNK_TOKENS  # shared with the cost model
from planner.plan import Plan
from runtime.attention import sharded_attention
from runtime.experts import expert_weights, gather_weights, mixture
from runtime.layer_gradients import gradients_finished_per_layer
from runtime.layout import ACTIVATIONS, HEADS, WEIGHT_AXES
from runtime.rope import ROPE_THETA, Rope, rope

# the residual stream [batch, seq, embed]: sequence split over the context axes, then 'tensor'
RESIDUAL = P(BATCH_AXES, (*SEQUENCE_AXES, "tensor"), None)
RESIDUAL_TOKENS = P(BATCH_AXES, (*SEQUENCE_AXES, "tensor"))
EMBED_GROUP = (*WEIGHT_AXES, "tensor")  # the embedding table's embed dimension is split over these

# the MLP's activations by MaxText's names (linears._convert_to_activation_function)
ACTIVATION_FUNCTIONS = {"silu": nn.silu, "gelu": nn.gelu, "relu": nn.relu, "sigmoid": nn.sigmoid, "linear": lambda x: x}
MLP_INPUT_WEIGHTS = {2: ("w_gate", "w_up"), 1: ("w_in",)}  # gated or plain MLP

NORM_EPS = 1e-5
INIT_STD = 0.02


@dataclass(frozen=True)
class ModelConstants:
    """What a checkpoint fixes of the model's arithmetic beyond its `ModelSpec` (planning does not depend on
    it): RoPE's frequencies (the local layers' own where `local_rope` is given, Gemma 3's), the RMSNorms'
    epsilon, and the width the queries are scaled by (`query_pre_attn_scalar`, Gemma 3's; None: the head's);
    by default Llama 3's."""

    rope: Rope = Rope(theta=ROPE_THETA)
    norm_eps: float = NORM_EPS
    local_rope: Rope | None = None
    query_pre_attn_scalar: float | None = None

    def rope_of(self, mask) -> Rope:
        """The RoPE of the layers whose mask is `mask`: `local_rope` for a local mask where given, else `rope`."""
        return self.local_rope if mask.local and self.local_rope is not None else self.rope


def remat_policy(policy: RematPolicy, custom: tuple = ()):
    """The `jax.checkpoint` policy of a plan's remat policy (`custom`: its `remat_custom`): keep on
    device and offload to pinned host exactly what `cost_models.remat` prices; recompute the rest."""
    kept, offloaded = kept_names(policy, custom), offloaded_names(policy, custom)
    if offloaded:
        return jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=list(kept),
            names_which_can_be_offloaded=list(offloaded),
            offload_src="device",
            offload_dst="pinned_host",
        )
    return jax.checkpoint_policies.save_only_these_names(*kept) if kept else jax.checkpoint_policies.nothing_saveable


def _param(module: nn.Module, name: str, shape, spec: tuple, *, init=None, dtype):
    init = init or nn.initializers.normal(INIT_STD)
    return module.param(name, nn.with_partitioning(init, spec), shape, dtype)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float = NORM_EPS, *, offset: bool = False) -> jax.Array:
    """RMSNorm over the last axis in fp32, returned in x's dtype; scaled by `1 + scale` where `offset` (Gemma's)."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    scale = scale.astype(jnp.float32)
    return (normed * (1.0 + scale if offset else scale)).astype(x.dtype)


def embed_lookup(table: jax.Array, tokens: jax.Array, mesh: Mesh) -> jax.Array:
    """Embeddings of `[batch, seq]` tokens as `RESIDUAL`, from a table split on hidden over `EMBED_GROUP`.

    Each device looks up its group's tokens in its hidden slice and one all-to-all returns its own
    tokens' full vectors, so the table is never gathered and its gradient stays a shard.
    """

    def local(tab, tok):
        batch, length = tok.shape
        tok = jax.lax.all_gather(tok, "fsdp", axis=0, tiled=True)
        tok = jax.lax.all_gather(tok, (*SEQUENCE_AXES, "tensor"), axis=1, tiled=True)
        x = jnp.take(tab, tok, axis=0)  # [batch·fsdp, seq·cp·tensor, hidden/group]
        fsdp, shards = tok.shape[0] // batch, tok.shape[1] // length
        x = (
            x.reshape(fsdp, batch, shards, length, -1)
            .transpose(0, 2, 1, 3, 4)
            .reshape(fsdp * shards, batch, length, -1)
        )
        return jax.lax.all_to_all(x, EMBED_GROUP, split_axis=0, concat_axis=3, tiled=True)[0]

    return jax.shard_map(local, mesh=mesh, in_specs=(P(None, EMBED_GROUP), RESIDUAL_TOKENS), out_specs=RESIDUAL)(
        table, tokens
    )


def mlp_chunk(plan: Plan) -> int:
    """Tokens per MLP chunk on one device: `MLP_CHUNK_TOKENS`, or the device's tokens if fewer."""
    local = plan.tokens_per_device
    chunk = min(MLP_CHUNK_TOKENS, local)
    while local % chunk:
        chunk //= 2
    return chunk


def mlp_block(
    y: jax.Array, w_in: tuple[jax.Array, ...], w_out: jax.Array, *, activations: tuple[str, ...], plan: Plan, mesh: Mesh
) -> jax.Array:
    """MaxText's MlpBlock, act_0(y·w_in[0]) · act_1(y·w_in[1]) ⋯ · w_out, on `RESIDUAL` in and out:
    tensor-parallel, `y` gathered over 'tensor' and the output reduce-scattered (sequence parallelism).
    Each token chunk is its own checkpoint, so a policy that keeps no MLP output holds one chunk's
    intermediates in the backward, not the sequence's."""
    specs = _dense_mlp_specs(len(w_in))
    return _mlp_shard_map(y, (*w_in, w_out), specs, activations=activations, plan=plan, mesh=mesh, experts=False)


def expert_block(y: jax.Array, weights: dict[str, jax.Array], *, plan: Plan, mesh: Mesh) -> jax.Array:
    """`mlp_block` for a mixture-of-experts layer: `weights` by `runtime.experts.expert_weights`'s names,
    each device routing its own tokens (gathered over 'tensor') to every expert (`runtime.experts.mixture`)."""
    layout = expert_weights(plan.model)
    return _mlp_shard_map(
        y,
        tuple(weights[name] for name in layout),
        tuple(spec for _, spec in layout.values()),
        activations=plan.model.mlp_activations,
        plan=plan,
        mesh=mesh,
        experts=True,
    )


def _mlp_shard_map(y, weights: tuple, specs: tuple, *, activations, plan: Plan, mesh: Mesh, experts: bool):
    """A sequential block's MLP (`weights` laid out as `specs`) on `RESIDUAL` in and out."""

    def local(y, *weights):
        y = jax.lax.all_gather(y, "tensor", axis=1, tiled=True)
        return _scatter_tokens(_mlp_partial_sums(y, weights, activations=activations, plan=plan, experts=experts))

    return jax.shard_map(local, mesh=mesh, in_specs=(RESIDUAL, *specs), out_specs=RESIDUAL)(y, *weights)


# the MLP's weights as the shard_maps take them: each input projection, then the output projection
MLP_WEIGHT_SPECS = (P(WEIGHT_AXES, "tensor"), P(WEIGHT_AXES, "tensor"), P("tensor", WEIGHT_AXES))


def _dense_mlp_specs(inputs: int) -> tuple[P, ...]:
    """`MLP_WEIGHT_SPECS` of a dense MLP of `inputs` input projections and the output projection."""
    return (*MLP_WEIGHT_SPECS[:inputs], MLP_WEIGHT_SPECS[-1])


# the attention's weights: q, k, v `[hidden, heads, head_dim]` and out `[heads, head_dim, hidden]`
QKV_WEIGHT = P(WEIGHT_AXES, "tensor", None)
OUT_WEIGHT = P("tensor", None, WEIGHT_AXES)
# q, k, v's biases `[heads, head_dim]` (Qwen2's): their heads split over 'tensor' as the weights' are; whole
# over the weight axes, as each device adds them to its heads' outputs
QKV_BIAS = P("tensor", None)


def _scatter_tokens(partial_sums: jax.Array) -> jax.Array:
    """Inside a shard_map: row-parallel partial sums `[b, s, hidden]` reduce-scattered onto the residual's tokens."""
    return jax.lax.psum_scatter(partial_sums, "tensor", scatter_dimension=1, tiled=True)


def _out_projection(ctx: jax.Array, wo: jax.Array) -> jax.Array:
    """Inside a shard_map: the out projection's unreduced partial sums `[b, s, hidden]` of a device's heads.
    Gathering `wo` here keeps the partitioner from gathering the attention output over context instead
    (evidence: docs/provenance/runtime.md#model)."""
    wo = jax.lax.all_gather(wo, WEIGHT_AXES, axis=2, tiled=True)
    return jnp.einsum("bshk,hkd->bsd", ctx, wo)


def attention_out_projection(ctx: jax.Array, wo: jax.Array, *, mesh: Mesh) -> jax.Array:
    """A sequential block's row-parallel out projection, `HEADS` to `RESIDUAL`, named `out_proj`
    outside the shard_map so that jax saves the residual by that name."""

    def local(ctx, wo):
        return _scatter_tokens(_out_projection(ctx, wo))

    out = jax.shard_map(local, mesh=mesh, in_specs=(HEADS, OUT_WEIGHT), out_specs=RESIDUAL)(ctx, wo)
    return checkpoint_name(out, "out_proj")


def _mlp_partial_sums(
    y: jax.Array, weights: tuple, *, activations: tuple[str, ...], plan: Plan, experts: bool = False
) -> jax.Array:
    """Inside a shard_map: `mlp_block`'s (or, with `experts`, `expert_block`'s) unreduced partial sums
    `[b, s, hidden]` over the device's intermediate columns, in checkpointed token chunks. The weights are
    gathered over the weight-sharding group once, before the chunks; a mixture of experts routes each
    chunk's tokens on their own (routing is per token, so the chunks change nothing but what one holds)."""
    chunk = mlp_chunk(plan)
    policy = remat_policy(plan.remat, plan.remat_custom)
    functions = tuple(ACTIVATION_FUNCTIONS[name] for name in activations)
    if experts:
        gathered = gather_weights(dict(zip(expert_weights(plan.model), weights)), plan.model)

        def body(x):
            return mixture(x, gathered, experts=plan.model.experts, functions=functions)

    else:
        wi = [jax.lax.all_gather(v, WEIGHT_AXES, axis=0, tiled=True) for v in weights[:-1]]
        wo = jax.lax.all_gather(weights[-1], WEIGHT_AXES, axis=1, tiled=True)

        def body(x):
            activated = [
                act(checkpoint_name(x @ w, name)) for act, w, name in zip(functions, wi, MLP_INPUT_CHECKPOINTS)
            ]
            return checkpoint_name(functools.reduce(operator.mul, activated) @ wo, "mlpwo")

    out = jax.lax.map(jax.checkpoint(body, policy=policy), y.reshape(-1, chunk, y.shape[-1]))
    return out.reshape(y.shape)


# a parallel block's normed input, gathered over 'tensor' once, as each tensor shard's copy:
# [tensor, batch, seq, embed], so both branches read it and its gradient stays a partial sum
GATHERED_COPIES = P("tensor", *ACTIVATIONS)


def parallel_block_inputs(
    y: jax.Array, weights: tuple[jax.Array, ...], biases: tuple[jax.Array, ...] = (), *, mesh: Mesh
) -> tuple[jax.Array, ...]:
    """A parallel block's one all-gather over 'tensor' of its normed input `y` (`RESIDUAL`): returns
    `(q, k, v, gathered)`, q, k, v (`weights`, plus `biases` where given) before RoPE as `HEADS` and the
    input as `GATHERED_COPIES`. Its backward sums both branches' gradients and reduce-scatters them once."""

    def local(y, *arrays):
        y = jax.lax.all_gather(y, "tensor", axis=1, tiled=True)
        q, k, v = (
            jnp.einsum("bsd,dhk->bshk", y, jax.lax.all_gather(w, WEIGHT_AXES, axis=0, tiled=True)) for w in arrays[:3]
        )
        if arrays[3:]:
            q, k, v = (t + b for t, b in zip((q, k, v), arrays[3:]))
        return q, k, v, y[None]

    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(RESIDUAL, *(QKV_WEIGHT,) * 3, *(QKV_BIAS,) * len(biases)),
        out_specs=(HEADS, HEADS, HEADS, GATHERED_COPIES),
    )(y, *weights, *biases)


def parallel_block_outputs(
    gathered: jax.Array,
    ctx: jax.Array,
    wo: jax.Array,
    mlp_weights: tuple[jax.Array, ...],
    mlp_specs: tuple[P, ...],
    *,
    activations: tuple[str, ...],
    plan: Plan,
    mesh: Mesh,
    experts: bool = False,
) -> jax.Array:
    """A parallel block's out projection of `ctx` plus its MLP of `gathered` (`mlp_weights` laid out as
    `mlp_specs`; with `experts` a mixture of experts), summed and reduce-scattered over 'tensor' once,
    laid out as `RESIDUAL`."""

    def local(gathered, ctx, wo, *weights):
        attention_out = checkpoint_name(_out_projection(ctx, wo), "out_proj")
        mlp = _mlp_partial_sums(gathered[0], weights, activations=activations, plan=plan, experts=experts)
        return _scatter_tokens(attention_out + mlp)

    in_specs = (GATHERED_COPIES, HEADS, OUT_WEIGHT, *mlp_specs)
    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=RESIDUAL)(gathered, ctx, wo, *mlp_weights)


def layer_masks(plan: Plan) -> tuple:
    """The distinct masks of the model's layers, global first; a layer's mask index points into it."""
    return tuple(mask for mask, _ in plan.model.layer_masks)


def mask_indices(plan: Plan) -> jax.Array | None:
    """Each layer's index into `layer_masks`, scanned with the layers; None when every layer has one mask
    (so such a model's program has no switch)."""
    masks = layer_masks(plan)
    if len(masks) == 1:
        return None
    return jnp.asarray([masks.index(plan.model.layer_mask(i)) for i in range(plan.model.num_layers)], jnp.int32)


def layer_stacks(model) -> tuple[tuple[str, int, int, bool], ...]:
    """The decoder's layer stacks in the order they run: `(name, first layer, layers, experts)` each: one
    stack "layers" of every layer, or for a mixture of experts with a dense lead, "dense_layers" (its
    first `dense_layers` layers, dense MLPs) then "layers" (the rest, mixtures of experts)."""
    e = model.experts
    if e is None:
        return (("layers", 0, model.num_layers, False),)
    lead = (("dense_layers", 0, e.dense_layers, False),) if e.dense_layers else ()
    return (*lead, ("layers", e.dense_layers, model.num_layers - e.dense_layers, True))


class DecoderLayer(nn.Module):
    """One pre-norm decoder layer, sequential or parallel, its MLP dense or (`experts`) the model's
    mixture of experts; returns `(x, None)` for `nn.scan`."""

    plan: Plan
    mesh: Mesh
    experts: bool = False
    constants: ModelConstants = ModelConstants()

    def constrain(self, x, spec):
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    @nn.compact
    def __call__(self, x, positions, segment_ids=None, mask_index=None):
        m, plan = self.plan.model, self.plan
        # MaxText's name for the layer input: a policy that offloads it keeps only the host copy
        x = checkpoint_name(x, LAYER_INPUT)
        pdt, cdt = jnp.dtype(plan.param_dtype), jnp.dtype(plan.compute_dtype)
        w = lambda name, shape, spec, init=None: _param(self, name, shape, spec, init=init, dtype=pdt).astype(cdt)
        ones = nn.initializers.ones
        d, h, hd = m.hidden, m.num_heads, m.head_dim
        if m.decoder_block.parallel:
            return self.parallel_block(x, positions, segment_ids, w, mask_index), None
        if m.decoder_block is DecoderBlock.GEMMA3:
            return self.gemma3_block(x, positions, segment_ids, w, mask_index), None

        # the normed tokens of every tensor shard, gathered for the column-parallel projections
        eps = self.constants.norm_eps
        y = rms_norm(x, _param(self, "attn_norm", (d,), (None,), init=ones, dtype=pdt), eps)
        y = self.constrain(y, ACTIVATIONS)
        q, k, v = (jnp.einsum("bsd,dhk->bshk", y, weight) for weight in self.qkv_weights(w))
        if m.qkv_bias:
            q, k, v = (t + b for t, b in zip((q, k, v), self.qkv_biases(w)))
        ctx = self.attention(q, k, v, positions, segment_ids, mask_index, constrain_heads=True)
        out = attention_out_projection(ctx, w("wo", (h, hd, d), tuple(OUT_WEIGHT)), mesh=self.mesh)
        x = self.constrain(x + out, RESIDUAL)

        y = rms_norm(x, _param(self, "mlp_norm", (d,), (None,), init=ones, dtype=pdt), eps)
        weights, specs = self.mlp_weights(w)
        down = _mlp_shard_map(
            y, weights, specs, activations=m.mlp_activations, plan=plan, mesh=self.mesh, experts=self.experts
        )
        return self.constrain(x + down, RESIDUAL), None

    def qkv_weights(self, w):
        """`(wq, wk, wv)` in the compute dtype, each `[hidden, heads, head_dim]` as `QKV_WEIGHT`."""
        m = self.plan.model
        return tuple(
            w(name, (m.hidden, heads, m.head_dim), tuple(QKV_WEIGHT))
            for name, heads in (("wq", m.num_heads), ("wk", m.num_kv_heads), ("wv", m.num_kv_heads))
        )

    def qkv_biases(self, w):
        """`(bq, bk, bv)` in the compute dtype, each `[heads, head_dim]` as `QKV_BIAS`, starting at zero
        (created only for a model with `qkv_bias`, so that other models initialise as they always have)."""
        m = self.plan.model
        return tuple(
            w(name, (heads, m.head_dim), tuple(QKV_BIAS), init=nn.initializers.zeros)
            for name, heads in (("bq", m.num_heads), ("bk", m.num_kv_heads), ("bv", m.num_kv_heads))
        )

    def attention(self, q, k, v, positions, segment_ids, mask_index, *, constrain_heads: bool):
        """RoPE on q and k (each layer's mask's, `ModelConstants.rope_of`), then q, k, v named for the remat
        policy (after RoPE, as MaxText, so a kept q or k needs no RoPE again) and the plan's context-parallel
        attention, laid out as `HEADS`.

        `constrain_heads` lays q, k, v out as `HEADS` after RoPE: the sequential block needs it; the
        parallel block's are `HEADS` already (docs/provenance/runtime.md#model).
        """
        lay_out = (lambda t: self.constrain(t, HEADS)) if constrain_heads else (lambda t: t)
        ropes = [self.constants.rope_of(mask) for mask in layer_masks(self.plan)]

        def rotate(settings):
            return lambda q, k: (rope(q, positions, settings), rope(k, positions, settings))

        if len(set(ropes)) == 1:
            q, k = rotate(ropes[0])(q, k)
        else:  # local layers turn at frequencies of their own (Gemma 3's)
            q, k = jax.lax.switch(mask_index, [rotate(settings) for settings in ropes], q, k)
        q, k, v = (checkpoint_name(lay_out(t), name) for t, name in zip((q, k, v), QKV_CHECKPOINTS))
        # the output stays unnamed: the kernel saves it as ATTENTION_OUTPUT, and naming this layout
        # too would keep a second copy (MaxText keeps one)
        by_mask = [
            functools.partial(sharded_attention, plan=self.plan, mesh=self.mesh, segment_ids=segment_ids, mask=mask)
            for mask in layer_masks(self.plan)
        ]
        if len(by_mask) == 1:
            return by_mask[0](q, k, v)
        return jax.lax.switch(mask_index, by_mask, q, k, v)

    def mlp_weights(self, w):
        """`(weights, specs)` of the layer's MLP, the weights in the compute dtype: the dense MLP's input
        projections and `w_down`, laid out as `MLP_WEIGHT_SPECS`; or the mixture of experts' weights
        (`runtime.experts.expert_weights`, its biases starting at zero as MaxText's do)."""
        m = self.plan.model
        if self.experts:
            layout = expert_weights(m)
            weights = tuple(
                w(name, shape, tuple(spec), init=nn.initializers.zeros if name.endswith("_bias") else None)
                for name, (shape, spec) in layout.items()
            )
            return weights, tuple(spec for _, spec in layout.values())
        d, f = m.hidden, m.intermediate
        names = MLP_INPUT_WEIGHTS[m.mlp_inputs]
        w_in = tuple(w(name, (d, f), tuple(spec)) for name, spec in zip(names, MLP_WEIGHT_SPECS))
        return (*w_in, w("w_down", (f, d), tuple(MLP_WEIGHT_SPECS[-1]))), _dense_mlp_specs(len(w_in))

    def gemma3_block(self, x, positions, segment_ids, w, mask_index):
        """Gemma 3's sequential block: `x + norm(attention(norm(x)))`, then `+ norm(mlp(norm(...)))`, each norm
        scaled by `1 + w`; q and k normed per head before RoPE, and q scaled to `query_pre_attn_scalar`."""
        m, plan = self.plan.model, self.plan
        d, h, hd, eps = m.hidden, m.num_heads, m.head_dim, self.constants.norm_eps
        pdt = jnp.dtype(plan.param_dtype)

        def norm(name, t, width=d):
            scale = _param(self, name, (width,), (None,), init=nn.initializers.zeros, dtype=pdt)
            return rms_norm(t, scale, eps, offset=True)

        y = self.constrain(norm("attn_norm", x), ACTIVATIONS)
        q, k, v = (jnp.einsum("bsd,dhk->bshk", y, weight) for weight in self.qkv_weights(w))
        q, k = norm("q_norm", q, hd), norm("k_norm", k, hd)
        scalar = self.constants.query_pre_attn_scalar
        if scalar is not None and scalar != hd:  # the attention scales q by 1/√head_dim; Gemma 3's by 1/√scalar
            q = q * jnp.asarray(math.sqrt(hd / scalar), q.dtype)
        ctx = self.attention(q, k, v, positions, segment_ids, mask_index, constrain_heads=True)
        out = attention_out_projection(ctx, w("wo", (h, hd, d), tuple(OUT_WEIGHT)), mesh=self.mesh)
        x = self.constrain(x + norm("post_attn_norm", out), RESIDUAL)

        weights, specs = self.mlp_weights(w)
        down = _mlp_shard_map(
            norm("mlp_norm", x),
            weights,
            specs,
            activations=m.mlp_activations,
            plan=plan,
            mesh=self.mesh,
            experts=self.experts,
        )
        return self.constrain(x + norm("post_mlp_norm", down), RESIDUAL)

    def parallel_block(self, x, positions, segment_ids, w, mask_index):
        """MaxText's parallel block: `x + attention(y) + mlp(y)`, `y = norm(x)` gathered over 'tensor'
        once and the sum reduce-scattered once."""
        m, plan = self.plan.model, self.plan
        d, h, hd = m.hidden, m.num_heads, m.head_dim
        norm = _param(self, "attn_norm", (d,), (None,), init=nn.initializers.ones, dtype=jnp.dtype(plan.param_dtype))
        q, k, v, gathered = parallel_block_inputs(
            self.constrain(rms_norm(x, norm, self.constants.norm_eps), RESIDUAL),
            self.qkv_weights(w),
            self.qkv_biases(w) if m.qkv_bias else (),
            mesh=self.mesh,
        )
        ctx = self.attention(q, k, v, positions, segment_ids, mask_index, constrain_heads=False)
        summed = parallel_block_outputs(
            gathered,
            ctx,
            w("wo", (h, hd, d), tuple(OUT_WEIGHT)),
            *self.mlp_weights(w),
            activations=m.mlp_activations,
            plan=plan,
            mesh=self.mesh,
            experts=self.experts,
        )
        return self.constrain(x + summed, RESIDUAL)


class Llama(nn.Module):
    """The decoder; `__call__` returns the final normed hidden states and the output head weights."""

    plan: Plan
    mesh: Mesh
    constants: ModelConstants = ModelConstants()

    @nn.compact
    def __call__(
        self, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array]:
        """`[batch, seq]` tokens, their positions (per document when packed) and segment ids (or None),
        in the plan's token order, to `(hidden [batch, seq, hidden], head [hidden, vocab])` in the compute dtype."""
        m, plan = self.plan.model, self.plan
        pdt, cdt = jnp.dtype(plan.param_dtype), jnp.dtype(plan.compute_dtype)
        embed = _param(self, "embed", (m.vocab, m.hidden), (None, EMBED_GROUP), dtype=pdt)
        x = embed_lookup(embed.astype(cdt), tokens, self.mesh)
        gemma = m.decoder_block is DecoderBlock.GEMMA3
        if gemma:  # Gemma scales its embeddings by √hidden, in the compute dtype
            x = x * jnp.asarray(math.sqrt(m.hidden), cdt)
        layer = nn.remat(DecoderLayer, policy=remat_policy(plan.remat, plan.remat_custom), prevent_cse=False)
        offloads = bool(offloaded_names(plan.remat, plan.remat_custom))
        indices = mask_indices(plan)
        # Dense and mixture-of-experts layers hold different weights, and a scan's layers share one
        # structure, so a model with a dense lead has two stacks run one after the other: its first
        # `dense_layers` layers ("dense_layers"), then its expert layers ("layers"), each a loop of its own
        # (MaxText's DeepSeek decoder does the same). A model of one kind has the one stack "layers".
        for name, first, length, experts in layer_stacks(m):
            stacked = layer
            if offloads or length == 1:
                # no layer loop orders the gradients: the compiler peels an offloading step's layer loops,
                # and XLA inlines a loop of one trip
                stacked = gradients_finished_per_layer(layer, wait_for_cotangent=not offloads)
            # a mixed model's layers carry their mask index
            scanned = () if indices is None else (indices[first : first + length],)
            stack = nn.scan(
                stacked,
                variable_axes={"params": 0},
                split_rngs={"params": True},
                in_axes=(nn.broadcast, nn.broadcast, *(0 for _ in scanned)),
                length=length,
                metadata_params={nn.PARTITION_NAME: None},
            )
            x, _ = stack(plan, self.mesh, experts, self.constants, name=name)(x, positions, segment_ids, *scanned)
        init = nn.initializers.zeros if gemma else nn.initializers.ones  # Gemma's norms scale by 1 + w
        final_norm = _param(self, "final_norm", (m.hidden,), (None,), init=init, dtype=pdt)
        x = rms_norm(x, final_norm, self.constants.norm_eps, offset=gemma)
        if m.tie_embeddings:
            head = embed.T
        else:
            head = _param(self, "head", (m.hidden, m.vocab), (WEIGHT_AXES, "tensor"), dtype=pdt)
        return x, head.astype(cdt)


def param_specs(abstract_variables) -> dict:
    """PartitionSpecs of the (boxed) variables returned by `Llama.init` under `eval_shape`."""
    return nn.get_partition_spec(abstract_variables)
