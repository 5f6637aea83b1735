"""cpu_mesh tier: a fused backward run over chunks of its keys gives the gradients of the unchunked one and
of dense attention, for every kind of kernel table it meets."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from runtime import splash  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

LENGTH, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 512, 4, 2, 32, 128
CHUNKING_HBM = 2**20  # an HBM of 1 MiB: this call's 1 MiB of dq partials run as one chunk per key block
HALVING_HBM = 2**22  # 4 MiB: the partials over an eighth of it ask for 2 chunks of 2 key blocks each


def inputs(batch=1):
    keys = jax.random.split(jax.random.PRNGKey(7), 4)
    rows = (batch * HEADS, batch * KV_HEADS, batch * KV_HEADS, batch * HEADS)
    return [jax.random.normal(key, (r, LENGTH, HEAD_DIM)) for key, r in zip(keys, rows)]


def gradients(make_kernel, hbm_bytes, q, k, v, d_out):
    config = splash.KernelConfig(BLOCK, BLOCK, True, fused_backward=True, hbm_bytes=hbm_bytes)
    kernel = make_kernel(config)
    loss = lambda q, k, v: jnp.sum(splash.attend(kernel, q, k, v) * d_out)
    return kernel.key_chunks(q, k), jax.grad(loss, (0, 1, 2))(q, k, v)


def dense_gradients(q, k, v, d_out, *, causal, ids=None):
    """Gradients of dense attention on one row of folded heads, masked causally and by document ids."""
    group = q.shape[0] // k.shape[0]

    def attention(q, k, v):
        logits = jnp.einsum("hqd,hkd->hqk", q, jnp.repeat(k, group, 0))
        allowed = jnp.ones((LENGTH, LENGTH), bool)
        if causal:
            allowed &= jnp.tril(allowed)
        if ids is not None:
            allowed &= ids[:, None] == ids[None, :]
        weights = jax.nn.softmax(jnp.where(allowed, logits, -1e30), axis=-1)
        return jnp.einsum("hqk,hkd->hqd", weights, jnp.repeat(v, group, 0))

    return jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v) * d_out), (0, 1, 2))(q, k, v)


def assert_close(got, want, tolerance=1e-4):
    for name, a, b in zip("qkv", got, want):
        assert float(np.abs(np.asarray(a - b)).max()) <= tolerance, f"d{name}"


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_key_chunks_give_the_unchunked_and_the_dense_gradients(causal):
    q, k, v, d_out = inputs()
    make = lambda config: (splash.causal_kernel if causal else splash.full_kernel)(LENGTH, LENGTH, config)
    whole, unchunked = gradients(make, 0, q, k, v, d_out)
    chunks, chunked = gradients(make, CHUNKING_HBM, q, k, v, d_out)
    halves, halved = gradients(make, HALVING_HBM, q, k, v, d_out)
    assert (whole, chunks, halves) == (1, LENGTH // BLOCK, 2)
    assert_close(chunked, unchunked, 1e-5)
    assert_close(halved, unchunked, 1e-5)
    assert_close(chunked, dense_gradients(q, k, v, d_out, causal=causal))


def test_key_chunks_of_a_rank_whose_queries_lie_elsewhere():
    """All-gather's per-rank tables: the queries of the first of two ranks under zigzag order (positions
    0..127 and 384..511 of 512), every key; each chunk counts their positions from its first key."""
    positions = np.stack([np.r_[0:128, 384:512], np.r_[128:384]])
    q, k, v, d_out = inputs()
    q, d_out = (jnp.concatenate([x[:, :128], x[:, 384:]], axis=1) for x in (q, d_out))
    make = lambda config: splash.causal_kernel_per_rank(positions, LENGTH, 0, config)
    _, unchunked = gradients(make, 0, q, k, v, d_out)
    chunks, chunked = gradients(make, CHUNKING_HBM // 2, q, k, v, d_out)
    assert chunks == LENGTH // BLOCK
    assert_close(chunked, unchunked, 1e-5)


def test_key_chunks_of_packed_documents():
    """Segment ids prune tiles: each chunk keeps its keys' ids, the queries' whole."""
    ids = jnp.asarray(np.repeat([1, 2, 3], [200, 184, 128]))[None]
    q, k, v, d_out = inputs()
    make = lambda config: splash.causal_kernel(LENGTH, LENGTH, config).with_segments(ids, ids)
    chunks, chunked = gradients(make, CHUNKING_HBM, q, k, v, d_out)
    assert chunks == LENGTH // BLOCK
    assert_close(chunked, dense_gradients(q, k, v, d_out, causal=True, ids=ids[0]))
