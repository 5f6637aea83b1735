"""cpu_mesh tier: RoPE's rotation and its hand-written gradient, the rotation by minus the angle, which
runs in the gradient's dtype (autodiff of the fp32 rotation would hold an fp32 copy of dq and dk)."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jaxpr_equations import all_equations  # noqa: E402

from runtime.model import ROPE_THETA, rope  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

SHAPE = (2, 16, 4, 64)  # [batch, seq, heads, head_dim]


def rotated(x: np.ndarray, positions: np.ndarray, sign: float) -> np.ndarray:
    """x rotated by `sign` × RoPE's angles in float64, written out: (x1, x2) → (x1 c − x2 s, x2 c + x1 s)."""
    half = x.shape[-1] // 2
    angle = positions[..., None, None] * ROPE_THETA ** (-np.arange(half) / half)
    cos, sin = np.cos(angle), sign * np.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


@pytest.fixture
def case():
    x, grad = (np.asarray(jax.random.normal(k, SHAPE)) for k in jax.random.split(jax.random.PRNGKey(0), 2))
    positions = np.broadcast_to(np.arange(SHAPE[1]) * 37, SHAPE[:2])
    return x, grad, positions


def test_the_rotation_and_its_gradient_are_the_angle_and_minus_the_angle(case):
    x, grad, positions = case
    out, vjp = jax.vjp(lambda x: rope(x, jnp.asarray(positions)), jnp.asarray(x))
    # fp32 angles at positions up to 555 are off by up to 555 × 2^-24 relative
    np.testing.assert_allclose(out, rotated(x, positions, 1.0), atol=2e-4)
    np.testing.assert_allclose(vjp(jnp.asarray(grad))[0], rotated(grad, positions, -1.0), atol=2e-4)


def test_a_bf16_gradient_is_rotated_in_bf16(case):
    x, grad, positions = case
    bf16 = jnp.bfloat16

    def backward(x, grad):
        return jax.vjp(lambda x: rope(x, jnp.asarray(positions)), x)[1](grad)[0]

    dx = backward(jnp.asarray(x, bf16), jnp.asarray(grad, bf16))
    assert dx.dtype == bf16
    # within one bf16 step (2^-8 relative) of the exact rotation of the same bf16 gradient
    exact = rotated(np.asarray(jnp.asarray(grad, bf16), np.float64), positions, -1.0)
    np.testing.assert_allclose(np.asarray(dx, np.float64), exact, rtol=2**-7, atol=2**-7)
    # no fp32 value of the gradient's shape, or of its halves': the rotation itself runs in bf16
    gradient_shaped = {SHAPE, SHAPE[:-1] + (SHAPE[-1] // 2,)}
    _, vjp = jax.vjp(lambda x: rope(x, jnp.asarray(positions)), jnp.asarray(x, bf16))
    jaxpr = jax.make_jaxpr(vjp)(jnp.asarray(grad, bf16)).jaxpr
    made = [v.aval for eqn in all_equations(jaxpr) for v in eqn.outvars if v.aval.shape in gradient_shaped]
    assert made and all(aval.dtype == bf16 for aval in made), made
