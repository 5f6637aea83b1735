"""The runtime conforms to the cost model's specs: it makes the splash calls each strategy spec
lists (count per device, query/key lengths, heads, mask, query block), accepts what the spec
accepts, refuses what it refuses, and keeps exactly what the remat table says each policy keeps."""

import collections
import contextlib
import io
import os
import re
from fractions import Fraction
from typing import NamedTuple

import numpy as np

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest  # noqa: E402

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from cost_models.errors import CpplanError  # noqa: E402
from cost_models.models import MODELS, ModelSpec  # noqa: E402
from cost_models.pricing.attention import key_chunks  # noqa: E402
from cost_models.remat import ATTENTION_OUTPUT, CHECKPOINTS, Block, kept_names, offloaded_names  # noqa: E402
from cost_models.strategies import STRATEGIES, strategies_for  # noqa: E402
from cost_models.vocabulary import AXES, RematPolicy  # noqa: E402
from planner import Plan, make_mesh  # noqa: E402
from planner.estimate import candidates_of  # noqa: E402
from planner.options import ordered_factorizations  # noqa: E402
from runtime import splash  # noqa: E402
from runtime.attention import context_attention  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402

pytestmark = pytest.mark.cpu_mesh
HEAD_DIM = 16


def attention_model(heads, kv_heads):
    return ModelSpec("conformance", 1, 64, heads, kv_heads, HEAD_DIM, 128, 256)


def make_plan(strategy, mesh, seq_len, *, heads=8, kv_heads=8, zigzag=False, batch=1, block=128, fused=False):
    return Plan(
        model=attention_model(heads, kv_heads),
        topology="cpu:8",
        seq_len=seq_len,
        global_batch=batch,
        mesh=make_mesh(**mesh),
        cp_strategy=strategy,
        load_balance="zigzag" if zigzag else "none",
        block_q=block,
        block_kv=block,
        param_dtype="float32",
        compute_dtype="float32",
        fused_attention_backward=fused,
    )


def arrays(plan):
    m = plan.model
    q = jnp.ones((plan.global_batch, plan.seq_len, m.num_heads, HEAD_DIM), jnp.float32)
    kv = jnp.ones((plan.global_batch, plan.seq_len, m.num_kv_heads, HEAD_DIM), jnp.float32)
    return q, kv, kv


class CallKey(NamedTuple):
    """What a splash call is, as the spec describes one: lengths, heads (batch folded in), mask, query block,
    the backward its kernel runs (fused, or dq and dK/dV) and the chunks of its keys that backward runs over."""

    q_len: int
    kv_len: int
    q_rows: int
    kv_rows: int
    masked: bool
    block_q: int
    fused: bool
    key_chunks: int


def call_key(kernel, q, k) -> CallKey:
    """A runtime call's `CallKey`."""
    return CallKey(
        q.shape[1],
        k.shape[1],
        q.shape[0],
        k.shape[0],
        kernel.mask_function is not None,
        kernel.block_sizes.block_q,
        kernel.block_sizes.use_fused_bwd_kernel,
        kernel.key_chunks(q, k),
    )


@pytest.fixture
def recorded(monkeypatch):
    """Records every forward splash call: at trace time (`static`), and per device as it runs (`ran`)."""
    static, ran = [], []

    def wrap(fn):
        def recording(kernel, q, k, v):
            key = call_key(kernel, q, k)
            static.append(key)
            device = jax.lax.axis_index(AXES)
            jax.debug.callback(lambda d: ran.append((int(d), key)), device)
            return fn(kernel, q, k, v)

        return recording

    monkeypatch.setattr(splash, "attend", wrap(splash.attend))
    monkeypatch.setattr(splash, "attend_with_lse", wrap(splash.attend_with_lse))
    return static, ran


def spec_calls(plan, *, shared_cores):
    """{call key: calls per device per layer forward} as the plan's strategy spec lists them."""
    spec, shape = plan.strategy_spec, plan.shape
    shape = type(shape)(**{**shape.__dict__, "shared_cores": shared_cores})
    layout = spec.layout(shape)
    candidates = candidates_of(plan)
    sequences = plan.global_batch // (plan.axis_size("data") * plan.axis_size("fsdp"))
    calls = collections.Counter()
    for call in spec.kernel_calls(shape, layout):
        count = Fraction(float(call.count)).limit_denominator(64)
        if count:
            q_len, kv_len = int(call.q_len), int(call.kv_len)
            block_q = int(min(plan.block_q, q_len, float(call.q_block_cap)))
            calls[
                CallKey(
                    q_len,
                    kv_len,
                    int(sequences * layout.q_heads),
                    int(sequences * layout.kv_heads),
                    call.causal,
                    block_q,
                    call.fused_backward,
                    int(np.ravel(key_chunks(candidates, layout, call, True))[0]),
                )
            ] += count
    return calls


