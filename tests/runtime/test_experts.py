"""cpu_mesh tier: the runtime's mixture-of-experts MLP (`runtime.experts`), as the price describes it. The
sharded expert MLP (fsdp, tensor with sequence parallelism, token chunks, remat; biases; plain and gated)
equals a dense one-device mixture that runs every expert on every token; a dense lead is its own stack;
the remat policies see the routed values by MaxText's names."""

import contextlib
import dataclasses
import io
import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from cost_models.experts import Experts  # noqa: E402
from cost_models.models import MODELS  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from runtime.experts import expert_weights, mixture  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from runtime.model import ACTIVATION_FUNCTIONS, RESIDUAL, expert_block, layer_stacks, remat_policy  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

MOE = MODELS["tiny-moe"]  # 3 layers (1 dense), 8 experts 32 wide, top 2, 1 shared, 8 heads / 2 KV heads
SEQ = 512


def make_plan(model, mesh, *, topology="cpu:8", strategy="none", remat="full", batch=4, seq_len=SEQ):
    return Plan(
        model=model,
        topology=topology,
        seq_len=seq_len,
        global_batch=batch,
        mesh=make_mesh(**mesh),
        cp_strategy=strategy,
        remat=remat,
        block_q=128,
        block_kv=128,
        param_dtype="float32",
        compute_dtype="float32",
    )


def random_weights(model, key):
    """Every expert weight, random (biases too, so that each one counts)."""
    layout = expert_weights(model)
    keys = jax.random.split(key, len(layout))
    return {
        name: jax.random.normal(k, shape) / math.sqrt(model.hidden if name != "expert_w_down" else shape[1])
        for k, (name, (shape, _)) in zip(keys, layout.items())
    }


def dense_mixture(y, p, model):
    """The mixture on one device without routing's permutes: every expert runs on every token, and each
    token sums its top k experts' outputs weighted by the softmax over their router logits, plus the shared
    MLP."""
    e, acts = model.experts, [ACTIVATION_FUNCTIONS[a] for a in model.mlp_activations]
    names = ("w_gate", "w_up")[: model.mlp_inputs] if model.gated else ("w_in",)
    logits = y @ p["router"] + p.get("router_bias", 0.0)
    top, chosen = jax.lax.top_k(logits, e.per_token)
    gates = (jax.nn.one_hot(chosen, e.count) * jax.nn.softmax(top, axis=-1)[..., None]).sum(-2)  # [..., experts]
    hidden = math.prod(
        [
            act(jnp.einsum("...d,edf->...ef", y, p[f"expert_{n}"]) + p.get(f"expert_{n}_bias", 0.0))
            for act, n in zip(acts, names)
        ]
    )
    every = jnp.einsum("...ef,efd->...ed", hidden, p["expert_w_down"]) + p.get("expert_w_down_bias", 0.0)
    out = jnp.einsum("...ed,...e->...d", every, gates)
    if e.shared:
        shared = math.prod([act(y @ p[f"shared_{n}"] + p.get(f"shared_{n}_bias", 0.0)) for act, n in zip(acts, names)])
        out = out + shared @ p["shared_w_down"] + p.get("shared_w_down_bias", jnp.zeros((1, 1))).sum(0)
    return out


BIASED = dataclasses.replace(MOE, name="tiny-moe-bias", experts=dataclasses.replace(MOE.experts, bias=True))
PLAIN = dataclasses.replace(MOE, name="tiny-moe-plain", mlp_activations=("relu",))


