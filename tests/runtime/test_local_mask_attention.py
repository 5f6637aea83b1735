"""cpu_mesh tier: sliding-window and chunked attention (packed rows too) under every strategy equals a
dense masked reference, outputs and gradients; the ring walks exactly the hops the mask needs
(`cost_models.masks.hops_needed`); bad input is refused with the rule and the fix."""

import dataclasses
import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from packed_layouts import packed_ids  # noqa: E402

from cost_models import masks  # noqa: E402
from cost_models.documents import histogram  # noqa: E402
from cost_models.errors import CpplanError  # noqa: E402
from cost_models.models import ModelSpec  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from runtime import splash  # noqa: E402
from runtime.attention import attention_layout, context_attention  # noqa: E402
from runtime.attention.base import AttentionLayout  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

SEQ, HEADS, HEAD_DIM = 512, 2, 16
DOCUMENTS = histogram([40, 100, 300], [3, 2, 1])  # packed rows: documents of varying length
MESHES = {  # ring blocks: 128 tokens (ring of 4), 256 (ring of 2)
    "none": ("none", {}, False),
    "all_gather": ("all_gather", dict(context=4), False),
    "ulysses": ("ulysses", dict(context_ulysses=2), False),
    "ring": ("ring", dict(context=4), False),
    "usp": ("usp", dict(context=2, context_ulysses=2), False),
}
# (mask, packed): a window shorter than a 128-token ring block (the ring of 4 skips 2 of 3 hops), one
# longer (skips 1), chunks off the blocks' grid (chunk ids as segment ids)
MASKS = {
    "window100": (masks.sliding_window(100), False),
    "chunk192": (masks.chunked(192), False),
    "packed-window200": (masks.sliding_window(200), True),
}
EXTRA = [  # the ring's other regimes: every hop, none, chunk ids combined with documents'
    ("ring", "window300", masks.sliding_window(300), False),
    ("ring", "chunk128", masks.chunked(128), False),
    ("ring", "packed-chunk192", masks.chunked(192), True),
]
# on MaxText's stack the ring's and USP's cases make every other strategy's splash calls and masks
STAGE3 = ("ring", "usp")
CASES = [
    pytest.param(m, name, *MASKS[name], marks=() if m in STAGE3 else pytest.mark.release_repeat, id=f"{m}-{name}")
    for m in MESHES
    for name in MASKS
] + [pytest.param(*case, id=f"{case[0]}-{case[1]}") for case in EXTRA]


def make_plan(mesh_name, mask):
    strategy, mesh, zigzag = MESHES[mesh_name]
    devices = int(np.prod(list(mesh.values()))) if mesh else 1
    model = ModelSpec("local-test", 1, 64, HEADS, HEADS, HEAD_DIM, 128, 256, window=mask.size, local_kind=mask.kind)
    return Plan(
        model=model,
        topology=f"cpu:{devices}",
        seq_len=SEQ,
        global_batch=1,
        mesh=make_mesh(**mesh),
        cp_strategy=strategy,
        load_balance="zigzag" if zigzag else "none",
        block_q=128,
        block_kv=128,
        param_dtype="float32",
        compute_dtype="float32",
    )


@pytest.fixture(scope="module")
def data():
    keys = jax.random.split(jax.random.PRNGKey(7), 4)
    q, k, v, d_out = (jax.random.normal(key, (1, SEQ, HEADS, HEAD_DIM)) for key in keys)
    ids = jnp.asarray(packed_ids(DOCUMENTS, rows=1, length=SEQ, seed=7), jnp.int32)
    return q, k, v, d_out, ids


