"""One training step of a plan on this host's virtual devices, for tests that compare a sharded
step with the one-device step (imported by the cpu_mesh tests; tests/conftest.py puts tests/ on the path)."""

import math

import jax
import numpy as np

from runtime.mesh import build_mesh
from runtime.train import Trainer


def one_step(plan):
    """The loss and the gradients of one step of `plan` from seed 0 on seeded random tokens."""
    trainer = Trainer(plan, build_mesh(plan, jax.devices()[: math.prod(plan.mesh_sizes)]))
    params, opt_state = trainer.init(seed=0)
    sequences = np.random.default_rng(0).integers(0, plan.model.vocab, (plan.global_batch, plan.seq_len + 1))
    _, _, loss, grads = trainer.step(params, opt_state, *trainer.prepare_batch(sequences))
    return float(loss), jax.device_get(grads)