CASES = [
    ("none", dict(fsdp=8), 1024, dict(batch=8)),
    ("all_gather", dict(context=8), 2048, {}),
    ("all_gather", dict(context=8), 2048, dict(zigzag=True)),
    ("all_gather", dict(context=4, tensor=2), 1024, dict(zigzag=True, kv_heads=2)),
    ("ulysses", dict(context_ulysses=8), 1024, dict(kv_heads=2)),
    ("ulysses", dict(context_ulysses=4, data=2), 1024, dict(heads=24, kv_heads=6, batch=2)),
    ("ring", dict(context=8), 2048, {}),
    ("ring", dict(context=8), 2048, dict(zigzag=True)),
    ("ring", dict(context=4, fsdp=2), 1024, dict(zigzag=True, batch=4, kv_heads=4)),
    ("usp", dict(context=2, context_ulysses=4), 1024, dict(zigzag=True, kv_heads=2)),
    ("usp", dict(context=4, context_ulysses=2), 1024, {}),
]


@pytest.mark.parametrize(
    "strategy,mesh,seq_len,options", CASES, ids=[f"{s}-{'x'.join(map(str, m.values()))}-{n}" for s, m, n, _ in CASES]
)
def test_runtime_makes_the_spec_kernel_calls(recorded, strategy, mesh, seq_len, options):
    assert_conforms(recorded, make_plan(strategy, mesh, seq_len, **options))


@pytest.mark.parametrize(
    "strategy,mesh,seq_len,options", [CASES[0], CASES[2], CASES[5], CASES[8], CASES[9]], ids=lambda c: str(c)
)
def test_a_plan_with_the_fused_backward_runs_it_in_every_call(recorded, strategy, mesh, seq_len, options):
    """With the plan's `fused_attention_backward` on, its spec's calls say fused and the runtime's kernels
    run it: the backward kind is part of what is compared."""
    plan = make_plan(strategy, mesh, seq_len, fused=True, **options)
    assert all(key.fused for key in spec_calls(plan, shared_cores=False))
    assert_conforms(recorded, plan)
    assert recorded[0] and all(key.fused for key in recorded[0])


