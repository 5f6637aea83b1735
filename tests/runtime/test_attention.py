"""cpu_mesh tier: every context-parallel strategy against a dense single-device causal reference."""

import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib  # noqa: E402
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mask_info  # noqa: E402

from cost_models.compute import splash_smem_bytes  # noqa: E402
from cost_models.errors import CpplanError  # noqa: E402
from cost_models.models import ModelSpec  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from runtime import splash  # noqa: E402
from runtime.attention import context_attention  # noqa: E402
from runtime.layout import token_order, zigzag_order  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

HEADS, HEAD_DIM = 8, 16
CASES = [  # strategy, mesh, seq_len (the shortest each layout allows with 128-token splash blocks)
    ("all_gather", dict(context=8), 2048),
    ("ulysses", dict(context_ulysses=8), 1024),
    ("ring", dict(context=8), 2048),
    ("usp", dict(context=2, context_ulysses=4), 1024),
    ("usp", dict(context=4, context_ulysses=2), 1024),
]


def model(kv_heads):
    return ModelSpec("attn-test", 1, 64, HEADS, kv_heads, HEAD_DIM, 128, 256)


def make_plan(strategy, mesh, seq_len, *, kv_heads=HEADS, zigzag=False, batch=1, fused=False):
    return Plan(
        model=model(kv_heads),
        topology="cpu:8",
        seq_len=seq_len,
        global_batch=batch,
        mesh=make_mesh(**mesh),
        cp_strategy=strategy,
        load_balance="zigzag" if zigzag else "none",
        block_q=128,
        block_kv=128,
        param_dtype="float32",
        compute_dtype="float32",
        fused_attention_backward=fused,
    )


def inputs(seq_len, kv_heads, batch=1):
    keys = jax.random.split(jax.random.PRNGKey(seq_len + kv_heads), 4)
    q = jax.random.normal(keys[0], (batch, seq_len, HEADS, HEAD_DIM))
    k = jax.random.normal(keys[1], (batch, seq_len, kv_heads, HEAD_DIM))
    v = jax.random.normal(keys[2], (batch, seq_len, kv_heads, HEAD_DIM))
    d_out = jax.random.normal(keys[3], (batch, seq_len, HEADS, HEAD_DIM))
    return q, k, v, d_out


def reference(q, k, v, d_out):
    """Dense causal attention on one device: output and (dq, dk, dv)."""
    out, vjp = jax.vjp(lambda a, b, c: jax.nn.dot_product_attention(a, b, c, is_causal=True), q, k, v)
    return out, vjp(d_out)


@pytest.mark.parametrize(
    "shape", [(512, 512, 128, 128), (512, 512, 128, 256), (512, 512, 256, 128), (1024, 1024, 64, 128)]
)
def test_causal_metadata_equals_splash_own(shape):
    """The O(blocks) metadata equals what splash derives by evaluating the mask element by element."""
    q_len, kv_len, bq, bkv = shape
    mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((q_len, kv_len))])
    fwd, _ = mask_info.process_mask(mask, (bq, bkv), shrink_grid=False)
    dkv, _ = mask_info.process_mask_dkv(mask, (bq, bkv), shrink_grid=False)
    block_mask, fwd_next, dkv_next = splash._static_causal(q_len, kv_len, bq, bkv)
    np.testing.assert_array_equal(block_mask, fwd.block_mask)
    np.testing.assert_array_equal(fwd_next, fwd.data_next)
    np.testing.assert_array_equal(dkv_next, dkv.data_next)
    assert fwd_next.dtype == fwd.data_next.dtype


def test_zigzag_order_gives_each_rank_chunks_i_and_2n_minus_1_minus_i():
    order = zigzag_order(16, 4)  # 8 chunks of 2
    np.testing.assert_array_equal(order.reshape(4, 2, 2)[1], [[2, 3], [12, 13]])
    np.testing.assert_array_equal(np.sort(order), np.arange(16))
    np.testing.assert_array_equal(token_order(16, 4, False), np.arange(16))


# Zigzag balances over the ring degree; Ulysses alone has ring degree 1, where zigzag is the
# identity (same computation as without), so its zigzag cases are left out. On MaxText's jax one
# case of each layout runs (zigzag where the layout has it, GQA), the others being the same calls.
ATTENTION_CASES = [
    pytest.param(
        strategy,
        mesh,
        seq_len,
        zigzag,
        kv_heads,
        id=f"{name}-{'zigzag' if zigzag else 'plain'}-{'gqa' if kv_heads < HEADS else 'mha'}",
        marks=() if (zigzag or strategy == "ulysses") and kv_heads < HEADS else pytest.mark.release_repeat,
    )
    for (strategy, mesh, seq_len), name in zip(CASES, ["all_gather8", "ulysses8", "ring8", "usp2x4", "usp4x2"])
    for zigzag in (False, True)
    if not (zigzag and strategy == "ulysses")
    for kv_heads in (HEADS, 2)
]