@pytest.mark.parametrize(
    "model,remat",
    [(MOE, "minimal"), (BIASED, "full"), (PLAIN, "save_dot_except_mlp")],
    ids=["gated-shared", "biases", "plain"],
)
def test_sharded_experts_equal_the_dense_mixture(monkeypatch, model, remat):
    """Output and gradients (input, router, experts, shared experts, biases) of the expert MLP over
    data 2 × fsdp 2 × tensor 2, in chunks of 64 tokens, against `dense_mixture` on one device."""
    monkeypatch.setattr("runtime.model.MLP_CHUNK_TOKENS", 64)  # several chunks per device
    plan = make_plan(model, dict(data=2, fsdp=2, tensor=2), remat=remat, seq_len=256)
    mesh = build_mesh(plan)
    y_key, w_key = jax.random.split(jax.random.PRNGKey(0))
    y = jax.random.normal(y_key, (plan.global_batch, plan.seq_len, model.hidden))
    weights = random_weights(model, w_key)

    def sharded(y, weights):
        y = jax.lax.with_sharding_constraint(y, jax.sharding.NamedSharding(mesh, RESIDUAL))
        return expert_block(y, weights, plan=plan, mesh=mesh)

    def loss(fn):
        return jax.jit(jax.value_and_grad(lambda y, w: (fn(y, w) ** 2).mean(), argnums=(0, 1)))

    want_out, want_grads = loss(lambda y, w: dense_mixture(y, w, model))(y, weights)
    got_out, got_grads = loss(sharded)(y, weights)
    assert abs(float(got_out) - float(want_out)) <= 1e-5 * abs(float(want_out))
    assert jax.tree.structure(got_grads) == jax.tree.structure(want_grads)
    for got, want in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
        assert np.abs(np.asarray(got) - np.asarray(want)).max() <= 1e-5 * np.abs(np.asarray(want)).max()
    # the check can fail: routing every token to its top k by the smallest logits gives another answer
    flipped = {**weights, "router": -weights["router"]}
    assert abs(float(loss(sharded)(y, flipped)[0]) - float(want_out)) > 1e-3 * abs(float(want_out))


def test_layer_stacks_split_a_dense_lead_from_the_experts():
    assert layer_stacks(MOE) == (("dense_layers", 0, 1, False), ("layers", 1, 2, True))
    no_lead = dataclasses.replace(MOE, experts=Experts(8, 2, 32))
    assert layer_stacks(no_lead) == (("layers", 0, 3, True),)
    assert layer_stacks(MODELS["tiny"]) == (("layers", 0, 2, False),)


def test_remat_policies_see_the_routed_values_by_maxtexts_names():
    """The routed copies' input projections are named mlpwi_0/mlpwi_1 (tokens × top k rows each), the
    shared experts' beside them, and the combined output mlpwo: a policy that keeps the input projections
    saves exactly these for the backward, and one that keeps nothing saves none (jax does not report names
    from inside a shard_map: the saved values are read by shape, the names in the traced chunk)."""
    e, tokens = MOE.experts, 64
    plan = make_plan(MOE, {}, topology="cpu:1")
    mesh = build_mesh(plan, jax.devices()[:1])
    weights = random_weights(MOE, jax.random.PRNGKey(1))
    x = jax.random.normal(jax.random.PRNGKey(2), (tokens, MOE.hidden))
    functions = tuple(ACTIVATION_FUNCTIONS[a] for a in MOE.mlp_activations)
    whole = jax.sharding.PartitionSpec()

    def chunk(policy):  # one MLP chunk as the runtime checkpoints it, inside a shard_map
        body = jax.checkpoint(lambda x, w: mixture(x, w, experts=e, functions=functions), policy=remat_policy(policy))
        return jax.shard_map(body, mesh=mesh, in_specs=(whole, whole), out_specs=whole)

    def saved(policy):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            jax.ad_checkpoint.print_saved_residuals(lambda x, w: chunk(policy)(x, w).sum(), x, weights)
        return sorted(line.split()[0] for line in out.getvalue().splitlines() if "from the argument" not in line)

    traced = str(jax.make_jaxpr(chunk("minimal"))(x, weights))
    assert all(f"name={name}" in traced for name in ("mlpwi_0", "mlpwi_1", "mlpwo"))
    routed, shared = f"f32[{tokens * e.per_token},{e.intermediate}]", f"f32[{tokens},{e.shared * e.intermediate}]"
    assert saved("minimal") == sorted([routed, routed, shared, shared])
    assert saved("full") == []
