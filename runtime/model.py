"""A Llama-style decoder in flax: RMSNorm, RoPE, grouped-query attention, and the model's MLP
(gated, SwiGLU by default, or plain: `ModelSpec.mlp_activations`, as MaxText's MlpBlock), joined
in the model's block (`ModelSpec.decoder_block`): sequential, as Llama's, or MaxText's parallel one
(attention and MLP read one normed input, gathered over 'tensor' once, and their outputs are
summed and reduce-scattered once).

Sized by a `ModelSpec`. Layers are stacked with `nn.scan` (one compiled layer, whatever the
depth) and rematerialised per the plan's policy with MaxText's checkpoint names. Weights carry
their mesh sharding (ZeRO-3 over ('fsdp', 'context', 'context_ulysses') on the embed dimension,
'tensor' on heads and MLP columns; the embedding table's embed dimension over all four); the
residual stream is pinned to batch × sequence shards, its sequence split over 'tensor' too
(sequence parallelism: norms, residual sums and the layer input each tensor shard keeps are a
tensor-th of the tokens, gathered before the column-parallel matmuls and reduce-scattered after
the row-parallel ones), so the weights are gathered layer by layer. Attention is the plan's
context-parallel strategy. Token positions are inputs: under zigzag they are the permuted
positions, so RoPE stays correct.
Packed rows add segment ids, which keep each document's attention to itself.
"""
from __future__ import annotations

import functools
import operator

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from cost_models.remat import LAYER_INPUT, MLP_INPUT_CHECKPOINTS, QKV_CHECKPOINTS, kept_names, offloaded_names
from cost_models.vocabulary import RematPolicy
from cost_models.work_layout import MLP_CHUNK_TOKENS  # shared with the cost model
from planner.plan import Plan
from runtime.attention import sharded_attention
from runtime.layer_gradients import gradients_finished_per_layer
from cost_models.vocabulary import BATCH_AXES, SEQUENCE_AXES
from runtime.layout import ACTIVATIONS, HEADS, WEIGHT_AXES

# the residual stream between the tensor-parallel matmuls: [batch, seq, embed], the sequence split
# over the context axes and then over tensor
RESIDUAL = P(BATCH_AXES, (*SEQUENCE_AXES, "tensor"), None)
RESIDUAL_TOKENS = P(BATCH_AXES, (*SEQUENCE_AXES, "tensor"))
# the devices the embedding table's embed dimension is split over
EMBED_GROUP = (*WEIGHT_AXES, "tensor")

# the MLP's activations by MaxText's names (linears._convert_to_activation_function: "linear" is
# the identity, any other name flax's function of that name), one for each of `MLP_ACTIVATIONS`
ACTIVATION_FUNCTIONS = {"silu": nn.silu, "gelu": nn.gelu, "relu": nn.relu, "sigmoid": nn.sigmoid,
                        "linear": lambda x: x}
# the parameters of the MLP's input projections: gated (gate, up) or plain
MLP_INPUT_WEIGHTS = {2: ("w_gate", "w_up"), 1: ("w_in",)}

ROPE_THETA = 500_000.0  # Llama 3
NORM_EPS = 1e-5
INIT_STD = 0.02

def remat_policy(policy: RematPolicy, custom: tuple = ()):
    """The jax checkpoint policy of a plan's remat policy: save on device and offload to pinned
    host memory exactly what the cost model's table says (`cost_models.remat.placements`, and the
    layer input's `layer_input_placement`), recompute the rest.

    Args:
        policy: the plan's policy.
        custom: the plan's `remat_custom` (under `custom`).
    Returns:
        A policy for `jax.checkpoint`.
    """
    kept, offloaded = kept_names(policy, custom), offloaded_names(policy, custom)
    if offloaded:
        return jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=list(kept), names_which_can_be_offloaded=list(offloaded),
            offload_src="device", offload_dst="pinned_host")
    return jax.checkpoint_policies.save_only_these_names(*kept) if kept else jax.checkpoint_policies.nothing_saveable


