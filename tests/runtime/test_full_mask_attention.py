"""A model with a full (non-causal) mask on the runtime. On the CPU mesh (cpu_mesh tier) it runs as
its spec prices it — the ring's local block and every hop whole, the all-gather call full — and
matches a dense one-device reference without a mask, forward and backward; deviceless for a TPU
slice (tpu_compile tier) its all-gather step (each device's 1024 queries against all 4096 keys)
compiles and fits."""

import dataclasses
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest  # noqa: E402

jax = pytest.importorskip("jax")
import numpy as np  # noqa: E402

from cost_models.errors import CpplanError  # noqa: E402
from cost_models.models import ModelSpec, get_model  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from runtime import splash  # noqa: E402
from runtime.attention import attention_layout, context_attention  # noqa: E402
from runtime.compile import compile_for  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, SEQ = 4, 2, 16, 512
ENCODER = ModelSpec("encoder-test", 1, 64, HEADS, KV_HEADS, HEAD_DIM, 128, 256, causal=False)


def make_plan(strategy, mesh):
    return Plan(
        model=ENCODER,
        topology="cpu:8",
        seq_len=SEQ,
        global_batch=1,
        mesh=make_mesh(**mesh),
        cp_strategy=strategy,
        block_q=128,
        block_kv=128,
        param_dtype="float32",
        compute_dtype="float32",
    )


@pytest.mark.cpu_mesh
@pytest.mark.parametrize("strategy", ["ring", "all_gather"])
def test_full_mask_matches_dense_and_makes_the_spec_calls(strategy, monkeypatch):
    plan = make_plan(strategy, dict(context=4, tensor=2))
    masks = []  # whether each splash call (at trace time) evaluates a mask rule

    def recording(fn):
        def call(kernel, *arrays):
            masks.append(kernel.mask_function is not None)
            return fn(kernel, *arrays)

        return call

    for name in ("attend", "attend_with_lse"):
        monkeypatch.setattr(splash, name, recording(getattr(splash, name)))
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(keys[0], (1, SEQ, HEADS, HEAD_DIM))
    k, v = (jax.random.normal(key, (1, SEQ, KV_HEADS, HEAD_DIM)) for key in keys[1:3])
    d_out = jax.random.normal(keys[3], (1, SEQ, HEADS, HEAD_DIM))
    device_mesh = build_mesh(plan)

    def run(attend):
        out, vjp = jax.vjp(attend, q, k, v)
        return out, vjp(d_out)

    out, grads = jax.jit(lambda: run(lambda a, b, c: context_attention(a, b, c, plan=plan, mesh=device_mesh)))()
    ref_out, ref_grads = run(lambda a, b, c: jax.nn.dot_product_attention(a, b, c, is_causal=False))
    assert float(np.abs(np.asarray(out - ref_out)).max()) <= 1e-4
    for name, got, want in zip("qkv", grads, ref_grads):
        assert float(np.abs(np.asarray(got - want)).max()) <= 1e-4, f"d{name}"
    # every forward call is full, as many as the spec lists (the ring: its block and 3 hops, no branch)
    spec, shape = plan.strategy_spec, plan.shape
    listed = spec.kernel_calls(shape, spec.layout(shape))
    assert masks == [False] * int(sum(float(c.count) for c in listed))
    assert not any(c.causal for c in listed)


@pytest.mark.cpu_mesh
def test_the_runtime_refuses_zigzag_order_under_a_full_mask():
    plan = make_plan("ring", dict(context=4, tensor=2))
    with pytest.raises(CpplanError, match="full \\(non-causal\\) mask every rank does the same work"):
        dataclasses.replace(attention_layout(plan, interpret=True), zigzag=True)


@pytest.mark.tpu_compile
def test_full_mask_all_gather_compiles_for_tpu():
    pytest.importorskip("libtpu")
    encoder = dataclasses.replace(get_model("tiny"), name="tiny-encoder", causal=False)
    plan = Plan(
        model=encoder,
        topology="v5p:2x2x1",
        seq_len=4096,
        global_batch=1,
        mesh=make_mesh(context=4),
        cp_strategy="all_gather",
        block_q=256,
        block_kv=256,
        loss_chunk_tokens=256,
    )
    report = compile_for(plan)
    assert report.fits and report.temp_bytes > 0
