"""cpu_mesh tier: a model mixing sliding-window and global layers (`layer_pattern="LG"`) trains each
layer with its own mask, and where the plan gives one, its local layers under their own strategy: its
sharded step equals the one-device step, and its local layers differ from a global-only model's."""

import dataclasses

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from runtime_steps import one_step  # noqa: E402

from cost_models import masks  # noqa: E402
from cost_models.models import ModelSpec  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from runtime.model import layer_masks, mask_indices  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

SEQ = 512
MIXED = ModelSpec("mixed-test", 2, 64, 4, 2, 16, 128, 256, window=100, layer_pattern="LG")


def make_plan(mesh, strategy, *, model=MIXED, zigzag=False, local_strategy=None):
    devices = int(np.prod(list(mesh.values()))) if mesh else 1
    return Plan(
        model=model,
        topology=f"cpu:{devices}",
        seq_len=SEQ,
        global_batch=1,
        mesh=make_mesh(**mesh),
        cp_strategy=strategy,
        local_strategy=local_strategy,
        load_balance="zigzag" if zigzag else "none",
        remat="full",
        block_q=128,
        block_kv=128,
        param_dtype="float32",
        compute_dtype="float32",
    )


@pytest.fixture(scope="module")
def single_device_step():
    return one_step(make_plan({}, "none"))


def test_each_layer_gets_its_mask():
    plan = make_plan({}, "none")
    assert layer_masks(plan) == (masks.CAUSAL, masks.sliding_window(100))
    assert mask_indices(plan).tolist() == [1, 0]  # layer 0 local, layer 1 global
    assert mask_indices(dataclasses.replace(plan, model=dataclasses.replace(MIXED, window=0, layer_pattern=""))) is None


def test_mixed_model_step_equals_one_device_step(single_device_step):
    # the layer switch between the masks' attentions, each under its own strategy on one mesh: the global
    # layers' all-gather and the local layers' one-hop ring (each strategy's local attention, the ring's
    # every hop included, has its own equivalence test)
    want_loss, want_grads = single_device_step
    loss, grads = one_step(make_plan(dict(context=4), "all_gather", local_strategy="ring"))
    assert abs(loss - want_loss) <= 1e-4 * abs(want_loss)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max() + 1e-9


def test_the_local_layers_mask_matters(single_device_step):
    global_only = dataclasses.replace(MIXED, window=0, layer_pattern="")
    loss, _ = one_step(make_plan({}, "none", model=global_only))
    assert abs(loss - single_device_step[0]) > 1e-6


def test_each_layer_runs_its_strategy():
    plan = make_plan(dict(context=4), "all_gather", local_strategy="ring")
    assert [plan.strategy_for(mask).value for mask in layer_masks(plan)] == ["all_gather", "ring"]
