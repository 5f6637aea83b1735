"""A decoder layer's mixture-of-experts MLP on one device's tokens, as `cost_models.pricing.experts` prices
it: route (the router's matmul, softmax, top k), permute (each token copied once per chosen expert, the
copies sorted by expert), the grouped matmuls (`jax.lax.ragged_dot`, every expert over its group of
copies), unpermute and combine (the copies weighted and summed back per token), plus the shared experts
as one dense MLP. Every device routes its own tokens to every expert: the experts' weights are sharded
as the dense MLP's are (rows over the weight-sharding group, columns over 'tensor') and gathered per layer
inside it, so no token crosses a device. `runtime.model` runs it inside its MLP shard_map and chunk loop.

Routing is a documented choice: a softmax over every expert's logit, its top k kept and their weights
renormalised to sum to one, i.e. a softmax over the top k logits (Mixtral; Qwen3-MoE with
`norm_topk_prob`; GPT-OSS's softmax over its top-k logits). DeepSeek-V3's sigmoid scores, selection bias
and routed scaling are not this rule, and no load-balancing loss is added.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from cost_models.experts import Experts
from cost_models.models import ModelSpec
from cost_models.remat import MLP_INPUT_CHECKPOINTS
from runtime.layout import WEIGHT_AXES

# the dense MLP's input weights' names (gated or plain), reused for the experts' and the shared MLP's
INPUT_NAMES = {2: ("w_gate", "w_up"), 1: ("w_in",)}


def expert_weights(model: ModelSpec) -> dict[str, tuple[tuple[int, ...], P]]:
    """Every weight of a mixture-of-experts layer's MLP by name: its shape and how it is sharded.

    The routed experts' matrices are `[experts, hidden, intermediate]` (inputs) and `[experts, intermediate,
    hidden]` (output), each expert's slice sharded as the dense MLP's matrix (`runtime.model.MLP_WEIGHT_SPECS`):
    hidden over the weight-sharding group, intermediate over 'tensor'. The router `[hidden, experts]` has
    its rows over the weight-sharding group and every expert's column on each device (each device routes
    its own tokens). The shared experts are one dense MLP `shared × shared_width` wide. Biases (GPT-OSS):
    one per input column of each expert, one output row per expert (routed and shared), one per router
    column; the output rows are whole on every device, as the norms' scales are. Their sum is
    `ModelSpec.expert_mlp_params`.
    """
    e, d = model.experts, model.hidden
    f, shared = e.intermediate, e.shared * e.shared_width
    inputs = INPUT_NAMES[model.mlp_inputs]
    weights = {"router": ((d, e.count), P(WEIGHT_AXES, None))}
    weights.update({f"expert_{n}": ((e.count, d, f), P(None, WEIGHT_AXES, "tensor")) for n in inputs})
    weights["expert_w_down"] = ((e.count, f, d), P(None, "tensor", WEIGHT_AXES))
    if shared:
        weights.update({f"shared_{n}": ((d, shared), P(WEIGHT_AXES, "tensor")) for n in inputs})
        weights["shared_w_down"] = ((shared, d), P("tensor", WEIGHT_AXES))
    if e.bias:
        weights["router_bias"] = ((e.count,), P(None))
        weights.update({f"expert_{n}_bias": ((e.count, f), P(None, "tensor")) for n in inputs})
        weights["expert_w_down_bias"] = ((e.count, d), P(None, None))
        if shared:
            weights.update({f"shared_{n}_bias": ((shared,), P("tensor")) for n in inputs})
            weights["shared_w_down_bias"] = ((e.shared, d), P(None, None))
    return weights


def gather_weights(weights: dict[str, jax.Array], model: ModelSpec) -> dict[str, jax.Array]:
    """Inside a shard_map: the layer's expert weights (sharded as `expert_weights` says) with the rows
    split over the weight-sharding group gathered; 'tensor' columns stay split. Once per layer, before
    the chunk loop, as `runtime.model` gathers the dense MLP's."""
    specs = {name: spec for name, (_, spec) in expert_weights(model).items()}

    def gather(name, w):
        axis = next((i for i, axes in enumerate(specs[name]) if axes == WEIGHT_AXES), None)
        return w if axis is None else jax.lax.all_gather(w, WEIGHT_AXES, axis=axis, tiled=True)

    return {name: gather(name, w) for name, w in weights.items()}


def route(x: jax.Array, router: jax.Array, bias: jax.Array | None, *, per_token: int) -> tuple[jax.Array, jax.Array]:
    """Each token's experts and their weights: `x [tokens, hidden]` times the router `[hidden, experts]`
    (plus its bias) in fp32, the top `per_token` logits kept and softmaxed among themselves (the softmax
    over every expert renormalised over the top k). Returns `(weights fp32, experts int32)`, each
    `[tokens, per_token]`, the experts in falling order of logit (ties: the lower index first)."""
    logits = jnp.dot(x, router, preferred_element_type=jnp.float32)
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    top, chosen = jax.lax.top_k(logits, per_token)
    return jax.nn.softmax(top, axis=-1), chosen.astype(jnp.int32)


def permute(x: jax.Array, chosen: jax.Array, *, count: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Each token's copy per chosen expert, sorted by expert (stable: in token order within an expert).

    Returns:
        `(rows [tokens·k, hidden], order [tokens·k], group_sizes [count], row_experts [tokens·k])`:
        row i is the copy `order[i]` of the flattened `[tokens, k]` choices (token `order[i] // k`), of
        expert `row_experts[i]`; expert j's group is `group_sizes[j]` consecutive rows.
    """
    flat = chosen.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    rows = jnp.take(x, order // chosen.shape[1], axis=0)
    group_sizes = jnp.bincount(flat, length=count).astype(jnp.int32)
    return rows, order, group_sizes, jnp.take(flat, order)


def unpermute_and_combine(out: jax.Array, order: jax.Array, weights: jax.Array) -> jax.Array:
    """The grouped matmuls' rows `[tokens·k, hidden]` (in `permute`'s order) put back per token and choice,
    weighted by the router's `weights [tokens, k]` and summed per token (in fp32): `[tokens, hidden]`."""
    tokens, k = weights.shape
    back = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
    copies = jnp.take(out, back, axis=0).reshape(tokens, k, out.shape[-1])
    return jnp.einsum("tkd,tk->td", copies, weights.astype(copies.dtype), preferred_element_type=jnp.float32)


