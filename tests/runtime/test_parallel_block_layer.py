"""cpu_mesh tier: MaxText's parallel decoder block (`decoder_block=default`) as the runtime runs it.
A layer over fsdp × tensor (sequence parallelism) equals a dense one-device parallel block, output
and gradients, under remat; a training step equals the one-device step; and the tensor-parallel
collectives one layer makes, forward and backward, are the ones the cost model prices."""

import dataclasses
import functools
import math
import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from runtime_steps import float32_plan, one_step  # noqa: E402

from cost_models.models import DecoderBlock, ModelSpec  # noqa: E402
from cost_models.remat import remat_code, remat_table  # noqa: E402
from cost_models.vocabulary import RematPolicy  # noqa: E402
from cost_models.work_layout import tensor_collectives_per_layer, weight_arrays_per_layer  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from runtime.model import DecoderLayer, remat_policy, rms_norm, rope  # noqa: E402
from runtime.train import Trainer  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

SEQ = 128
SEQUENTIAL = ModelSpec("block-test", 2, 64, 4, 2, 16, 96, 256)
PARALLEL = dataclasses.replace(SEQUENTIAL, name="block-test-parallel", decoder_block="default")


# the runtime tests' fp32 plan, of this file's length and batch unless a test says otherwise
make_plan = functools.partial(float32_plan, seq_len=SEQ, batch=4)


def layer_of(plan, *, remat=True):
    layer = nn.remat(DecoderLayer, policy=remat_policy(plan.remat), prevent_cse=False) if remat else DecoderLayer
    return layer(plan, build_mesh(plan, jax.devices()[: math.prod(plan.mesh_sizes)]))


def dense_layer(params, x, positions, *, parallel):
    """One decoder layer on one device in plain jax: the parallel block, x + attn(n(x)) + mlp(n(x)), or
    (to show the check can fail) the sequential one with the same weights."""
    p = params

    def attention(y):
        q, k, v = (jnp.einsum("bsd,dhk->bshk", y, p[n]) for n in ("wq", "wk", "wv"))
        q, k = rope(q, positions), rope(k, positions)
        ctx = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return jnp.einsum("bshk,hkd->bsd", ctx, p["wo"])

    def mlp(y):
        return (jax.nn.silu(y @ p["w_gate"]) * (y @ p["w_up"])) @ p["w_down"]

    y = rms_norm(x, p["attn_norm"])
    if parallel:
        return x + attention(y) + mlp(y)
    h = x + attention(y)
    return h + mlp(rms_norm(h, p["attn_norm"]))


@pytest.mark.parametrize("remat", ["full", "minimal"])
def test_parallel_layer_equals_the_dense_parallel_block(remat):
    """Output and gradients (input and every weight) of one layer over fsdp 2 × tensor 2 × data 2
    against the dense block on one device, under two remat policies."""
    plan = make_plan(PARALLEL, dict(data=2, fsdp=2, tensor=2), remat=remat)
    layer = layer_of(plan)
    x = jax.random.normal(jax.random.PRNGKey(1), (plan.global_batch, SEQ, PARALLEL.hidden))
    positions = jnp.broadcast_to(jnp.arange(SEQ, dtype=jnp.int32), (plan.global_batch, SEQ))
    # weights 10× their initial scale, so each branch moves the output as much as the residual does
    params = jax.tree.map(lambda a: 10 * a, layer.init(jax.random.PRNGKey(0), x, positions))
    plain = nn.meta.unbox(params)["params"]
    assert sorted(plain) == ["attn_norm", "w_down", "w_gate", "w_up", "wk", "wo", "wq", "wv"]  # one norm

    def loss_sharded(p, x):
        return (layer.apply(p, x, positions)[0] ** 2).mean()

    def loss_dense(p, x, parallel=True):
        return (dense_layer(p, x, positions, parallel=parallel) ** 2).mean()

    got, got_grads = jax.jit(jax.value_and_grad(loss_sharded, argnums=(0, 1)))(params, x)
    want, want_grads = jax.jit(jax.value_and_grad(loss_dense, argnums=(0, 1)))(plain, x)
    assert abs(float(got) - float(want)) <= 1e-5 * abs(float(want))
    got_grads = (nn.meta.unbox(got_grads[0])["params"], got_grads[1])
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got_grads), jax.tree.leaves(want_grads)):
        assert np.abs(np.asarray(g) - np.asarray(w)).max() <= 1e-4 * np.abs(np.asarray(w)).max(), path
    # the check can fail: the sequential block with the same weights gives another answer
    assert abs(float(loss_dense(plain, x, parallel=False)) - float(want)) > 1e-3 * abs(float(want))


