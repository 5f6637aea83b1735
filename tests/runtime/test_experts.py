"""cpu_mesh tier: the runtime's mixture-of-experts MLP (`runtime.experts`), as the price describes it. The
sharded expert MLP (fsdp, tensor with sequence parallelism, token chunks, remat; biases; plain and gated)
equals a dense one-device mixture that runs every expert on every token; a training step of a model with a
dense lead, routed and shared experts under fsdp, the context strategies and tensor equals the one-device
step; the weights the runtime creates are the ones the cost model counts, in two stacks; the remat
policies see the routed values by MaxText's names."""

import contextlib
import dataclasses
import functools
import io
import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from runtime_steps import float32_plan, one_step  # noqa: E402

from cost_models.errors import CpplanError  # noqa: E402
from cost_models.experts import Experts  # noqa: E402
from cost_models.models import MODELS  # noqa: E402
from cost_models.work_layout import weight_arrays_per_layer  # noqa: E402
from runtime.experts import expert_weights, mixture  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from runtime.model import ACTIVATION_FUNCTIONS, RESIDUAL, expert_block, layer_stacks, remat_policy  # noqa: E402
from runtime.train import Trainer  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

MOE = MODELS["tiny-moe"]  # 3 layers (1 dense), 8 experts 32 wide, top 2, 1 shared, 8 heads / 2 KV heads
SEQ = 512


make_plan = functools.partial(float32_plan, seq_len=SEQ, batch=4)


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


# on MaxText's jax (stage 3) one case of each test stands for the rest: the expert layer's jax calls (the
# routing, the grouped matmuls, their collectives) are the same in each; the strategies' are run there by
# the attention and training tests
REPEAT = pytest.mark.release_repeat


@pytest.mark.parametrize(
    "model,remat",
    [
        (MOE, "minimal"),
        pytest.param(BIASED, "full", marks=REPEAT),
        pytest.param(PLAIN, "save_dot_except_mlp", marks=REPEAT),
    ],
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


@pytest.fixture(scope="module")
def single_device_step():
    return one_step(make_plan(MOE, {}, topology="cpu:1", remat="full"))


# each device routes its own tokens, so the token order (zigzag or natural) changes nothing the experts see:
# the plans are in natural order, at a sequence every strategy splits into lane-wide splash calls
@pytest.mark.parametrize(
    "strategy,mesh,remat",
    [
        ("none", dict(fsdp=4, tensor=2), "minimal"),
        pytest.param("ring", dict(context=4, fsdp=2), "full", marks=REPEAT),
        pytest.param("all_gather", dict(context=4, tensor=2), "save_dot_except_mlp", marks=REPEAT),
        pytest.param("ulysses", dict(context_ulysses=4, data=2), "minimal_with_context", marks=REPEAT),
    ],
    ids=["fsdp4-tensor2", "ring4-fsdp2", "allgather4-tensor2", "ulysses4-data2"],
)
def test_moe_step_equals_one_device_step(single_device_step, monkeypatch, strategy, mesh, remat):
    monkeypatch.setattr("runtime.model.MLP_CHUNK_TOKENS", 128)  # several MLP chunks per device
    want_loss, want_grads = single_device_step
    loss, grads = one_step(make_plan(MOE, mesh, strategy=strategy, remat=remat))
    assert abs(loss - want_loss) <= 1e-4 * abs(want_loss)
    assert jax.tree.structure(grads) == jax.tree.structure(want_grads)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max() + 1e-9


@REPEAT  # the parallel block's jax calls are the default block's (stage 3 leaves out its dense test too)
def test_parallel_block_moe_step_equals_one_device_step(monkeypatch):
    """MaxText's parallel block with the experts beside the attention, their partial sums and the out
    projection's reduce-scattered together once."""
    monkeypatch.setattr("runtime.model.MLP_CHUNK_TOKENS", 128)
    model = dataclasses.replace(MOE, name="tiny-moe-parallel", decoder_block="default")
    want_loss, want_grads = one_step(make_plan(model, {}, topology="cpu:1", seq_len=256))
    loss, grads = one_step(make_plan(model, dict(data=2, fsdp=2, tensor=2), remat="minimal", seq_len=256))
    assert abs(loss - want_loss) <= 1e-4 * abs(want_loss)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max() + 1e-9


@pytest.mark.parametrize("model", [MOE, BIASED, PLAIN], ids=["gated-shared", "biases", "plain"])
def test_runtime_parameters_are_the_ones_the_cost_model_counts(model):
    """Shapes only: the weights of the runtime's model (two stacks: the dense lead, then the experts)
    sum to `ModelSpec.num_params`, and an expert layer holds every expert's matrices as `[experts,
    hidden, intermediate]`."""
    plan = make_plan(model, {}, topology="cpu:1")
    params = Trainer(plan, build_mesh(plan, jax.devices()[:1])).abstract_params["params"]
    sizes = {path: math.prod(leaf.shape) for path, leaf in jax.tree_util.tree_leaves_with_path(params)}
    assert sum(sizes.values()) == model.num_params
    dense, experts = params["dense_layers"], params["layers"]
    e, d = model.experts, model.hidden
    assert sum(math.prod(a.shape) for a in jax.tree.leaves(dense)) == e.dense_layers * (
        model.attention_params + 2 * d + model.dense_mlp_params
    )
    moe_layers = model.num_layers - e.dense_layers
    moe_mlp = sum(math.prod(a.shape) for n, a in experts.items() if n.startswith(("router", "expert_", "shared_")))
    assert moe_mlp == moe_layers * model.expert_mlp_params
    assert len(dense) == weight_arrays_per_layer(model)  # the dense lead's layer is a dense layer
    assert experts["expert_w_down"].shape == (moe_layers, e.count, e.intermediate, d)
    for name in ("w_gate", "w_up") if model.gated else ("w_in",):
        assert experts[f"expert_{name}"].shape == (moe_layers, e.count, d, e.intermediate)
        assert experts[f"shared_{name}"].shape == (moe_layers, d, e.shared * e.intermediate)
    assert experts["router"].shape == (moe_layers, d, e.count)


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


def test_the_runtime_refuses_only_what_it_does_not_run():
    plan = make_plan(dataclasses.replace(MOE, qk_norm=True), {}, topology="cpu:1")
    with pytest.raises(CpplanError, match="has q/k norms, which cpplan's runtime does not run"):
        Trainer(plan, build_mesh(plan, jax.devices()[:1]))