def _param(module: nn.Module, name: str, shape, spec: tuple, *, init=None, dtype):
    init = init or nn.initializers.normal(INIT_STD)
    return module.param(name, nn.with_partitioning(init, spec), shape, dtype)


def rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    """RMSNorm in fp32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + NORM_EPS)
    return (normed * scale.astype(jnp.float32)).astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array) -> jax.Array:
    """Rotary embedding (rotate-half form) of `[b, s, heads, d]` at integer `positions` `[b, s]`."""
    half = x.shape[-1] // 2
    freq = ROPE_THETA ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = positions.astype(jnp.float32)[..., None, None] * freq  # [b, s, 1, half]
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def embed_lookup(table: jax.Array, tokens: jax.Array, mesh: Mesh) -> jax.Array:
    """Embeddings of `[batch, seq]` tokens from a `[vocab, hidden]` table sharded on hidden over
    `EMBED_GROUP`, laid out as the residual stream (`RESIDUAL`).

    Each device looks up the tokens of its whole group in its own hidden slice, then one
    all-to-all hands every device its own tokens with the full hidden vector: the table is never
    gathered, and its gradient stays a shard.
    """
    def local(tab, tok):
        batch, length = tok.shape
        tok = jax.lax.all_gather(tok, "fsdp", axis=0, tiled=True)
        tok = jax.lax.all_gather(tok, (*SEQUENCE_AXES, "tensor"), axis=1, tiled=True)
        x = jnp.take(tab, tok, axis=0)  # [batch·fsdp, seq·cp·tensor, hidden/group]
        fsdp, shards = tok.shape[0] // batch, tok.shape[1] // length
        x = x.reshape(fsdp, batch, shards, length, -1).transpose(0, 2, 1, 3, 4).reshape(
            fsdp * shards, batch, length, -1)
        return jax.lax.all_to_all(x, EMBED_GROUP, split_axis=0, concat_axis=3, tiled=True)[0]

    return jax.shard_map(local, mesh=mesh, in_specs=(P(None, EMBED_GROUP), RESIDUAL_TOKENS), out_specs=RESIDUAL)(
        table, tokens)


def mlp_chunk(plan: Plan) -> int:
    """Tokens per MLP chunk on one device: `MLP_CHUNK_TOKENS`, or the device's tokens if fewer."""
    local = plan.global_batch * plan.seq_len // (plan.axis_size("data") * plan.axis_size("fsdp") * plan.cp_degree)
    chunk = min(MLP_CHUNK_TOKENS, local)
    while local % chunk:
        chunk //= 2
    return chunk


def mlp_block(y: jax.Array, w_in: tuple[jax.Array, ...], w_out: jax.Array, *, activations: tuple[str, ...],
              plan: Plan, mesh: Mesh) -> jax.Array:
    """The MLP as MaxText's MlpBlock computes it, act_0(x·wi_0) · act_1(x·wi_1) · ... then ·wo
    (gated with two activations, e.g. SwiGLU's silu and linear; plain with one), tensor-parallel
    over 'tensor', in chunks of the device's tokens: the input is all-gathered over 'tensor' first
    and the output reduce-scattered back (sequence parallelism).

    Each chunk is its own checkpoint under the plan's remat policy, so when the policy keeps no
    MLP output (full, save_dot_except_mlp) the backward holds one chunk's intermediates, not the
    whole sequence's; under minimal_with_context the named outputs are kept as the policy says.

    Args:
        y: `[batch, seq, hidden]` normed input, laid out as `RESIDUAL`.
        w_in: one `[hidden, intermediate]` input projection per activation.
        w_out: `[intermediate, hidden]`.
        activations: the activation of each input projection (`ModelSpec.mlp_activations`).
        plan: the plan (remat policy, shardings).
        mesh: the plan's mesh.
    Returns:
        `[batch, seq, hidden]`, laid out as `RESIDUAL`.
    """
    def local(y, *weights):
        y = jax.lax.all_gather(y, "tensor", axis=1, tiled=True)
        return _scatter_tokens(_mlp_partial_sums(y, weights, activations=activations, plan=plan))

    in_specs = (RESIDUAL, *MLP_WEIGHT_SPECS[:len(w_in)], MLP_WEIGHT_SPECS[-1])
    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=RESIDUAL)(y, *w_in, w_out)