@pytest.mark.parametrize("strategy,mesh,seq_len,zigzag,kv_heads", ATTENTION_CASES)
def test_context_attention_matches_dense(strategy, mesh, seq_len, zigzag, kv_heads):
    plan = make_plan(strategy, mesh, seq_len, kv_heads=kv_heads, zigzag=zigzag)
    device_mesh = build_mesh(plan)
    q, k, v, d_out = inputs(seq_len, kv_heads)

    @jax.jit
    def run(q, k, v, d_out):
        out, vjp = jax.vjp(lambda a, b, c: context_attention(a, b, c, plan=plan, mesh=device_mesh), q, k, v)
        return out, vjp(d_out)

    out, grads = run(q, k, v, d_out)
    ref_out, ref_grads = reference(q, k, v, d_out)
    assert float(np.abs(np.asarray(out - ref_out)).max()) <= 1e-4
    for name, got, want in zip("qkv", grads, ref_grads):
        assert float(np.abs(np.asarray(got - want)).max()) <= 1e-4, f"d{name}"


FUSED_CASES = [  # one of each layout, GQA, zigzag where the layout balances load, and one device alone
    ("none", dict(fsdp=8), 1024, False, 2),
    ("all_gather", dict(context=8), 2048, True, 2),
    ("ulysses", dict(context_ulysses=8), 1024, False, 2),
    ("ring", dict(context=8), 2048, True, 2),
    ("usp", dict(context=2, context_ulysses=4), 1024, True, 2),
]


# each case whole, and the ones whose calls differ in kind (a gathered rank's tables, a ring's hops) over
# chunks of the keys, which make the same jax calls again (so MaxText's jax runs them whole only)
FUSED_KEY_CHUNK_CASES = [
    pytest.param(*case, chunked, id=f"{case[0]}-{'key-chunks' if chunked else 'whole'}", marks=marks)
    for case in FUSED_CASES
    for chunked, marks in ((False, ()), (True, pytest.mark.release_repeat))
    if not chunked or case[0] in ("all_gather", "ring", "usp")
]


@pytest.mark.parametrize("strategy,mesh,seq_len,zigzag,kv_heads,key_chunks", FUSED_KEY_CHUNK_CASES)
def test_the_fused_backward_matches_dense(strategy, mesh, seq_len, zigzag, kv_heads, key_chunks, monkeypatch):
    """Every strategy run with splash's fused backward (the plan's `fused_attention_backward`) gives the
    dense reference's gradients, as the dq and dK/dV kernels do; so it does run over chunks of the keys
    (a share of the HBM made tiny: one chunk per key block, the ring's hops too)."""
    if key_chunks:
        monkeypatch.setattr("cost_models.compute.DQ_PARTIALS_HBM_SHARE", 1e-9)
    batch = mesh.get("fsdp", 1)  # one device's sequence each where the batch is what is split
    plan = make_plan(strategy, mesh, seq_len, kv_heads=kv_heads, zigzag=zigzag, batch=batch, fused=True)
    assert plan.runs_fused_backward()
    device_mesh = build_mesh(plan)
    q, k, v, d_out = inputs(seq_len, kv_heads, batch)

    @jax.jit
    def run(q, k, v, d_out):
        out, vjp = jax.vjp(lambda a, b, c: context_attention(a, b, c, plan=plan, mesh=device_mesh), q, k, v)
        return out, vjp(d_out)

    out, grads = run(q, k, v, d_out)
    ref_out, ref_grads = reference(q, k, v, d_out)
    assert float(np.abs(np.asarray(out - ref_out)).max()) <= 1e-4
    for name, got, want in zip("qkv", grads, ref_grads):
        assert float(np.abs(np.asarray(got - want)).max()) <= 1e-4, f"d{name}"


def test_ring_with_batch_and_tensor_shards():
    """Batch over data×fsdp and heads over tensor alongside a ring of 2."""
    plan = make_plan("ring", dict(data=2, context=2, tensor=2), 512, kv_heads=2, zigzag=True, batch=2)
    q, k, v, d_out = inputs(512, 2, batch=2)
    out = jax.jit(lambda a, b, c: context_attention(a, b, c, plan=plan, mesh=build_mesh(plan)))(q, k, v)
    assert float(np.abs(np.asarray(out - reference(q, k, v, d_out)[0])).max()) <= 1e-4


