"""cpu_mesh tier: a plan that offloads each layer's input to pinned host memory trains exactly as
the one that keeps it on device, and the runtime's jax policy offloads the layer's named input.
(On CPU jax lowers the offload to no copy; the deviceless TPU compile in bench_memory shows the
host-memory stacks and the HBM they free.)"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from cost_models.models import ModelSpec  # noqa: E402
from cost_models.remat import LAYER_INPUT  # noqa: E402
from cost_models.vocabulary import RematPolicy  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from runtime.model import remat_policy  # noqa: E402
from runtime.train import Trainer  # noqa: E402

pytestmark = pytest.mark.cpu_mesh
SEQ = 256
MODEL = ModelSpec("offload-test", 2, 64, 8, 2, 16, 128, 256)
STEPS = 2


def make_plan(placement: str) -> Plan:
    return Plan(
        model=MODEL,
        topology="cpu:8",
        seq_len=SEQ,
        global_batch=4,
        mesh=make_mesh(fsdp=4, tensor=2),
        remat="custom",
        remat_custom={LAYER_INPUT: placement, "query_proj": "device"},
        block_q=128,
        block_kv=128,
        param_dtype="float32",
        compute_dtype="float32",
    )


def losses(placement: str) -> list[float]:
    plan = make_plan(placement)
    trainer = Trainer(plan, build_mesh(plan, jax.devices()))
    params, opt_state = trainer.init(seed=0)
    sequences = np.random.default_rng(0).integers(0, MODEL.vocab, (plan.global_batch, SEQ + 1))
    batch = trainer.prepare_batch(sequences)
    out = []
    for _ in range(STEPS):
        params, opt_state, loss, _ = trainer.step(params, opt_state, *batch)
        out.append(float(loss))
    return out


def test_offloaded_layer_input_trains_to_the_same_loss():
    on_device, offloaded = losses("device"), losses("offload")
    np.testing.assert_allclose(offloaded, on_device, rtol=1e-5)
    assert on_device[-1] < on_device[0]  # it trains


def test_runtime_policy_offloads_the_named_layer_input():
    named = jax.make_jaxpr(lambda x: jax.ad_checkpoint.checkpoint_name(x, LAYER_INPUT))(np.ones(4)).eqns[0]
    decisions = {}
    for placement in ("device", "offload"):
        plan = make_plan(placement)
        policy = remat_policy(RematPolicy.CUSTOM, plan.remat_custom)
        decisions[placement] = policy(named.primitive, *(v.aval for v in named.invars), **named.params)
    assert type(decisions["offload"]).__name__ == "Offloadable"
    assert decisions["offload"].dst == "pinned_host"
    assert type(decisions["device"]).__name__ != "Offloadable"