def test_parallel_block_training_step_equals_the_one_device_step():
    want_loss, want_grads = one_step(make_plan(PARALLEL, {}, topology="cpu:1"))
    loss, grads = one_step(make_plan(PARALLEL, dict(fsdp=4, tensor=2), remat="minimal"))
    assert abs(loss - want_loss) <= 1e-4 * abs(want_loss)
    assert jax.tree.structure(grads) == jax.tree.structure(want_grads)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max() + 1e-9


def test_runtime_parameters_are_the_ones_the_cost_model_counts():
    plan = make_plan(PARALLEL, {}, topology="cpu:1")
    trainer = Trainer(plan, build_mesh(plan, jax.devices()[:1]))
    leaves = jax.tree_util.tree_leaves_with_path(trainer.abstract_params)
    assert sum(math.prod(leaf.shape) for _, leaf in leaves) == PARALLEL.num_params
    assert PARALLEL.num_params == SEQUENTIAL.num_params - SEQUENTIAL.num_layers * SEQUENTIAL.hidden
    layer = [path for path, _ in leaves if "'layers'" in jax.tree_util.keystr(path)]
    assert len(layer) == weight_arrays_per_layer(PARALLEL) == weight_arrays_per_layer(SEQUENTIAL) - 1


COLLECTIVE = re.compile(r"\b(all_gather|reduce_scatter|psum_scatter|psum|all_to_all|ppermute)\[(.*?)\]", re.S)
OVER_TENSOR = re.compile(r"(axis_name|axes)=\('tensor',\)")


def one_layer(model, remat):
    """A layer on tensor 2 alone (no weight axis, no context), its parameters and input."""
    plan = make_plan(model, dict(tensor=2), remat=remat or "full", topology="cpu:2", batch=1)
    layer = layer_of(plan, remat=remat is not None)
    x = jax.random.normal(jax.random.PRNGKey(1), (1, SEQ, model.hidden))
    positions = jnp.broadcast_to(jnp.arange(SEQ, dtype=jnp.int32), (1, SEQ))
    params = layer.init(jax.random.PRNGKey(0), x, positions)
    step = jax.value_and_grad(lambda p, x: (layer.apply(p, x, positions)[0] ** 2).sum(), argnums=(0, 1))
    return step, params, x


def jaxpr_tensor_collectives(model, remat):
    """Collectives over 'tensor' in the program of one layer's forward and backward, as traced."""
    step, params, x = one_layer(model, remat)
    jaxpr = str(jax.make_jaxpr(step)(params, x))
    return sum(bool(OVER_TENSOR.search(m.group(2))) for m in COLLECTIVE.finditer(jaxpr))


@pytest.mark.parametrize("remat", [None, "full"])
def test_parallel_block_makes_the_tensor_collectives_the_cost_model_prices(remat):
    """The layer's forward and backward make `tensor_collectives_per_layer` collectives over
    'tensor' (4: one gather and one reduce-scatter, and their transposes), and under full remat
    the table's `recompute_tensor_collectives` more (the gather, for the recomputed forward)."""
    table = remat_table(PARALLEL).recompute_tensor_collectives
    repeated = 0 if remat is None else table[remat_code(RematPolicy(remat))]
    assert tensor_collectives_per_layer(PARALLEL) == 4 and repeated == (0 if remat is None else 1)
    assert jaxpr_tensor_collectives(PARALLEL, remat) == tensor_collectives_per_layer(PARALLEL) + repeated


def over_more_than_one_device(line: str) -> bool:
    """Whether an HLO collective's groups have more than one device here (tensor=2, every other
    axis 1): XLA of jax 0.10 lists groups (`{{0},{1}}` is two groups of one), XLA of jax 0.12
    names the mesh axes they span (`mesh[...] {'fsdp','context'}`)."""
    axes = re.search(r"replica_groups=mesh\[[^\]]*\] \{([^}]*)\}", line)
    return "'tensor'" in axes.group(1) if axes else "{{0},{1}}" not in line


def test_compiled_parallel_layer_adds_no_tensor_collectives():
    """What XLA compiles for the layer (sharding constraints included) moves over 'tensor' only
    the four collectives the runtime makes: two all-gathers and two reduce-scatters of the
    activations, the whole tensor group each."""
    step, params, x = one_layer(PARALLEL, None)
    hlo = jax.jit(step).lower(params, x).compile().as_text()
    kinds = [
        m.group(1)
        for line in hlo.splitlines()
        if over_more_than_one_device(line)
        for m in [
            re.search(
                r"= \S+ (all-gather|reduce-scatter|all-reduce|all-to-all|collective-permute)"
                r"(?:-start)?\(",
                line,
            )
        ]
        if m
    ]
    assert sorted(kinds) == ["all-gather"] * 2 + ["reduce-scatter"] * 2
    assert DecoderBlock.parse("parallel") is PARALLEL.decoder_block
