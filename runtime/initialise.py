"""The programs that create a plan's random weights and its optimizer's state on the devices, one per
layout: plans whose parameters are laid out alike (the same model, shapes, dtypes and shardings, as a plan
and its splash-block, backward or remat variants are) share one program rather than each compiling its
own (on a TPU v5e chip about 10 s a plan). Flax seeds each weight from its path in the model, so the
program of one such plan gives every other the weights its own would.

Programs are kept by their layout (the last `KEEP` layouts); `prepare_initialisers` compiles them ahead
of the first run, as the step is, and a run's `Trainer.init` calls them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from runtime.compile import plan_compiler_options
from runtime.tracing import TRACING, lowered_then_compiled

KEEP = 8  # layouts whose programs are kept: a validation's plans come in runs of a few layouts

_programs: OrderedDict = OrderedDict()
_lock = threading.Lock()  # a plan's compile ahead runs in a thread beside the run of the one before


def init_variables(model, rng):
    """Flax's (boxed) variables of `model` (a `runtime.model.Llama`), as its plan's batch shape starts them."""
    shape = (model.plan.global_batch, model.plan.seq_len)
    return model.init(rng, jnp.zeros(shape, jnp.int32), jnp.zeros(shape, jnp.int32))


def initial_params(model, rng):
    """The weights of `model`, plain arrays, from the key `rng`."""
    return nn.meta.unbox(init_variables(model, rng))


def initial_opt_state(optimizer, params):
    """The state of `optimizer` (an optax transformation) for `params`."""
    return optimizer.init(params)


def _layout(tree) -> tuple:
    """What a program's outputs are: the tree's structure and each leaf's shape, dtype and sharding."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((leaf.shape, jnp.dtype(leaf.dtype), leaf.sharding) for leaf in leaves)


class _Kept:
    """A program made once, when first asked for: under a lock of its own, so that a plan compiling ahead
    holds up no other plan's programs."""

    def __init__(self, make):
        self._make, self._program, self._lock = make, None, threading.Lock()

    def get(self):
        with self._lock:
            if self._program is None:
                self._program = self._make()
            return self._program


def _program(key, make):
    """The program kept under `key`, made by `make()` the first time."""
    with _lock:
        if key not in _programs:
            _programs[key] = _Kept(make)
            while len(_programs) > KEEP:
                _programs.popitem(last=False)
        _programs.move_to_end(key)
        kept = _programs[key]
    return kept.get()


def _random_key(mesh):
    """What the weights' program takes: a PRNG key, replicated over `mesh`."""
    shape = jax.eval_shape(jax.random.PRNGKey, 0)
    return jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=NamedSharding(mesh, P()))


def param_initialiser(trainer):
    """`init(rng)`, the weights of `trainer`'s plan from a PRNG key, laid out as `trainer.param_shardings`:
    the program of the first plan with the same model, parameter shapes, dtypes and shardings."""
    with TRACING:
        key = ("params", trainer.plan.model, _layout(trainer.abstract_params))

    def make():
        # compiled ahead of time (a call of the jitted function would compile again); the function holds the
        # model (a plan and a mesh), never the trainer, whose step stays compiled while it is alive
        initialiser = jax.jit(partial(initial_params, trainer.model), out_shardings=trainer.param_shardings)
        return lowered_then_compiled(
            lambda: initialiser.lower(_random_key(trainer.mesh)),
            plan_compiler_options(trainer.plan),  # the model's forward runs the plan's splash blocks
        )

    program = _program(key, make)
    replicated = NamedSharding(trainer.mesh, P())
    return lambda rng: program(jax.device_put(rng, replicated))


def opt_state_initialiser(trainer):
    """`init(params)`, the optimizer's state of `trainer`'s plan laid out as `trainer.opt_shardings`: a
    jitted function (params restored from a checkpoint may come laid out otherwise)."""
    with TRACING:
        abstract_opt = trainer.abstract_state()[1]
    key = ("opt_state", trainer.adamw, trainer.plan.mu_dtype, _layout(trainer.abstract_params), _layout(abstract_opt))
    return _program(
        key,
        lambda: jax.jit(partial(initial_opt_state, trainer.optimizer), out_shardings=trainer.opt_shardings),
    )


def prepare_initialisers(trainer) -> None:
    """Compiles `trainer`'s two programs (where its layout has none yet) without allocating on the devices."""
    param_initialiser(trainer)
    init_opt_state = opt_state_initialiser(trainer)
    lowered_then_compiled(lambda: init_opt_state.lower(trainer.abstract_params))
