"""cpu_mesh tier: packed documents through every strategy's attention and through the training loss.

Attention with segment ids (documents of varying length, whose kernels prune the tiles the documents
part) must equal a dense single-device attention under a block-diagonal causal mask (output and
gradients), natural and zigzag order; the model's loss on packed rows must not depend on the
order of the documents in a row (it would, if attention, positions or targets crossed them);
and the packed step must compile for a TPU (tpu_compile tier).
"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from packed_layouts import packed_ids  # noqa: E402
from runtime_steps import float32_plan  # noqa: E402

from cost_models.documents import histogram  # noqa: E402
from cost_models.models import ModelSpec  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from runtime.attention import context_attention  # noqa: E402
from runtime.data import open_dataset  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from runtime.train import Trainer  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

HEADS, KV_HEADS, HEAD_DIM, BATCH = 8, 2, 16, 2
TOLERANCE = 1e-4  # fp32, as the unpacked attention tests


def attention_case(strategy, mesh, seq_len, zigzag, marks=()):
    """One case of `ATTENTION_CASES`, named by its strategy, mesh sizes and balancing."""
    return pytest.param(
        strategy,
        mesh,
        seq_len,
        zigzag,
        marks=marks,
        id=f"{strategy}-{'x'.join(map(str, mesh.values())) or '1'}-{'zigzag' if zigzag else 'plain'}",
    )


# strategy, mesh, seq_len, zigzag: every strategy, with batch rows split over 'data' so that
# each device's rows hold different documents
ATTENTION_CASES = [
    attention_case("none", {}, 256, False),
    attention_case("all_gather", dict(context=4, data=2), 1024, True),
    attention_case("all_gather", dict(context=4, data=2), 1024, False, marks=pytest.mark.release_repeat),
    attention_case("ring", dict(context=4, data=2), 1024, True),
    attention_case("ring", dict(context=2, data=2, tensor=2), 512, False, marks=pytest.mark.release_repeat),
    attention_case("ulysses", dict(context_ulysses=4, data=2), 512, False),
    attention_case("usp", dict(context=2, context_ulysses=2, data=2), 1024, True),
    attention_case("usp", dict(context=2, context_ulysses=2, data=2), 1024, False, marks=pytest.mark.release_repeat),
]


def make_plan(strategy, mesh, seq_len, zigzag, *, model, batch=BATCH):
    topology = "cpu:8" if mesh else "cpu:1"
    balance = "zigzag" if zigzag else "none"
    return float32_plan(
        model, mesh, seq_len=seq_len, batch=batch, topology=topology, strategy=strategy, load_balance=balance
    )


def devices_for(plan):
    return jax.devices()[: plan.topology_spec.num_devices]


# documents of varying length (as `--doc-lengths` gives them): some shorter than a splash block, some
# spanning devices, so the kernels prune tiles, whole query blocks of some ring hops among them
DOCUMENTS = histogram([40, 100, 300, 1000], [4, 3, 2, 1])


def block_diagonal_reference(q, k, v, ids, d_out):
    """Dense attention on one device: causal within each document, nothing across."""
    causal = jnp.tril(jnp.ones((q.shape[1], q.shape[1]), dtype=bool))
    mask = (ids[:, None, :, None] == ids[:, None, None, :]) & causal
    out, vjp = jax.vjp(lambda a, b, c: jax.nn.dot_product_attention(a, b, c, mask=mask), q, k, v)
    return out, vjp(d_out)


@pytest.mark.parametrize("strategy,mesh,seq_len,zigzag", ATTENTION_CASES)
def test_packed_attention_equals_block_diagonal_reference(strategy, mesh, seq_len, zigzag):
    model = ModelSpec("pack-test", 1, 64, HEADS, KV_HEADS, HEAD_DIM, 128, 256)
    plan = make_plan(strategy, mesh, seq_len, zigzag, model=model)
    device_mesh = build_mesh(plan, devices_for(plan))
    keys = jax.random.split(jax.random.PRNGKey(seq_len), 4)
    q = jax.random.normal(keys[0], (BATCH, seq_len, HEADS, HEAD_DIM))
    k, v = (jax.random.normal(key, (BATCH, seq_len, KV_HEADS, HEAD_DIM)) for key in keys[1:3])
    d_out = jax.random.normal(keys[3], q.shape)
    ids = jnp.asarray(packed_ids(DOCUMENTS, rows=BATCH, length=seq_len, seed=seq_len + len(mesh)).astype(np.int32))

    @jax.jit
    def run(q, k, v, d_out):
        attend = lambda a, b, c: context_attention(a, b, c, plan=plan, mesh=device_mesh, segment_ids=ids)
        out, vjp = jax.vjp(attend, q, k, v)
        return out, vjp(d_out)

    out, grads = run(q, k, v, d_out)
    want_out, want_grads = block_diagonal_reference(q, k, v, ids, d_out)
    # numpy's max, as XLA's on CPU skips NaN (a NaN must fail here)
    error = lambda got, want: float(np.abs(np.asarray(got - want)).max())
    errors = {"out": error(out, want_out)}
    errors.update({f"d{n}": error(g, w) for n, g, w in zip("qkv", grads, want_grads)})
    print(f"{strategy} {mesh} seq={seq_len} zigzag={zigzag}: max abs error {errors}")
    assert all(e <= TOLERANCE for e in errors.values()), errors
    # the documents matter: unmasked causal attention is far from the block-diagonal answer
    plain = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    assert float(jnp.abs(plain - want_out).max()) > 100 * TOLERANCE


TRAIN_MODEL = ModelSpec("pack-train-test", 2, 64, HEADS, KV_HEADS, HEAD_DIM, 128, 256)
TRAIN_SEQ = 1024


def swapped_rows(*, seed):
    """Rows of two documents each, as `[A|B]` and as `[B|A]`, with their segment ids."""
    rng = np.random.default_rng(seed)
    firsts = rng.integers(100, TRAIN_SEQ - 100, size=BATCH * 2)  # a first document shorter than a block, too
    firsts[0] = 37
    ab, ba, ids_ab, ids_ba = [], [], [], []
    for length in firsts:
        a = rng.integers(0, TRAIN_MODEL.vocab, length)
        b = rng.integers(0, TRAIN_MODEL.vocab, TRAIN_SEQ + 1 - length)
        ab.append(np.concatenate([a, b]))
        ba.append(np.concatenate([b, a]))
        ids_ab.append(np.repeat([1, 2], [len(a), len(b)]))
        ids_ba.append(np.repeat([1, 2], [len(b), len(a)]))
    return [np.stack(x).astype(np.int32) for x in (ab, ba, ids_ab, ids_ba)]


@pytest.fixture(scope="module")
def rows():
    return swapped_rows(seed=0)


@pytest.mark.parametrize(
    "strategy,mesh,zigzag",
    [
        pytest.param("none", {}, False, marks=pytest.mark.release_repeat),
        ("usp", dict(context=2, context_ulysses=2, data=2), True),
        pytest.param("ring", dict(context=4, fsdp=2), True, marks=pytest.mark.release_repeat),
    ],
)
def test_packed_loss_does_not_depend_on_document_order(rows, strategy, mesh, zigzag, tmp_path):
    """Each document's loss is its own: swapping the two documents of every row leaves the
    mean loss unchanged, while the same rows unpacked (attention across) change it. Then the
    same loss runs on `open_dataset` batches packed by an end-of-document token."""
    batch = 2 * BATCH if mesh else BATCH
    plan = make_plan(strategy, mesh, TRAIN_SEQ, zigzag, model=TRAIN_MODEL, batch=batch)
    trainer = Trainer(plan, build_mesh(plan, devices_for(plan)))
    params, _ = trainer.init(seed=0)
    loss = jax.jit(trainer.loss)
    ab, ba, ids_ab, ids_ba = (x[:batch] for x in rows)
    packed = [float(loss(params, *trainer.prepare_batch(t, i))) for t, i in ((ab, ids_ab), (ba, ids_ba))]
    unpacked = [float(loss(params, *trainer.prepare_batch(t))) for t in (ab, ba)]
    print(f"{strategy} {mesh}: packed {packed}, unpacked {unpacked}")
    assert abs(packed[0] - packed[1]) <= 2e-6 * packed[0]
    assert abs(unpacked[0] - unpacked[1]) > 1e-4

    eos = TRAIN_MODEL.vocab - 1
    stream = np.random.default_rng(1).integers(0, eos, 4 * batch * TRAIN_SEQ)
    stream[np.random.default_rng(2).choice(stream.size, 40, replace=False)] = eos  # ~40 documents
    np.save(tmp_path / "tokens.npy", stream.astype(np.uint16))
    dataset = open_dataset(
        tmp_path / "tokens.npy", seq_len=TRAIN_SEQ, vocab=TRAIN_MODEL.vocab, seed=0, pack=True, eos_id=eos
    )
    step = dataset.batch(1, global_batch=batch)
    assert (step.segment_ids.max(axis=1) > 1).all(), "every row should hold several documents"
    from_data = float(loss(params, *trainer.prepare_batch(step.tokens, step.segment_ids)))
    assert np.isfinite(from_data) and abs(from_data - float(loss(params, *trainer.prepare_batch(step.tokens)))) > 1e-5


@pytest.mark.tpu_compile
@pytest.mark.parametrize(
    "strategy,mesh",
    [
        pytest.param("all_gather", dict(context=4), marks=pytest.mark.release_repeat),
        ("usp", dict(context=2, context_ulysses=2)),  # its layout has Ulysses' all-to-all and the ring's hops
    ],
)
def test_packed_step_compiles_for_tpu(strategy, mesh):
    """Splash with segment ids (mapped over the batch) lowers through Mosaic for a TPU, deviceless."""
    pytest.importorskip("libtpu")
    from cost_models.models import get_model
    from runtime.compile import tpu_devices

    plan = Plan(
        model=get_model("tiny"),
        topology="v5p:2x2x1",
        seq_len=4096,
        global_batch=1,
        mesh=make_mesh(**mesh),
        cp_strategy=strategy,
        load_balance="none" if strategy == "ulysses" else "zigzag",
        block_q=256,
        block_kv=256,
        loss_chunk_tokens=256,
    )
    trainer = Trainer(plan, build_mesh(plan, tpu_devices(plan)))
    compiled = trainer.train_step.lower(*trainer.abstract_state(packed=True)).compile()
    assert "tpu_custom_call" in compiled.as_text()  # the splash kernels, not a fallback
