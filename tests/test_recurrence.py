"""Fast recurrence implementations against the lax.scan reference: outputs and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ds2_jax import recurrence


def problem(dtype, t=23, d=2, b=3, h=16, seed=0):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    xs = jax.random.normal(k1, (t, d, b, h)) * 2.0
    w = jax.random.normal(k2, (d, h, h)) / np.sqrt(h)
    dys = jax.random.normal(k3, (t, d, b, h))
    return xs.astype(dtype), w.astype(dtype), dys.astype(dtype)


@pytest.mark.parametrize("dtype, rtol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
@pytest.mark.parametrize("unroll", [1, 4])
def test_scan_vjp_matches_scan(dtype, rtol, unroll):
    xs, w, dys = problem(dtype)

    def loss(impl, xs, w):
        ys = recurrence.IMPLS[impl](xs, w, "simple", unroll)
        return jnp.sum(ys.astype(jnp.float32) * dys.astype(jnp.float32)), ys

    (l_ref, y_ref), g_ref = jax.value_and_grad(lambda a, b: loss("scan", a, b), argnums=(0, 1), has_aux=True)(xs, w)
    (l_new, y_new), g_new = jax.value_and_grad(lambda a, b: loss("scan_vjp", a, b), argnums=(0, 1), has_aux=True)(xs, w)
    np.testing.assert_allclose(np.asarray(y_new, np.float32), np.asarray(y_ref, np.float32), rtol=rtol, atol=rtol)
    for a, b in zip(g_new, g_ref):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        # relative to the gradient's scale: bf16 rounding differs between the two orders
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * np.abs(b).max())


def test_auto_picks_scan_for_gated_cells():
    assert recurrence.resolve_impl("auto", "simple") == "scan_vjp"
    assert recurrence.resolve_impl("auto", "gru") == "scan"
    with pytest.raises(ValueError, match="simple"):
        recurrence.scan_vjp_recurrence(jnp.zeros((2, 1, 1, 6)), jnp.zeros((1, 2, 6)), "gru")