# the MLP's weights as the shard_maps take them: each input projection, then the output projection
MLP_WEIGHT_SPECS = (P(WEIGHT_AXES, "tensor"), P(WEIGHT_AXES, "tensor"), P("tensor", WEIGHT_AXES))
# the attention's weights: q, k, v `[hidden, heads, head_dim]` and out `[heads, head_dim, hidden]`
QKV_WEIGHT = P(WEIGHT_AXES, "tensor", None)
OUT_WEIGHT = P("tensor", None, WEIGHT_AXES)


def _scatter_tokens(partial_sums: jax.Array) -> jax.Array:
    """Inside a shard_map: a row-parallel matmul's partial sums `[b, s, hidden]` over the device's
    slice of 'tensor', summed and reduce-scattered onto the residual's tokens (sequence parallelism)."""
    return jax.lax.psum_scatter(partial_sums, "tensor", scatter_dimension=1, tiled=True)


def _out_projection(ctx: jax.Array, wo: jax.Array) -> jax.Array:
    """Inside a shard_map: the attention's out projection of a device's heads `ctx` `[b, s, heads,
    head_dim]`, its `wo` shard gathered over the weight axes; returns the unreduced partial sums
    `[b, s, hidden]`. Gathering the weight here, not leaving the layout to XLA, is what keeps the
    partitioner from gathering the attention output over context instead (v5p, context × tensor)."""
    wo = jax.lax.all_gather(wo, WEIGHT_AXES, axis=2, tiled=True)
    return jnp.einsum("bshk,hkd->bsd", ctx, wo)


def attention_out_projection(ctx: jax.Array, wo: jax.Array, *, mesh: Mesh) -> jax.Array:
    """A sequential block's attention out projection, row-parallel over 'tensor': `wo` gathered
    over the weight axes, the partial sums reduce-scattered onto the residual's tokens, and the
    result named `out_proj` for the remat policy (outside the shard_map, so that jax reports the
    residual it saves by that name).

    Args:
        ctx: `[batch, seq, heads, head_dim]` attention output, laid out as `HEADS`.
        wo: `[heads, head_dim, hidden]`, laid out as `OUT_WEIGHT`.
        mesh: the plan's mesh.
    Returns:
        `[batch, seq, hidden]`, laid out as `RESIDUAL`.
    """
    def local(ctx, wo):
        return _scatter_tokens(_out_projection(ctx, wo))

    out = jax.shard_map(local, mesh=mesh, in_specs=(HEADS, OUT_WEIGHT), out_specs=RESIDUAL)(ctx, wo)
    return checkpoint_name(out, "out_proj")


def _mlp_partial_sums(y: jax.Array, weights: tuple, *, activations: tuple[str, ...], plan: Plan) -> jax.Array:
    """Inside a shard_map: the MLP of a device's gathered tokens `y` `[b, s, hidden]` over its
    slice of the intermediate columns, in chunks (`mlp_block`), the weights' shards gathered over
    the weight axes; returns the unreduced partial sums `[b, s, hidden]`."""
    chunk = mlp_chunk(plan)
    policy = remat_policy(plan.remat, plan.remat_custom)
    functions = [ACTIVATION_FUNCTIONS[name] for name in activations]
    wi = [jax.lax.all_gather(v, WEIGHT_AXES, axis=0, tiled=True) for v in weights[:-1]]
    wo = jax.lax.all_gather(weights[-1], WEIGHT_AXES, axis=1, tiled=True)

    def body(x):
        activated = [act(checkpoint_name(x @ w, name)) for act, w, name in zip(functions, wi, MLP_INPUT_CHECKPOINTS)]
        return checkpoint_name(functools.reduce(operator.mul, activated) @ wo, "mlpwo")

    out = jax.lax.map(jax.checkpoint(body, policy=policy), y.reshape(-1, chunk, y.shape[-1]))
    return out.reshape(y.shape)


