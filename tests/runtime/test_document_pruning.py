"""cpu_mesh tier: packed rows prune the runtime's splash tables to the tiles the price counts. For each
kernel a strategy builds (a whole row, a zigzag all-gather rank, natural and zigzag ring hops, a sliding
window's shrunk tables one hop back), the tiles its pruned forward, dQ and dK/dV tables still compute
equal `cost_models.document_tiles.computed_tiles` for the same ids, tile for tile; and a call in which
a query block meets no key block leaves those queries no weight in the ring's merge, which makes no
constant of its accumulators' shape."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.extend.core import Literal  # noqa: E402
from packed_layouts import packed_ids  # noqa: E402

from cost_models import masks  # noqa: E402
from cost_models.document_tiles import computed_tiles  # noqa: E402
from cost_models.documents import histogram, lognormal  # noqa: E402
from runtime import splash  # noqa: E402
from runtime.attention import ring  # noqa: E402
from runtime.layout import token_order  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

SHORT = histogram([40, 100, 300, 1000], [4, 3, 2, 1])
SPREAD = lognormal(150, 1.0)
CONFIG = splash.KernelConfig(128, 128, interpret=True)


def tiles(info, nq: int, nk: int, *, is_dkv: bool) -> np.ndarray:
    """`[q blocks, key blocks]`: the tiles a kernel's table computes, read back from its (shrunk) layout:
    an entry's tile is its row and its data_next (forward, dQ), or its data_next and its column (dK/dV)."""
    if info.block_mask is None:  # no tables: splash computes every tile
        return np.ones((nq, nk), dtype=bool)
    entries = np.asarray(info.block_mask[0]) > 0
    following = np.asarray(info.data_next[0])
    rows, cols = np.nonzero(entries)
    found = np.zeros((nq, nk), dtype=bool)
    found[(following[rows, cols], cols) if is_dkv else (rows, following[rows, cols])] = True
    return found


def none_call(ids):
    """The whole row: a causal kernel."""
    length = ids.shape[1]
    return splash.causal_kernel(length, length, CONFIG), ids, ids


def all_gather_call(ids, *, ranks: int, rank: int):
    """A zigzag all-gather rank: its two chunks' queries against every key in natural order."""
    length = ids.shape[1]
    positions = token_order(length, ranks, True).reshape(ranks, -1)
    kernel = splash.causal_kernel_per_rank(positions, length, rank, CONFIG)
    return kernel, ids[:, positions[rank]], ids


def ring_hop(ids, *, ranks: int, rank: int, source: int, zigzag: bool):
    """A ring hop from an earlier (natural order) or any other (zigzag) rank, as `ring._hop_forward` calls it."""
    blocks = ids[:, token_order(ids.shape[1], ranks, zigzag)].reshape(ids.shape[0], ranks, -1)
    q_ids, kv_ids = blocks[:, rank], blocks[:, source]
    length, half = q_ids.shape[1], q_ids.shape[1] // 2
    if not zigzag:
        return splash.full_kernel(length, length, CONFIG), q_ids, kv_ids
    if source < rank:
        return splash.full_kernel(length, half, CONFIG), q_ids, kv_ids[:, :half]
    return splash.full_kernel(half, length, CONFIG), q_ids[:, half:], kv_ids


def window_hop(ids, *, ranks: int, rank: int, hop: int, window: int):
    """A sliding window's step `hop` blocks back on a ring of natural order: shrunk tables."""
    block = ids.shape[1] // ranks
    positions = np.arange(ids.shape[1]).reshape(ranks, block)
    kernel = splash.mask_kernel(
        masks.sliding_window(window), positions, positions[:, 0] - hop * block, block, rank, CONFIG
    )
    kv = (rank - hop) * block
    return kernel, ids[:, positions[rank]], ids[:, kv : kv + block]


# (name, documents, rows, length, the call)
CASES = [
    ("none", SHORT, 1, 1024, none_call),
    ("none-2rows", SPREAD, 2, 2048, none_call),
    ("all_gather-zigzag-rank0", SHORT, 2, 2048, lambda ids: all_gather_call(ids, ranks=4, rank=0)),
    ("all_gather-zigzag-rank2", SHORT, 1, 2048, lambda ids: all_gather_call(ids, ranks=4, rank=2)),
    ("ring-hop", SHORT, 1, 2048, lambda ids: ring_hop(ids, ranks=2, rank=1, source=0, zigzag=False)),
    ("ring-zigzag-past", SHORT, 2, 4096, lambda ids: ring_hop(ids, ranks=4, rank=3, source=1, zigzag=True)),
    ("ring-zigzag-future", SHORT, 1, 4096, lambda ids: ring_hop(ids, ranks=4, rank=1, source=2, zigzag=True)),
    ("window-hop", SHORT, 2, 2048, lambda ids: window_hop(ids, ranks=4, rank=3, hop=1, window=600)),
]


