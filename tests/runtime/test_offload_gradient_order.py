"""cpu_mesh tier: the layers of an offloading plan and of a one-layer plan hand their input's
gradient on only with their weights' gradients (runtime/layer_gradients.py), and the one-layer
plan that offloads nothing starts its backward only with its cotangent, without changing the
parameters or the gradients; a plan of more layers that offloads nothing is built as before. (The
HBM this saves shows only in a deviceless TPU compile: docs/memory_offload.md.)"""

import dataclasses
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("jax")
import jax  # noqa: E402
from jaxpr_equations import all_equations  # noqa: E402

from cost_models.models import ModelSpec  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from runtime.train import Trainer  # noqa: E402

pytestmark = pytest.mark.cpu_mesh
SEQ = 256
MODEL = ModelSpec("gradient-order-test", 2, 64, 8, 2, 16, 128, 256)


def trainer_for(remat: str, model: ModelSpec = MODEL) -> Trainer:
    plan = Plan(
        model=model,
        topology="cpu:8",
        seq_len=SEQ,
        global_batch=4,
        mesh=make_mesh(fsdp=4, tensor=2),
        remat=remat,
        block_q=128,
        block_kv=128,
        param_dtype="float32",
        compute_dtype="float32",
    )
    return Trainer(plan, build_mesh(plan, jax.devices()))


def gradients(trainer: Trainer):
    """The loss's gradients at seed 0's parameters, and how often each primitive appears in the
    gradient's program."""
    params, _ = trainer.init(seed=0)
    sequences = np.random.default_rng(0).integers(0, MODEL.vocab, (4, SEQ + 1))
    batch = trainer.prepare_batch(sequences)
    grad = jax.grad(trainer.loss)
    primitives = Counter(eqn.primitive.name for eqn in all_equations(jax.make_jaxpr(grad)(params, *batch).jaxpr))
    return jax.tree.map(np.asarray, jax.jit(grad)(params, *batch)), primitives


def assert_same_gradients(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=2e-4, atol=1e-6)


def test_offloading_layers_order_their_gradients_and_keep_their_values():
    saved, saved_primitives = gradients(trainer_for("save_qkv_proj"))
    offloaded, offloaded_primitives = gradients(trainer_for("qkv_proj_offloaded"))
    # of these 2-layer plans, the barrier is in the offloading one's backward only
    # one barrier, over the gradients: an offloading layer's backward does not wait for its cotangent
    assert offloaded_primitives["optimization_barrier"] == 1
    assert "optimization_barrier" not in saved_primitives
    # same parameter tree (same names, same initialisation) and the same gradients
    assert_same_gradients(offloaded, saved)


def test_a_one_layer_step_orders_its_gradients_and_keeps_their_values(monkeypatch):
    """XLA inlines a layer loop of one trip: the one layer gets the gradients' barrier whatever its
    policy (and, offloading nothing, the cotangent's), and its gradients are those of the same layer
    built without them."""
    one_layer = dataclasses.replace(MODEL, name="gradient-order-test-1l", num_layers=1)
    ordered, primitives = gradients(trainer_for("save_qkv_proj", one_layer))
    # two: the backward waits for its cotangent (a one-layer step offloading nothing), and the gradients
    assert primitives["optimization_barrier"] == 2
    monkeypatch.setattr("runtime.model.gradients_finished_per_layer", lambda layer, **_: layer)
    unordered, unordered_primitives = gradients(trainer_for("save_qkv_proj", one_layer))
    assert "optimization_barrier" not in unordered_primitives
    assert_same_gradients(ordered, unordered)