def _gated(
    project: Callable[[jax.Array], jax.Array],
    inputs: tuple,
    functions: tuple[Callable, ...],
) -> jax.Array:
    """act_0(x·wi_0 + b_0) · act_1(x·wi_1 + b_1) ⋯ with each projection named for the remat policy
    (MaxText's mlpwi_0, mlpwi_1): `project(w)` is the matmul, `inputs` (weight, bias or None) per input."""
    activated = []
    for act, (w, b), name in zip(functions, inputs, MLP_INPUT_CHECKPOINTS):
        h = project(w)
        activated.append(act(checkpoint_name(h if b is None else h + b, name)))
    return functools.reduce(operator.mul, activated)


def mixture(
    x: jax.Array, weights: dict[str, jax.Array], *, experts: Experts, functions: tuple[Callable, ...]
) -> jax.Array:
    """Inside a shard_map: one token chunk's mixture-of-experts MLP, `x [tokens, hidden]` to its unreduced
    partial sums `[tokens, hidden]` over the device's 'tensor' columns (`runtime.model` reduce-scatters
    them). `weights` are `gather_weights`'s; `functions` the activations, one per input projection.

    Output biases are added on the first 'tensor' shard only, so the scatter's sum counts them once.
    """
    inputs = INPUT_NAMES[len(functions)]
    first = (jax.lax.axis_index("tensor") == 0).astype(x.dtype)
    probabilities, chosen = route(x, weights["router"], weights.get("router_bias"), per_token=experts.per_token)
    rows, order, group_sizes, row_experts = permute(x, chosen, count=experts.count)

    def bias_rows(name):  # each sorted row's expert's bias
        b = weights.get(f"expert_{name}_bias")
        return None if b is None else jnp.take(b, row_experts, axis=0)

    hidden = _gated(
        lambda w: jax.lax.ragged_dot(rows, w, group_sizes),
        tuple((weights[f"expert_{n}"], bias_rows(n)) for n in inputs),
        functions,
    )
    out = jax.lax.ragged_dot(hidden, weights["expert_w_down"], group_sizes)
    if experts.bias:
        out = out + first * bias_rows("w_down")
    combined = unpermute_and_combine(out, order, probabilities).astype(x.dtype)
    if experts.shared:
        shared = _gated(
            lambda w: x @ w, tuple((weights[f"shared_{n}"], weights.get(f"shared_{n}_bias")) for n in inputs), functions
        )
        combined = combined + shared @ weights["shared_w_down"]
        if experts.bias:
            combined = combined + first * weights["shared_w_down_bias"].sum(axis=0)
    return checkpoint_name(combined, "mlpwo")