# a parallel block's normed input, gathered over 'tensor' once, as each tensor shard's copy:
# [tensor, batch, seq, embed], so both branches read it and its gradient stays a partial sum
GATHERED_COPIES = P("tensor", *ACTIVATIONS)


def parallel_block_inputs(y: jax.Array, wq: jax.Array, wk: jax.Array, wv: jax.Array, *, mesh: Mesh
                          ) -> tuple[jax.Array, ...]:
    """A parallel block's one all-gather over 'tensor' of its normed input, and what both branches
    read of it: the q, k, v projections (heads split over 'tensor', before RoPE) and the gathered
    input itself, one copy per tensor shard (`GATHERED_COPIES`). Its backward sums the gradients
    of both branches on each device and reduce-scatters them once.

    Args:
        y: `[batch, seq, hidden]` normed input, laid out as `RESIDUAL`.
        wq: `[hidden, heads, head_dim]`; wk, wv: `[hidden, kv_heads, head_dim]`.
        mesh: the plan's mesh.
    Returns:
        `(q, k, v, gathered)`: q, k, v laid out as `HEADS`, gathered as `GATHERED_COPIES`.
    """
    def local(y, *weights):
        y = jax.lax.all_gather(y, "tensor", axis=1, tiled=True)
        q, k, v = (jnp.einsum("bsd,dhk->bshk", y, jax.lax.all_gather(w, WEIGHT_AXES, axis=0, tiled=True))
                   for w in weights)
        return q, k, v, y[None]

    return jax.shard_map(local, mesh=mesh, in_specs=(RESIDUAL, QKV_WEIGHT, QKV_WEIGHT, QKV_WEIGHT),
                         out_specs=(HEADS, HEADS, HEADS, GATHERED_COPIES))(y, wq, wk, wv)


def parallel_block_outputs(gathered: jax.Array, ctx: jax.Array, wo: jax.Array, w_in: tuple[jax.Array, ...],
                           w_out: jax.Array, *, activations: tuple[str, ...], plan: Plan, mesh: Mesh) -> jax.Array:
    """A parallel block's two branch outputs, summed and reduce-scattered over 'tensor' once: the
    attention's out projection and the MLP (as `mlp_block`, on the input `parallel_block_inputs`
    gathered).

    Args:
        gathered: the gathered normed input, laid out as `GATHERED_COPIES`.
        ctx: `[batch, seq, heads, head_dim]` attention output, laid out as `HEADS`.
        wo: `[heads, head_dim, hidden]`.
        w_in: one `[hidden, intermediate]` input projection per activation.
        w_out: `[intermediate, hidden]`.
        activations: the MLP's activations (`ModelSpec.mlp_activations`).
        plan: the plan (remat policy, shardings).
        mesh: the plan's mesh.
    Returns:
        `attention_out + mlp_out`, `[batch, seq, hidden]`, laid out as `RESIDUAL`.
    """
    def local(gathered, ctx, wo, *weights):
        attention_out = checkpoint_name(_out_projection(ctx, wo), "out_proj")
        return _scatter_tokens(attention_out + _mlp_partial_sums(gathered[0], weights, activations=activations,
                                                                  plan=plan))

    in_specs = (GATHERED_COPIES, HEADS, OUT_WEIGHT, *MLP_WEIGHT_SPECS[:len(w_in)], MLP_WEIGHT_SPECS[-1])
    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=RESIDUAL)(gathered, ctx, wo, *w_in, w_out)