@pytest.mark.parametrize("strategy,mesh,seq_len,options", [CASES[0], CASES[2], CASES[8]], ids=lambda c: str(c))
def test_a_fused_backward_over_key_chunks_runs_the_chunks_the_price_counts(
    recorded, monkeypatch, strategy, mesh, seq_len, options
):
    """Where the dq partials' share of the HBM is made tiny, every fused call of more than one key block runs
    over chunks of its keys (one per block), as many as the price counts for it."""
    monkeypatch.setattr("cost_models.compute.DQ_PARTIALS_HBM_SHARE", 1e-9)
    assert_conforms(recorded, make_plan(strategy, mesh, seq_len, fused=True, **options))
    several = [key for key in recorded[0] if key.kv_len > 128]  # more keys than one 128-token block
    assert several and all(key.key_chunks == key.kv_len // 128 for key in several)


def test_a_strategy_registered_in_one_place_conforms(recorded):
    from toy_strategy import registered_toy

    with registered_toy(runtime=True) as toy:
        assert_conforms(recorded, make_plan(toy, dict(context=8), 2048))


def assert_conforms(recorded, plan):
    """The runtime runs `plan` making, per device, the splash calls its spec lists."""
    static, ran = recorded
    assert plan.strategy_spec.check(plan.shape) is None
    device_mesh = build_mesh(plan)
    run = jax.jit(lambda q, k, v: context_attention(q, k, v, plan=plan, mesh=device_mesh))
    jax.block_until_ready(run(*arrays(plan)))

    devices = device_mesh.devices.size
    per_device = collections.defaultdict(collections.Counter)
    for device, key in ran:
        per_device[device][key] += 1
    assert len(per_device) == devices
    # a host's devices share its cores: the spec lists the average device's calls
    mean = collections.Counter()
    for counts in per_device.values():
        for key, n in counts.items():
            mean[key] += Fraction(n, devices)
    assert mean == spec_calls(plan, shared_cores=True)
    # on chips it lists the busiest device's work
    work = lambda calls: sum(n * q * kv for (q, kv, *_), n in calls.items())  # noqa: E731
    assert max(work(c) for c in per_device.values()) == work(spec_calls(plan, shared_cores=False))
    # every kernel the runtime traces (both sides of each ring hop's branch) is one the spec lists
    assert set(static) <= set(spec_calls(plan, shared_cores=True)) | set(spec_calls(plan, shared_cores=False))


def _corpus_plan(draw):
    # a dense model's meshes: the expert axis is one device (a mixture of experts' alone may split it)
    sizes = draw(st.sampled_from(ordered_factorizations(8, len(AXES), {AXES.index("expert"): 1})))
    mesh = dict(zip(AXES, sizes))
    strategy = draw(st.sampled_from(list(STRATEGIES)))
    heads = draw(st.sampled_from([4, 8, 12, 16, 24]))
    kv_heads = draw(st.sampled_from([h for h in (1, 2, 3, 4, 6, 8, 12, 16, 24) if heads % h == 0]))
    seq_len = draw(st.sampled_from([256, 512, 768, 1024, 2048, 1000]))
    batch = mesh["data"] * mesh["fsdp"] * draw(st.sampled_from([1, 2]))
    return make_plan(strategy, mesh, seq_len, heads=heads, kv_heads=kv_heads, zigzag=draw(st.booleans()), batch=batch)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_spec_and_runtime_accept_and_refuse_the_same_cases(recorded, data):
    """Traced, not run: a case the spec accepts traces, with kernels the spec lists; one it refuses
    is refused by the runtime with the spec's reason before anything is traced."""
    static, _ = recorded
    static.clear()
    plan = _corpus_plan(data.draw)
    violation = plan.strategy_spec.check(plan.shape)
    trace = lambda: jax.make_jaxpr(  # noqa: E731
        lambda q, k, v: context_attention(q, k, v, plan=plan, mesh=build_mesh(plan))
    )(*arrays(plan))
    if violation is None and plan.global_batch % (plan.axis_size("data") * plan.axis_size("fsdp")) == 0:
        trace()
        listed = set(spec_calls(plan, shared_cores=True)) | set(spec_calls(plan, shared_cores=False))
        assert static and set(static) <= listed
    else:
        reason = violation.reason if violation else "not divisible by data×fsdp"
        with pytest.raises(CpplanError, match=re.escape(reason)):
            trace()
        assert not static


def test_the_drifts_are_settled():
    """24 query / 6 KV heads at Ulysses 4 (KV heads replicated to 12) runs and is priced; all-gather
    over 8 with zigzag at 1024 tokens (64-token query chunks, below the lane width) is refused by both."""
    ulysses = make_plan("ulysses", dict(context_ulysses=4, data=2), 1024, heads=24, kv_heads=6, batch=2)
    assert ulysses.strategy_spec.check(ulysses.shape) is None
    assert float(ulysses.strategy_spec.layout(ulysses.shape).kv_heads) == 3  # lcm(6, 4) / 4
    gather = make_plan("all_gather", dict(context=8), 1024, zigzag=True)
    assert "64 query tokens, not a multiple of 128" in gather.strategy_spec.check(gather.shape).reason
    with pytest.raises(CpplanError, match="64 query tokens"):
        context_attention(*arrays(gather), plan=gather, mesh=build_mesh(gather))


def test_every_strategy_runtime_module_has_a_spec():
    import pkgutil

    import runtime.attention
    from runtime.attention import implementation

    modules = {m.name for m in pkgutil.iter_modules(runtime.attention.__path__)} - {"base"}
    assert modules == {s.value for s in STRATEGIES}
    assert all(implementation(s).__name__ == f"runtime.attention.{s.value}" for s in STRATEGIES)
    for r in range(1, 9):
        for u in range(1, 9):
            assert len(strategies_for(r, u)) == (2 if r > 1 and u == 1 else 1)


# Policies that cover each way of placing a checkpoint: none kept, some kept, all kept, offloaded,
# and per name. The rest are rows of the same table, checked by tests/cost_models/test_remat_table.py; each
# case here traces a layer and its backward (about 8 s), so CI runs these five behind the ring and two
# behind Ulysses.
RUNTIME_POLICIES = (
    RematPolicy.FULL,
    RematPolicy.SAVE_QKV_PROJ,
    RematPolicy.MINIMAL_WITH_CONTEXT,
    RematPolicy.MINIMAL_OFFLOADED,
    RematPolicy.CUSTOM,
)


# every policy behind the ring; behind Ulysses' all-to-all, one that keeps the attention output and
# one that recomputes it, each also with a fused backward over chunks of the keys (`attend`'s own VJP)
RESIDUAL_CASES = [
    *((p, "ring", False) for p in RUNTIME_POLICIES),
    *(
        (p, "ulysses", chunked)
        for p in (RematPolicy.MINIMAL_WITH_CONTEXT, RematPolicy.FULL)
        for chunked in (False, True)
    ),
]
RESIDUAL_MESHES = {"ring": (make_mesh(context=2, fsdp=4), 4), "ulysses": (make_mesh(context_ulysses=4, fsdp=2), 2)}


@pytest.mark.parametrize("policy, strategy, key_chunks", RESIDUAL_CASES)
def test_runtime_keeps_what_the_remat_table_says(policy, strategy, key_chunks, monkeypatch):
    """A decoder layer names exactly the table's checkpoints, and under each policy jax saves for
    the backward exactly the named values the table keeps. (The MLP runs in token chunks, each its
    own checkpoint under the same policy, so its values are saved inside the chunk loop, where jax
    does not report names: they are checked by name in the traced layer.)"""
    import flax.linen as nn
    from jax.ad_checkpoint import print_saved_residuals

    from runtime.model import DecoderLayer, remat_policy

    mesh, batch = RESIDUAL_MESHES[strategy]
    if key_chunks:
        monkeypatch.setattr("cost_models.compute.DQ_PARTIALS_HBM_SHARE", 1e-9)
    plan = Plan(
        model=MODELS["tiny"],
        topology="cpu:8",
        seq_len=1024,
        global_batch=batch,
        mesh=mesh,
        cp_strategy=strategy,
        remat=policy,
        param_dtype="float32",
        compute_dtype="float32",
        fused_attention_backward=key_chunks,
    )
    layer = nn.remat(DecoderLayer, policy=remat_policy(policy), prevent_cse=False)(plan, build_mesh(plan))
    x, positions = jnp.zeros((batch, plan.seq_len, plan.model.hidden)), jnp.zeros((batch, plan.seq_len), jnp.int32)
    params = layer.init(jax.random.PRNGKey(0), x, positions)
    loss = lambda p, x: layer.apply(p, x, positions)[0].sum()  # noqa: E731

    names = {c.name for c in CHECKPOINTS}
    traced = str(jax.make_jaxpr(loss)(params, x))
    assert {n for n in names if f"name={n}" in traced} == names
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(loss, params, x)
    saved = {n for n in names if f"named '{n}'" in out.getvalue()}
    mlp = {c.name for c in CHECKPOINTS if c.block is Block.MLP}
    # the layer leaves its layout of the attention output unnamed (behind Ulysses, the output
    # all-to-all's result): a kept attention output is the kernel's (or ring's) own residuals, its
    # output and log-sum-exp, saved as they leave the shard_map, where jax no longer reports their name
    assert saved == set(kept_names(policy)) - mlp - {ATTENTION_OUTPUT}
    residuals = out.getvalue().count("(sharded_attention)")
    assert residuals == (2 if ATTENTION_OUTPUT in kept_names(policy) else 0)
    # jax reports an offloaded residual as a host array, without its name (the MLP's leave its
    # chunk loop as host arrays); the MLP's output, which no backward reads, is not one
    read = {c.name for c in CHECKPOINTS if c.read_by_backward}
    assert out.getvalue().count("<host>") == len(set(offloaded_names(policy)) & read)


@pytest.fixture(scope="module")
def layer_gradients():
    """Gradients of one decoder layer (tensor 2 with sequence parallelism, fsdp 4) under a remat
    policy, by policy; the layer without remat under None."""
    import flax.linen as nn

    from runtime.model import DecoderLayer, remat_policy

    custom = (("query_proj", "offload"), ("context", "device"), ("mlpwi_1", "offload"))
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 256, MODELS["tiny"].hidden))
    positions = jnp.broadcast_to(jnp.arange(256, dtype=jnp.int32), (4, 256))
    cache = {}

    def grads(policy):
        if policy not in cache:
            plan = Plan(
                model=MODELS["tiny"],
                topology="cpu:8",
                seq_len=256,
                global_batch=4,
                mesh=make_mesh(fsdp=4, tensor=2),
                remat=policy or "full",
                block_q=128,
                block_kv=128,
                remat_custom=custom if policy is RematPolicy.CUSTOM else (),
                param_dtype="float32",
                compute_dtype="float32",
            )
            layer = (
                DecoderLayer
                if policy is None
                else nn.remat(DecoderLayer, policy=remat_policy(plan.remat, plan.remat_custom), prevent_cse=False)
            )
            module = layer(plan, build_mesh(plan))
            params = module.init(jax.random.PRNGKey(0), x, positions)
            loss = lambda p, x: (module.apply(p, x, positions)[0] ** 2).sum()  # noqa: E731
            cache[policy] = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)
        return cache[policy]

    return grads


@pytest.mark.parametrize("policy", RUNTIME_POLICIES)
def test_every_remat_policy_gives_the_same_gradients(layer_gradients, policy):
    """Whatever a policy keeps, offloads or recomputes, the layer's gradients (weights and input)
    are those of the layer without remat."""
    for got, want in zip(jax.tree.leaves(layer_gradients(policy)), jax.tree.leaves(layer_gradients(None))):
        assert np.abs(np.asarray(got) - np.asarray(want)).max() <= 1e-5 * np.abs(np.asarray(want)).max() + 1e-9
