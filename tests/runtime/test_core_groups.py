"""cpu_mesh tier: a splash call split into one vmapped group of (sequence × KV head) rows per core of a
megacore device (`KernelConfig.cores`, `cost_models.compute.splash_row_groups`) computes what the one
call does: the forward, its gradients through splash's own backward, and the ring's explicit backward
(`attend_bwd`), for grouped-query heads whose groups keep their KV heads, causal and full masks, and
packed rows, whose groups are each row's own."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from cost_models.compute import splash_row_groups  # noqa: E402
from runtime import splash  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

SEQ, DIM = 256, 64


def qkv(q_rows: int, kv_rows: int):
    keys = jax.random.split(jax.random.key(0), 3)
    return tuple(
        jax.random.normal(key, (rows, SEQ, DIM), jnp.float32) for key, rows in zip(keys, (q_rows, kv_rows, kv_rows))
    )


def test_row_groups_by_hand():
    # 2 sequences × 3 KV heads split over 2 cores; 3 rows cannot be, so they stay one call
    assert list(splash_row_groups([6, 3, 8], 2)) == [2.0, 1.0, 2.0]
    assert list(splash_row_groups([6, 3], 1)) == [1.0, 1.0]


@pytest.mark.parametrize("make", [splash.causal_kernel, splash.full_kernel])
@pytest.mark.parametrize("rows", [(8, 4), (4, 2)])  # 2 sequences × 4 query / 2 KV heads; one sequence
def test_groups_compute_what_one_call_does(make, rows):
    q, k, v = qkv(*rows)
    one, two = (make(SEQ, SEQ, splash.KernelConfig(128, 128, interpret=True, cores=c)) for c in (1, 2))

    def loss(kernel, q, k, v):
        return jnp.sum(splash.attend(kernel, q, k, v) ** 2)

    np.testing.assert_allclose(splash.attend(two, q, k, v), splash.attend(one, q, k, v), rtol=1e-6, atol=1e-6)
    grads = [jax.grad(loss, argnums=(1, 2, 3))(kernel, q, k, v) for kernel in (one, two)]
    for a, b in zip(*grads):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    out, lse = splash.attend_with_lse(one, q, k, v)
    d_out = jnp.ones_like(out)
    explicit = [splash.attend_bwd(kernel, q, k, v, out, lse, d_out) for kernel in (one, two)]
    for a, b in zip(*explicit):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def pallas_grids(fn, *args) -> list[tuple]:
    """The grids of the Pallas kernels `fn(*args)` traces (nested jaxprs included)."""
    grids = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                grids.append(tuple(eqn.params["grid_mapping"].grid))
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", None)
                if inner is not None and hasattr(inner, "eqns"):
                    walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return grids


def test_the_groups_are_a_vmapped_grid_dimension():
    # the split is what lets a megacore's compiler give each core a group: every kernel's grid, forward
    # and backward, gains a leading (vmapped) dimension of the 2 groups over the same steps in all
    q, k, v = qkv(4, 2)
    one, two = (splash.causal_kernel(SEQ, SEQ, splash.KernelConfig(128, 128, interpret=True, cores=c)) for c in (1, 2))
    grad = lambda kernel: jax.grad(lambda q, k, v: jnp.sum(splash.attend(kernel, q, k, v)), argnums=(0, 1, 2))
    plain, grouped = pallas_grids(grad(one), q, k, v), pallas_grids(grad(two), q, k, v)
    assert len(plain) == len(grouped) >= 2  # the forward and the backward's kernels
    assert all(len(g) == len(p) + 1 and g[0] == 2 and np.prod(g) == np.prod(p) for p, g in zip(plain, grouped))


def test_packed_rows_split_their_own_heads():
    # 2 packed rows of 4 query / 2 KV heads, each with its own documents: each row's heads split in 2
    q, k, v = qkv(8, 4)
    ids = jnp.asarray(np.stack([np.repeat([0, 1], SEQ // 2), np.repeat([0, 1, 2, 3], SEQ // 4)]), dtype=jnp.int32)
    one, two = (
        splash.causal_kernel(SEQ, SEQ, splash.KernelConfig(128, 128, interpret=True, cores=c)).with_segments(ids, ids)
        for c in (1, 2)
    )
    np.testing.assert_allclose(splash.attend(two, q, k, v), splash.attend(one, q, k, v), rtol=1e-6, atol=1e-6)
    loss = lambda kernel: jax.grad(lambda q, k, v: jnp.sum(splash.attend(kernel, q, k, v) ** 2), argnums=(0, 1, 2))
    for a, b in zip(loss(one)(q, k, v), loss(two)(q, k, v)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    plain, grouped = pallas_grids(loss(one), q, k, v), pallas_grids(loss(two), q, k, v)
    assert all(len(g) == len(p) + 1 and g[:2] == (2, 2) for p, g in zip(plain, grouped))
