"""cpu_mesh tier: the runtime's norms run on the tokens the elementwise price says they do
(`work_layout.residual_tokens`): one decoder layer's forward compiled over fsdp × tensor on the
8 virtual CPU devices normalises a tensor-th of its batch shard's tokens, in both blocks."""

import re

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from cost_models.models import ModelSpec  # noqa: E402
from cost_models.work_layout import residual_tokens  # noqa: E402
from planner.estimate import candidates_of  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from runtime.model import DecoderLayer  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

SEQ, HIDDEN = 128, 64
# the 8 devices as data × fsdp × tensor, one sequence per batch shard
MESHES = {1: dict(data=2, fsdp=4), 4: dict(fsdp=2, tensor=4)}


def normed_shapes(plan) -> set[tuple[int, ...]]:
    """The per-device shapes of every rsqrt (one per token normalised) in the compiled layer forward."""
    layer = DecoderLayer(plan, build_mesh(plan, jax.devices()[:8]))
    x = jax.ShapeDtypeStruct((plan.global_batch, SEQ, HIDDEN), jnp.float32)
    positions = jax.ShapeDtypeStruct((plan.global_batch, SEQ), jnp.int32)
    params = jax.eval_shape(layer.init, jax.random.PRNGKey(0), x, positions)
    text = jax.jit(lambda p, x, pos: layer.apply(p, x, pos)[0]).lower(params, x, positions).compile().as_text()
    return {tuple(int(d) for d in dims.split(",")) for dims in re.findall(r"= f32\[([0-9,]+)\][^=\n]*rsqrt\(", text)}


@pytest.mark.parametrize("block", ["llama2", "default"])
@pytest.mark.parametrize("tensor", [1, 4])
def test_norms_run_on_the_residual_tokens(block, tensor):
    model = ModelSpec("norm-probe", 1, HIDDEN, 4, 4, 16, 96, 256, decoder_block=block)
    mesh = MESHES[tensor]
    plan = Plan(
        model=model,
        topology="cpu:8",
        seq_len=SEQ,
        global_batch=mesh.get("data", 1) * mesh["fsdp"],
        mesh=make_mesh(**mesh),
        remat="full",
        block_q=128,
        block_kv=128,
        param_dtype="float32",
        compute_dtype="float32",
    )
    x = candidates_of(plan)
    priced = residual_tokens(x.tokens_per_device, x.tensor)[0]
    assert priced == SEQ / tensor  # one sequence per batch shard
    # each batch shard's sequence, a tensor-th of its tokens per device
    assert normed_shapes(plan) == {(1, int(priced))}
