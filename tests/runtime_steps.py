"""One training step of a plan on this host's virtual devices, for tests that compare a sharded
step with the one-device step (imported by the cpu_mesh tests; tests/conftest.py puts tests/ on the path)."""

import math

import jax
import numpy as np

from planner.plan import Plan, make_mesh
from runtime.mesh import build_mesh
from runtime.train import Trainer


def float32_plan(model, mesh, *, seq_len, batch, topology="cpu:8", strategy="none", remat="full", load_balance="none"):
    """`model` on `mesh` (axis sizes by name) in fp32 with splash blocks of 128: the plans whose sharded step
    the runtime tests compare with the one-device step."""
    return Plan(
        model=model,
        topology=topology,
        seq_len=seq_len,
        global_batch=batch,
        mesh=make_mesh(**mesh),
        cp_strategy=strategy,
        load_balance=load_balance,
        remat=remat,
        block_q=128,
        block_kv=128,
        param_dtype="float32",
        compute_dtype="float32",
    )


def one_step(plan):
    """The loss and the gradients of one step of `plan` from seed 0 on seeded random tokens."""
    trainer = Trainer(plan, build_mesh(plan, jax.devices()[: math.prod(plan.mesh_sizes)]))
    params, opt_state = trainer.init(seed=0)
    sequences = np.random.default_rng(0).integers(0, plan.model.vocab, (plan.global_batch, plan.seq_len + 1))
    _, _, loss, grads = trainer.step(params, opt_state, *trainer.prepare_batch(sequences))
    return float(loss), jax.device_get(grads)