@pytest.mark.parametrize(
    "strategy,mesh,seq_len,heads,kv_heads,zigzag,needle",
    [
        (
            "ulysses",
            dict(context_ulysses=8),
            1024,
            4,
            4,
            False,
            "num_heads/tensor=4/1=4 not divisible by context_ulysses=8",
        ),
        ("ulysses", dict(context_ulysses=8), 1024, 8, 8, True, "zigzag does nothing for ulysses"),
        ("ring", dict(context=8), 1000, 8, 8, True, "seq_len=1000 not divisible by 16 context ranks"),
        ("ring", dict(context=8), 1024, 8, 8, True, "64 key tokens, not a multiple of 128"),
        (
            "ring",
            dict(context=4, context_ulysses=2),
            1024,
            8,
            8,
            True,
            "ring needs context > 1 and context_ulysses = 1",
        ),
        ("all_gather", dict(context=2, tensor=4), 1024, 8, 2, True, "num_kv_heads=2 not divisible by tensor=4"),
    ],
)
def test_bad_plans_fail_before_compiling(strategy, mesh, seq_len, heads, kv_heads, zigzag, needle):
    """The runtime refuses with its strategy spec's rule (the one the planner prices by)."""
    spec = ModelSpec("bad", 1, 64, heads, kv_heads, HEAD_DIM, 128, 256)
    plan = Plan(
        model=spec,
        topology="cpu:8",
        seq_len=seq_len,
        global_batch=1,
        mesh=make_mesh(**mesh),
        cp_strategy=strategy,
        load_balance="zigzag" if zigzag else "none",
    )
    q = jnp.zeros((1, seq_len, heads, HEAD_DIM))
    kv = jnp.zeros((1, seq_len, kv_heads, HEAD_DIM))
    with pytest.raises(CpplanError, match=needle):
        context_attention(q, kv, kv, plan=plan, mesh=build_mesh(plan))


def test_plan_for_other_topology_than_devices_present():
    plan = Plan(
        model=model(HEADS),
        topology="cpu:4",
        seq_len=1024,
        global_batch=1,
        mesh=make_mesh(context=4),
        cp_strategy="ring",
    )
    with pytest.raises(CpplanError, match="cpu:4 \\(4 devices\\) but 8 devices are present"):
        build_mesh(plan)
    assert len(jax.devices()) == 8 and os.environ["JAX_PLATFORMS"] == "cpu"


@pytest.mark.parametrize(
    "q_len,kv_len,bq,bkv",
    [(1024, 1024, 128, 128), (65536, 1024, 128, 128), (1024, 65536, 128, 256), (4096, 40960, 128, 128)],
)
def test_the_cost_model_smem_formula_is_the_size_of_the_runtime_tables(q_len, kv_len, bq, bkv):
    """The SMEM the planner prices bounds what the runtime's tables take (the block mask and the
    data_next table of the larger of the forward and dK/dV kernels, each in its downcast dtype),
    and is exact when the largest block index occurs: the formula sizes indices by the larger
    block count, while a causal table whose keys outrun its queries never reaches it."""
    block_mask, fwd, dkv = splash._static_causal(q_len, kv_len, bq, bkv)
    tables = block_mask.nbytes + max(fwd.nbytes, dkv.nbytes)
    priced = splash_smem_bytes(q_len, kv_len, block_q=bq, block_kv=bkv)
    assert tables <= priced
    if max(fwd.max(), dkv.max()) == max(q_len // bq, kv_len // bkv) - 1:
        assert tables == priced


def test_block_sizes_are_checked_against_scalar_memory():
    """Splash keeps two tables per kernel in SMEM: a 1M-token causal call with 512 blocks needs 12 MiB."""
    v5p = splash.KernelConfig(512, 512, interpret=False, smem_bytes=1 << 20)
    assert splash_smem_bytes(1 << 20, 1 << 20, block_q=512, block_kv=512) == 2048 * 2048 * 3
    with pytest.raises(CpplanError, match="needs 12582912 bytes of scalar memory, more than the chip's 1048576"):
        splash.causal_kernel(1 << 20, 1 << 20, v5p)
    splash.check_smem(1 << 17, 1 << 17, splash.KernelConfig(1024, 1024, interpret=False, smem_bytes=1 << 20))