@pytest.mark.parametrize("name,documents,rows,length,call", CASES, ids=[c[0] for c in CASES])
def test_pruned_tables_compute_the_priced_tiles(name, documents, rows, length, call):
    ids = jnp.asarray(packed_ids(documents, rows=rows, length=length, seed=len(name)).astype(np.int32))
    kernel, q_ids, kv_ids = call(ids)
    nq, nk = q_ids.shape[1] // kernel.block_sizes.block_q, kv_ids.shape[1] // kernel.block_sizes.block_kv
    static = tiles(kernel.fwd, nq, nk, is_dkv=False)
    want = computed_tiles(
        static, np.asarray(q_ids), np.asarray(kv_ids), kernel.block_sizes.block_q, kernel.block_sizes.block_kv
    )
    pruned = kernel.with_segments(q_ids, kv_ids)
    for info, is_dkv in ((pruned.fwd, False), (pruned.dq, False), (pruned.dkv, True)):
        np.testing.assert_array_equal(tiles(info, nq, nk, is_dkv=is_dkv), want)
    assert 0 < want.sum() < static.sum(), (name, want.sum(), static.sum())  # the documents prune some tiles


def test_a_query_block_that_meets_no_key_gets_no_weight_in_the_merge():
    # keys of documents 1 and 2 against queries of documents 2 (first block) and 3 (second): the second
    # query block meets no key block, so splash visits none of its tiles
    q_ids = jnp.asarray(np.repeat([2, 3], 128)[None], jnp.int32)
    kv_ids = jnp.asarray(np.repeat([1, 2], [200, 56])[None], jnp.int32)
    kernel = splash.full_kernel(256, 256, CONFIG).with_segments(q_ids, kv_ids)
    assert np.asarray(kernel.fwd.block_mask[0]).tolist() == [[0, 2], [0, 0]]
    q, k, v = (jax.random.normal(key, (2, 256, 16)) for key in jax.random.split(jax.random.PRNGKey(0), 3))
    out, lse = splash.attend_with_lse(kernel, q, k, v)
    assert np.isneginf(np.asarray(lse[:, 128:])).all()
    # merged with a call in which every query sees every key, only that call counts where this one saw nothing
    other_out, other_lse = splash.attend_with_lse(splash.full_kernel(256, 256, CONFIG), q, k, v)
    merged, merged_lse = ring._merge(other_out.astype(jnp.float32), other_lse, out, lse)
    assert np.isfinite(np.asarray(merged)).all() and np.isfinite(np.asarray(merged_lse)).all()
    np.testing.assert_allclose(merged[:, 128:], other_out[:, 128:], atol=1e-6)
    np.testing.assert_allclose(merged_lse[:, 128:], other_lse[:, 128:], atol=1e-6)
    # where it saw keys, the dense answer over both calls' keys
    scores = jnp.einsum("hqd,hkd->hqk", q, k)
    seen = (q_ids[0, :, None] == kv_ids[0, None, :])[None]
    both = jnp.concatenate([scores, jnp.where(seen, scores, -jnp.inf)], axis=-1)
    dense = jax.nn.softmax(both, axis=-1) @ jnp.concatenate([v, v], axis=1)
    np.testing.assert_allclose(merged[:, :128], dense[:, :128], atol=1e-5)


def _constant_shapes(jaxpr, constant_inputs) -> tuple[list[bool], list[tuple]]:
    """Which outputs of `jaxpr` depend on none of its non-constant inputs, and the shapes of every array
    so made (into jit sub-jaxprs too)."""
    constant = dict(zip(jaxpr.invars, constant_inputs))

    def is_constant(var) -> bool:
        return isinstance(var, Literal) or constant.get(var, False)

    shapes = []
    for eqn in jaxpr.eqns:
        inputs = [is_constant(v) for v in eqn.invars]
        inner = eqn.params.get("jaxpr")
        if inner is not None and hasattr(inner, "jaxpr"):
            outputs, found = _constant_shapes(inner.jaxpr, inputs)
            shapes += found
        else:
            outputs = [all(inputs)] * len(eqn.outvars)
        for var, is_const in zip(eqn.outvars, outputs):
            constant[var] = is_const
            if is_const and var.aval.shape:
                shapes.append(var.aval.shape)
    return [is_constant(v) for v in jaxpr.outvars], shapes


def test_the_merge_makes_no_constant_of_the_accumulators_shape():
    # a hop's merge runs in a branch chosen by the rank alone; a constant there of the output's shape (a
    # zero for the rows that saw nothing) is hoisted by the TPU compiler out of the layer loop, one fp32
    # buffer per hop held through it (115.6 GiB instead of 67.8 on tpu7x, ring 8, 64K × 53, full remat)
    out, lse = jnp.zeros((4, 256, 128)), jnp.zeros((4, 256))
    jaxpr = jax.make_jaxpr(ring._merge)(out, lse, out.astype(jnp.bfloat16), lse).jaxpr
    _, shapes = _constant_shapes(jaxpr, [False] * 4)
    assert out.shape not in shapes and lse.shape not in shapes, shapes

    def zero_for_the_unseen(out, lse, out_h, lse_h):  # the form the test must catch
        return jnp.where(jnp.isfinite(lse_h)[..., None], out_h.astype(jnp.float32), 0.0)

    jaxpr = jax.make_jaxpr(zero_for_the_unseen)(out, lse, out.astype(jnp.bfloat16), lse).jaxpr
    assert out.shape in _constant_shapes(jaxpr, [False] * 4)[1]
