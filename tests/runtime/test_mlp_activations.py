"""cpu_mesh tier: the runtime's MLP as `ModelSpec.mlp_activations` says, gated or plain. The
sharded MLP (fsdp, tensor with sequence parallelism, token chunks, remat) equals a dense
one-device reference; a plain-MLP training step equals the one-device step; the parameters the
runtime creates are the ones the cost model counts."""

import dataclasses
import functools
import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from runtime_steps import float32_plan, one_step  # noqa: E402

from cost_models.models import ModelSpec  # noqa: E402
from cost_models.work_layout import weight_arrays_per_layer  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from runtime.model import ACTIVATION_FUNCTIONS, RESIDUAL, mlp_block  # noqa: E402
from runtime.train import Trainer  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

SEQ = 512
GATED = ModelSpec("mlp-test", 2, 64, 4, 2, 16, 96, 256)
PLAIN = dataclasses.replace(GATED, name="mlp-test-plain", mlp_activations=("relu",))


make_plan = functools.partial(float32_plan, seq_len=SEQ, batch=2)


def test_every_activation_cpplan_accepts_runs():
    from cost_models.models import MLP_ACTIVATIONS

    assert set(ACTIVATION_FUNCTIONS) == set(MLP_ACTIVATIONS)


@pytest.mark.parametrize(
    "activations,remat", [(("relu",), "minimal"), (("gelu",), "full"), (("gelu", "linear"), "save_dot_except_mlp")]
)
def test_sharded_mlp_equals_the_dense_mlp(monkeypatch, activations, remat):
    """Output and gradients (input and weights) of the MLP over fsdp 2 × tensor 2 × data 2, in
    chunks of 64 tokens, against act_0(x·wi_0) · ... · wo on one device."""
    monkeypatch.setattr("runtime.model.MLP_CHUNK_TOKENS", 64)  # several chunks per device
    model = dataclasses.replace(GATED, mlp_activations=activations)
    plan = make_plan(model, dict(data=2, fsdp=2, tensor=2), remat=remat, batch=4)
    mesh = build_mesh(plan)
    keys = jax.random.split(jax.random.PRNGKey(0), 2 + len(activations))
    d, f = model.hidden, model.intermediate
    y = jax.random.normal(keys[0], (plan.global_batch, SEQ, d))
    w_in = tuple(jax.random.normal(k, (d, f)) / math.sqrt(d) for k in keys[2:])
    w_out = jax.random.normal(keys[1], (f, d)) / math.sqrt(f)

    def sharded(y, w_in, w_out):
        y = jax.lax.with_sharding_constraint(y, jax.sharding.NamedSharding(mesh, RESIDUAL))
        return mlp_block(y, w_in, w_out, activations=activations, plan=plan, mesh=mesh)

    def dense(y, w_in, w_out):
        activated = [ACTIVATION_FUNCTIONS[a](y @ w) for a, w in zip(activations, w_in)]
        return math.prod(activated[1:], start=activated[0]) @ w_out

    def loss(fn):
        return jax.jit(jax.value_and_grad(lambda *args: (fn(*args) ** 2).mean(), argnums=(0, 1, 2)))

    want_out, want_grads = loss(dense)(y, w_in, w_out)
    got_out, got_grads = loss(sharded)(y, w_in, w_out)
    assert abs(float(got_out) - float(want_out)) <= 1e-5 * abs(float(want_out))
    for got, want in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
        assert np.abs(np.asarray(got) - np.asarray(want)).max() <= 1e-5 * np.abs(np.asarray(want)).max()
    # the check can fail: another activation gives another answer
    other = ("relu",) if activations != ("relu",) else ("gelu",)
    swapped = jax.jit(lambda *a: mlp_block(*a, activations=other * len(activations), plan=plan, mesh=mesh))
    assert np.abs(np.asarray(swapped(y, w_in, w_out)) - np.asarray(dense(y, w_in, w_out))).max() > 1e-3


def test_plain_mlp_training_step_equals_the_one_device_step():
    want_loss, want_grads = one_step(make_plan(PLAIN, {}, topology="cpu:1", batch=4, seq_len=256))
    loss, grads = one_step(make_plan(PLAIN, dict(fsdp=4, tensor=2), remat="minimal", batch=4, seq_len=256))
    assert abs(loss - want_loss) <= 1e-4 * abs(want_loss)
    assert jax.tree.structure(grads) == jax.tree.structure(want_grads)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max() + 1e-9


@pytest.mark.parametrize("model", [GATED, PLAIN], ids=["gated", "plain"])
def test_runtime_parameters_are_the_ones_the_cost_model_counts(model):
    plan = make_plan(model, {}, topology="cpu:1")
    trainer = Trainer(plan, build_mesh(plan, jax.devices()[:1]))
    leaves = jax.tree_util.tree_leaves_with_path(trainer.abstract_params)
    assert sum(math.prod(leaf.shape) for _, leaf in leaves) == model.num_params
    layer = [path for path, _ in leaves if "'layers'" in jax.tree_util.keystr(path)]
    assert len(layer) == weight_arrays_per_layer(model)
    # the checkpoint names the layer makes: a plain MLP's one input is mlpwi_0, and no mlpwi_1
    tokens = jnp.zeros((2, SEQ), jnp.int32)
    traced = str(jax.make_jaxpr(lambda p: trainer.model.apply(p, tokens, tokens))(trainer.abstract_params))
    assert "name=mlpwi_0" in traced and ("name=mlpwi_1" in traced) == model.gated