class DecoderLayer(nn.Module):
    """One pre-norm decoder layer, sequential or parallel (`ModelSpec.decoder_block`); returns
    `(x, None)` for `nn.scan`."""

    plan: Plan
    mesh: Mesh

    def constrain(self, x, spec):
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    @nn.compact
    def __call__(self, x, positions, segment_ids=None):
        m, plan = self.plan.model, self.plan
        # MaxText's name for the layer input: a policy that offloads it keeps only the host copy for
        # the backward (the layer reads only the named value), else jax keeps the input on device
        x = checkpoint_name(x, LAYER_INPUT)
        pdt, cdt = jnp.dtype(plan.param_dtype), jnp.dtype(plan.compute_dtype)
        w = lambda name, shape, spec: _param(self, name, shape, spec, dtype=pdt).astype(cdt)
        ones = nn.initializers.ones
        d, h, hd = m.hidden, m.num_heads, m.head_dim
        if m.decoder_block.parallel:
            return self.parallel_block(x, positions, segment_ids, w), None

        # the normed tokens of every tensor shard, gathered for the column-parallel projections
        y = self.constrain(rms_norm(x, _param(self, "attn_norm", (d,), (None,), init=ones, dtype=pdt)), ACTIVATIONS)
        q, k, v = (jnp.einsum("bsd,dhk->bshk", y, weight) for weight in self.qkv_weights(w))
        ctx = self.attention(q, k, v, positions, segment_ids, constrain_heads=True)
        out = attention_out_projection(ctx, w("wo", (h, hd, d), tuple(OUT_WEIGHT)), mesh=self.mesh)
        x = self.constrain(x + out, RESIDUAL)

        y = rms_norm(x, _param(self, "mlp_norm", (d,), (None,), init=ones, dtype=pdt))
        down = mlp_block(y, *self.mlp_weights(w), activations=m.mlp_activations, plan=plan, mesh=self.mesh)
        return self.constrain(x + down, RESIDUAL), None

    def qkv_weights(self, w):
        """The attention's projections in the compute dtype: `(wq, wk, wv)`, each `[hidden, heads,
        head_dim]` (query or KV heads) laid out as `QKV_WEIGHT`."""
        m = self.plan.model
        return tuple(w(name, (m.hidden, heads, m.head_dim), tuple(QKV_WEIGHT))
                     for name, heads in (("wq", m.num_heads), ("wk", m.num_kv_heads), ("wv", m.num_kv_heads)))

    def attention(self, q, k, v, positions, segment_ids, *, constrain_heads: bool):
        """Both blocks' attention of the projected q, k, v: RoPE on q and k, then q, k, v named for
        the remat policy — after RoPE, as MaxText names them, so a kept q or k needs no RoPE again —,
        and the plan's context-parallel attention, whose kernel (or ring) saves its output as
        `ATTENTION_OUTPUT`.

        Args:
            q, k, v: `[batch, seq, heads, head_dim]` projections, before RoPE.
            positions: `[batch, seq]` the tokens' positions, for RoPE.
            segment_ids: `[batch, seq]` document ids of packed rows, or None.
            constrain_heads: lay q, k, v out as `HEADS` after RoPE. The sequential block's
                projections need it: constrained before RoPE instead, its all-gather step compiles
                to another program (v5p, context × tensor: FLOPs +0.04%). The parallel block's leave
                `parallel_block_inputs` as `HEADS` already, and constraining them again changes its
                compiled Ulysses step (the saved residuals' layouts).
        Returns:
            `[batch, seq, heads, head_dim]`, laid out as `HEADS`.
        """
        lay_out = (lambda t: self.constrain(t, HEADS)) if constrain_heads else (lambda t: t)
        q, k, v = (checkpoint_name(lay_out(t), name)
                   for t, name in zip((rope(q, positions), rope(k, positions), v), QKV_CHECKPOINTS))
        # the output is left unnamed: naming this layout of the saved residual too would keep a
        # second copy (MaxText keeps one). The backward lays the saved one out again for the out
        # projection's weight gradient: a local relayout, or behind Ulysses/USP the output
        # all-to-all once more (priced in `cost_models.strategies.ulysses.all_to_all_cost`)
        return sharded_attention(q, k, v, plan=self.plan, mesh=self.mesh, segment_ids=segment_ids)

    def mlp_weights(self, w):
        """The MLP's parameters in the compute dtype: `(input projections, output projection)`, laid
        out as `MLP_WEIGHT_SPECS` (gated: w_gate, w_up; plain: w_in; then w_down)."""
        d, f = self.plan.model.hidden, self.plan.model.intermediate
        names = MLP_INPUT_WEIGHTS[self.plan.model.mlp_inputs]
        w_in = tuple(w(name, (d, f), tuple(spec)) for name, spec in zip(names, MLP_WEIGHT_SPECS))
        return w_in, w("w_down", (f, d), tuple(MLP_WEIGHT_SPECS[-1]))

    def parallel_block(self, x, positions, segment_ids, w):
        """MaxText's parallel block (`decoder_block=default`): `x + attention(y) + mlp(y)` with
        `y = norm(x)`, gathered over 'tensor' once for both branches and their sum
        reduce-scattered once (`parallel_block_inputs`, `parallel_block_outputs`)."""
        m, plan = self.plan.model, self.plan
        d, h, hd = m.hidden, m.num_heads, m.head_dim
        norm = _param(self, "attn_norm", (d,), (None,), init=nn.initializers.ones, dtype=jnp.dtype(plan.param_dtype))
        q, k, v, gathered = parallel_block_inputs(self.constrain(rms_norm(x, norm), RESIDUAL), *self.qkv_weights(w),
                                                  mesh=self.mesh)
        ctx = self.attention(q, k, v, positions, segment_ids, constrain_heads=False)
        summed = parallel_block_outputs(gathered, ctx, w("wo", (h, hd, d), tuple(OUT_WEIGHT)), *self.mlp_weights(w),
                                        activations=m.mlp_activations, plan=plan, mesh=self.mesh)
        return self.constrain(x + summed, RESIDUAL)