def reference(q, k, v, mask, ids):
    """Plain softmax attention, a query seeing a key where `mask.allows` (and its document) does."""
    positions = jnp.arange(q.shape[1])
    visible = mask.allows(positions[:, None], positions[None, :])[None]
    if ids is not None:
        visible = visible & (ids[:, :, None] == ids[:, None, :])
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    weights = jax.nn.softmax(jnp.where(visible[:, None], scores, -jnp.inf), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


def run(fn, q, k, v, d_out):
    """The output and (dq, dk, dv), in one compiled program (a third of eager dispatch's time)."""

    def both(q, k, v, d_out):
        out, vjp = jax.vjp(fn, q, k, v)
        return (out, *vjp(d_out))

    return jax.jit(both)(q, k, v, d_out)


@pytest.mark.parametrize("mesh_name,mask_name,mask,packed", CASES)
def test_local_attention_equals_the_dense_masked_reference(data, mesh_name, mask_name, mask, packed):
    q, k, v, d_out, ids = data
    ids = ids if packed else None
    plan = make_plan(mesh_name, mask)
    mesh = build_mesh(plan, jax.devices()[: int(np.prod(plan.mesh_sizes))])
    got = run(lambda a, b, c: context_attention(a, b, c, plan=plan, mesh=mesh, segment_ids=ids), q, k, v, d_out)
    want = run(lambda a, b, c: reference(a, b, c, mask, ids), q, k, v, d_out)
    errors = [float(np.abs(np.asarray(g - w)).max()) for g, w in zip(got, want)]  # numpy's max: NaN fails
    print(f"max abs error {mesh_name} {mask_name} (out, dq, dk, dv): {errors}")
    assert all(e <= 1e-4 for e in errors), errors


def traced_calls(monkeypatch, plan, mask):
    """(query length, key length) of every splash call and the number of ring transfers, traced."""
    calls = []

    def recording(kernel, q, k, v):
        calls.append((q.shape[1], k.shape[1]))
        return original(kernel, q, k, v)

    original = splash.attend_with_lse
    monkeypatch.setattr(splash, "attend_with_lse", recording)
    mesh = build_mesh(plan, jax.devices()[: int(np.prod(plan.mesh_sizes))])
    x = jnp.zeros((1, SEQ, HEADS, HEAD_DIM))
    jaxpr = str(jax.make_jaxpr(lambda a: context_attention(a, a, a, plan=plan, mesh=mesh))(x))
    return calls, len(re.findall(r"\bppermute\[", jaxpr))


HOP_CASES = [
    ("ring", masks.sliding_window(100)),  # 1 of 3 hops
    ("ring", masks.sliding_window(200)),  # 2 of 3
    ("ring", masks.sliding_window(1000)),  # all 3
    ("ring", masks.chunked(128)),  # none: blocks hold whole chunks
    ("ring", masks.chunked(192)),
    ("usp", masks.sliding_window(100)),
]


@pytest.mark.parametrize("mesh_name,mask", HOP_CASES, ids=[f"{m}-{k.describe()}" for m, k in HOP_CASES])
def test_ring_makes_the_hops_the_mask_needs(monkeypatch, mesh_name, mask):
    plan = make_plan(mesh_name, mask)
    ring, block = plan.axis_size("context"), SEQ // plan.axis_size("context")
    hops = int(masks.hops_needed(mask, block, ring))
    calls, transfers = traced_calls(monkeypatch, plan, mask)
    assert calls == [(block, block)] * (1 + hops)  # the own block's call, then one per hop
    assert transfers == 2 * hops  # K and V sent only to the hops that use them


def test_zigzag_order_is_refused_under_a_local_mask():
    config = splash.KernelConfig(128, 128, interpret=True)
    with pytest.raises(CpplanError, match="zigzag order under a local mask .* natural order"):
        AttentionLayout(SEQ, 2, 1, True, config, masks.sliding_window(100))
    with pytest.raises(CpplanError, match="has local layers .* natural order"):
        dataclasses.replace(make_plan("ring", masks.sliding_window(100)), load_balance="zigzag")


def test_bad_input_is_refused_with_the_rule_and_the_fix():
    config = splash.KernelConfig(128, 128, interpret=True)
    zigzag_positions = np.concatenate([np.arange(128), np.arange(384, 512)])[None]
    with pytest.raises(CpplanError, match="straddles two load-balancing chunks.*block_q dividing"):
        wide = splash.KernelConfig(256, 128, interpret=True)
        splash.mask_kernel(masks.sliding_window(64), zigzag_positions, np.zeros(1, int), 256, None, wide)
    with pytest.raises(CpplanError, match="needs the sequence's length"):
        splash.mask_kernel(masks.chunked(100), np.arange(128)[None], np.full(1, 128), 128, None, config)
    chunks = splash.mask_kernel(
        masks.chunked(3), np.arange(1 << 15)[None] + 7, np.full(1, 7), 1 << 15, None, config, seq_len=1 << 20
    )
    documents = jnp.ones((1, 1 << 15), jnp.int32)
    with pytest.raises(CpplanError, match="overflows int32.*chunk that divides the ring block"):
        chunks.with_segments(documents, documents)
    mixed = dataclasses.replace(make_plan("ring", masks.sliding_window(100)).model, layer_pattern="LG", num_layers=2)
    plan = dataclasses.replace(make_plan("ring", masks.sliding_window(100)), model=mixed)
    with pytest.raises(CpplanError, match="mixes layer masks.*layer_mask"):
        attention_layout(plan, interpret=True)
    assert attention_layout(plan, interpret=True, mask=mixed.layer_mask(0)).hops == 1
