"""A plan's training step: sharded parameters, the optimizer's state (`runtime.optimizer`) and the jitted
step (state donated).

Batches arrive in natural token order and are permuted once to the plan's order (`prepare_batch`);
`abstract_state` gives shape-only inputs for deviceless compilation.
"""

from __future__ import annotations

from functools import cached_property

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from cost_models.errors import CpplanError
from cost_models.targets import Target, model_refusal
from cost_models.vocabulary import LoadBalance, Quantization
from planner.plan import Plan
from runtime.compile import plan_compiler_options
from runtime.data.packing import inputs_and_targets
from runtime.initialise import init_variables, opt_state_initialiser, param_initialiser
from runtime.layout import TOKENS, token_order
from runtime.loss import cross_entropy, loss_chunk
from runtime.model import Llama, ModelConstants, param_specs
from runtime.optimizer import AdamW
from runtime.tracing import lowered_then_compiled


class Trainer:
    """A plan's training step on a mesh from `runtime.build_mesh(plan, ...)`, updating the weights with
    `optimizer` (default: AdamW's defaults at their peak rate, for steps taken by hand; a run gives its
    own, spanning its steps); the plan is checked first.

    Raises:
        CpplanError: the plan cannot run as laid out.
    """

    def __init__(
        self, plan: Plan, mesh: Mesh, *, optimizer: AdamW | None = None, constants: ModelConstants | None = None
    ):
        plan.check()
        if plan.state_on_host:
            raise CpplanError(
                f"plan state_on_host={[h.value for h in plan.state_on_host]}: cpplan's runtime keeps the "
                f"weights and the optimizer's state in HBM; run the plan with state_on_host empty, or export "
                f"it to MaxText (`cpplan export --format maxtext`), which keeps them on the host."
            )
        refusal = model_refusal(Target.CPPLAN, plan.model)
        if refusal:
            raise CpplanError(refusal)
        if plan.grad_dtype or plan.expert_capacity or plan.quantization is not Quantization.NONE:
            raise CpplanError(
                f"plan grad_dtype={plan.grad_dtype!r}, expert_capacity={plan.expert_capacity:g}, quantization="
                f"{plan.quantization.value}: cpplan's runtime runs bf16 matmuls, forms the gradients in the "
                f"parameters' dtype and routes every token dropless; run the plan with grad_dtype '', expert_capacity "
                f"0 and quantization none, or export it to MaxText (`cpplan export --format maxtext`)."
            )
        if plan.one_hot_embedding:
            raise CpplanError(
                "plan one_hot_embedding=True: cpplan's runtime looks the input embedding up by gathering the table's "
                "rows; run the plan with one_hot_embedding false (the same model, without the one-hot matmuls), or "
                "export it to MaxText (`cpplan export --format maxtext`), which runs it as use_iota_embed=True."
            )
        loss_chunk(plan)
        self.plan, self.mesh = plan, mesh
        self.constants = constants or ModelConstants()  # RoPE and norms' epsilon (a checkpoint's, or Llama 3's)
        self.model = Llama(plan, mesh, self.constants)
        self.adamw = optimizer or AdamW()  # the settings; `optimizer` is their optax transformation
        self.optimizer = self.adamw.transformation(mu_dtype=plan.mu_dtype)
        self.token_sharding = NamedSharding(mesh, TOKENS)

    # -- shapes and shardings --------------------------------------------------------------
    def _init_variables(self, rng):
        return init_variables(self.model, rng)

    @cached_property
    def param_shardings(self):
        boxed = jax.eval_shape(self._init_variables, jax.random.PRNGKey(0))
        return jax.tree.map(
            lambda spec: NamedSharding(self.mesh, spec), param_specs(boxed), is_leaf=lambda x: isinstance(x, P)
        )

    @cached_property
    def abstract_params(self):
        shapes = jax.eval_shape(lambda r: _unbox(self._init_variables(r)), jax.random.PRNGKey(0))
        return jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, self.param_shardings
        )

    @cached_property
    def opt_shardings(self):
        state = jax.eval_shape(self.optimizer.init, self.abstract_params)
        replicated = NamedSharding(self.mesh, P())
        return optax.tree_map_params(
            self.optimizer,
            lambda _, sharding: sharding,
            state,
            self.param_shardings,
            transform_non_params=lambda _: replicated,
            is_leaf=lambda x: isinstance(x, NamedSharding),
        )

    def abstract_state(self, *, packed: bool = False):
        """Shape-only `(params, opt_state, tokens, targets, positions, segment_ids)` for `step.lower`;
        segment_ids is None unless the batches are `packed`."""
        opt = jax.eval_shape(self.optimizer.init, self.abstract_params)
        opt = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), opt, self.opt_shardings)
        batch = jax.ShapeDtypeStruct(
            (self.plan.global_batch, self.plan.seq_len), jnp.int32, sharding=self.token_sharding
        )
        return self.abstract_params, opt, batch, batch, batch, batch if packed else None

    def compile_step(self, *, packed: bool = False):
        """`train_step` compiled ahead of time for `abstract_state(packed=packed)` on this trainer's devices,
        with the scoped VMEM its plan's splash blocks need (`runtime.compile.plan_compiler_options`)."""
        return lowered_then_compiled(
            lambda: self.train_step.lower(*self.abstract_state(packed=packed)), plan_compiler_options(self.plan)
        )

    # -- running ---------------------------------------------------------------------------
    def init(self, seed: int = 0, *, params=None):
        """`(params, opt_state)`, sharded and created on the devices (nothing whole on one device): random
        weights of `seed`, or `params` given laid out as `param_shardings` (a checkpoint's)."""
        # one program per layout, shared by the plans laid out alike (`runtime.initialise`)
        if params is None:
            params = param_initialiser(self)(jax.random.PRNGKey(seed))
        return params, opt_state_initialiser(self)(params)

    def loss(self, params, tokens, targets, positions, segment_ids=None):
        """Mean next-token loss, a replicated fp32 scalar, of `[batch, seq]` int32 arrays in the plan's
        token order (negative targets are not learned; segment_ids None unless packed)."""
        hidden, head = self.model.apply(params, tokens, positions, segment_ids)
        return cross_entropy(hidden, head, targets, plan=self.plan, mesh=self.mesh)

    def _step(self, params, opt_state, tokens, targets, positions, segment_ids):
        loss, grads = jax.value_and_grad(self.loss)(params, tokens, targets, positions, segment_ids)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads

    @cached_property
    def step(self):
        """`step(params, opt_state, tokens, targets, positions, segment_ids) -> (params, opt_state, loss, grads)`,
        jitted."""
        tokens = self.token_sharding
        return jax.jit(
            self._step,
            in_shardings=(self.param_shardings, self.opt_shardings, tokens, tokens, tokens, tokens),
            out_shardings=(
                self.param_shardings,
                self.opt_shardings,
                NamedSharding(self.mesh, P()),
                self.param_shardings,
            ),
            donate_argnums=(0, 1),
        )

    @cached_property
    def train_step(self):
        """Like `step` but without returning gradients: the step that runs and compiles."""
        tokens = self.token_sharding

        def fn(params, opt_state, tokens_, targets, positions, segment_ids):
            params, opt_state, loss, _ = self._step(params, opt_state, tokens_, targets, positions, segment_ids)
            return params, opt_state, loss

        return jax.jit(
            fn,
            in_shardings=(self.param_shardings, self.opt_shardings, tokens, tokens, tokens, tokens),
            out_shardings=(self.param_shardings, self.opt_shardings, NamedSharding(self.mesh, P())),
            donate_argnums=(0, 1),
        )

    def prepare_batch(self, sequences: np.ndarray, segment_ids: np.ndarray | None = None, *, first_row: int = 0):
        """`(tokens, targets, positions, segment_ids)`, `[global_batch, seq_len]` and sharded, of natural-order
        `[rows, seq_len+1]` rows from `first_row` on, permuted to the plan's order. Each process gives the
        rows its devices hold, so the batch never travels between processes; segment_ids None: unpacked."""
        order = token_order(
            self.plan.seq_len, self.plan.axis_size("context"), self.plan.load_balance is LoadBalance.ZIGZAG
        )
        shape = (self.plan.global_batch, self.plan.seq_len)

        def put(local):
            if local is None:
                return None
            local = np.ascontiguousarray(local[:, order])

            def shard(index):
                rows, columns = index
                rows = slice((rows.start or 0) - first_row, (shape[0] if rows.stop is None else rows.stop) - first_row)
                return local[rows, columns]

            return jax.make_array_from_callback(shape, self.token_sharding, shard)

        return tuple(put(x) for x in inputs_and_targets(sequences, segment_ids))


def _unbox(variables):
    """Plain arrays from flax's partitioned (boxed) variables."""
    return nn.meta.unbox(variables)