class Llama(nn.Module):
    """The decoder; `__call__` returns the final normed hidden states and the output head weights."""

    plan: Plan
    mesh: Mesh

    @nn.compact
    def __call__(self, tokens: jax.Array, positions: jax.Array,
                 segment_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Args:
            tokens: `[batch, seq]` int32, in the plan's token order.
            positions: `[batch, seq]` the tokens' positions in the sequence (in their document, when packed).
            segment_ids: `[batch, seq]` int32 document ids of packed rows, same order, or None.
        Returns:
            `(hidden [batch, seq, hidden] in the compute dtype, head [hidden, vocab] in the compute dtype)`.
        """
        m, plan = self.plan.model, self.plan
        pdt, cdt = jnp.dtype(plan.param_dtype), jnp.dtype(plan.compute_dtype)
        embed = _param(self, "embed", (m.vocab, m.hidden), (None, EMBED_GROUP), dtype=pdt)
        x = embed_lookup(embed.astype(cdt), tokens, self.mesh)
        layer = nn.remat(DecoderLayer, policy=remat_policy(plan.remat, plan.remat_custom), prevent_cse=False)
        offloads = bool(offloaded_names(plan.remat, plan.remat_custom))
        if offloads or m.num_layers == 1:
            # no layer loop orders the gradients: the compiler peels an offloading step's layer loops,
            # and XLA inlines a loop of one trip
            layer = gradients_finished_per_layer(layer, wait_for_cotangent=not offloads)
        stack = nn.scan(layer, variable_axes={"params": 0}, split_rngs={"params": True},
                        in_axes=(nn.broadcast, nn.broadcast), length=m.num_layers,
                        metadata_params={nn.PARTITION_NAME: None})
        x, _ = stack(plan, self.mesh, name="layers")(x, positions, segment_ids)
        x = rms_norm(x, _param(self, "final_norm", (m.hidden,), (None,), init=nn.initializers.ones, dtype=pdt))
        if m.tie_embeddings:
            head = embed.T
        else:
            head = _param(self, "head", (m.hidden, m.vocab), (WEIGHT_AXES, "tensor"), dtype=pdt)
        return x, head.astype(cdt)


def param_specs(abstract_variables) -> dict:
    """PartitionSpecs of the (boxed) variables returned by `Llama.init` under `eval_shape`."""
    return nn.get_partition_spec(abstract_variables)
