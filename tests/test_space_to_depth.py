"""Space-to-depth convolution: the same values and gradients as the strided conv."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ds2_jax import geometry, model, space_to_depth
from tests.test_model import small_cfg

pytestmark = pytest.mark.gpu  # kernel numerics: make test-gpu runs them on a GPU

NHWC = ("NHWC", "HWIO", "NHWC")


@pytest.mark.parametrize(
    "spec, in_channels, shape",
    [
        (geometry.FIRST_CONV, 1, (2, 50, 161)),  # the model's conv 1 (strides 3 x 2)
        (geometry.LATER_CONV, 3, (2, 17, 81)),  # later convs (strides 1 x 2)
        (geometry.FIRST_CONV, 2, (1, 7, 20)),  # fewer frames than the kernel: cropping and zero taps
        (geometry.ConvSpec(kernel=(4, 6), strides=(2, 3), padding=(0, 1)), 2, (1, 9, 13)),  # taps divide evenly
    ],
)
def test_values_and_gradients_match_strided_conv(spec, in_channels, shape):
    rng = np.random.default_rng(0)  # numpy's draws: jax.random compiles a sampler per shape
    x = jnp.asarray(rng.standard_normal(shape + (in_channels,)), jnp.float32)
    w = jnp.asarray(rng.standard_normal(spec.kernel + (in_channels, 5)), jnp.float32)
    padding = [(p, p) for p in spec.padding]

    def values_and_grads(conv, x, w, ct):  # one compiled program per conv, not op by op
        def loss(x, w):
            return jnp.sum(conv(x, w, spec.strides, padding, dimension_numbers=NHWC) * ct)

        return conv(x, w, spec.strides, padding, dimension_numbers=NHWC), jax.grad(loss, argnums=(0, 1))(x, w)

    with jax.default_matmul_precision("highest"):
        ref_shape = jax.eval_shape(
            lambda: jax.lax.conv_general_dilated(x, w, spec.strides, padding, dimension_numbers=NHWC)
        ).shape
        ct = jnp.asarray(rng.standard_normal(ref_shape), jnp.float32)
        ref, ref_grads = jax.jit(values_and_grads, static_argnums=0)(jax.lax.conv_general_dilated, x, w, ct)
        got, got_grads = jax.jit(values_and_grads, static_argnums=0)(space_to_depth.conv, x, w, ct)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(ref))))
    for g, r in zip(got_grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(r))))


def test_folded_kernel_keeps_every_tap_once():
    w = jnp.arange(11 * 41 * 2 * 3, dtype=jnp.float32).reshape(11, 41, 2, 3) + 1
    folded = space_to_depth.fold_kernel(w, (3, 2))
    assert folded.shape == (4, 21, 12, 3)
    np.testing.assert_array_equal(np.sort(np.asarray(folded).ravel())[-w.size :], np.sort(np.asarray(w).ravel()))
    assert int(jnp.sum(folded == 0)) == folded.size - w.size  # the padded taps are zeros


def test_rejects_what_it_cannot_compute():
    x, w = jnp.zeros((1, 8, 8, 1)), jnp.zeros((3, 3, 1, 2))
    with pytest.raises(ValueError, match="explicit padding"):
        space_to_depth.conv(x, w, (2, 2), "SAME")
    with pytest.raises(ValueError, match="dilation"):
        space_to_depth.conv(x, w, (2, 2), [(1, 1), (1, 1)], rhs_dilation=(2, 2))


@pytest.mark.slow  # 15-60 s on 2 idle cores (2026-12-05): make test runs it, test-fast does not
def test_model_gives_the_same_logits_and_gradients_with_either_conv():
    feats = jnp.asarray(np.random.default_rng(1).standard_normal((2, 40, 161)), jnp.float32)
    lengths = jnp.array([40, 23])
    init = functools.partial(model.DeepSpeech2(small_cfg(conv_impl="direct")).init, train=False)
    variables = jax.jit(init)(jax.random.PRNGKey(0), feats, lengths)

    @functools.partial(jax.jit, static_argnums=0)  # one compiled program per conv, not op by op
    def logits_and_grads(impl, params):
        def loss(params):
            out, _ = model.DeepSpeech2(small_cfg(conv_impl=impl)).apply(
                {**variables, "params": params}, feats, lengths, train=False
            )
            return jnp.sum(out**2), out

        return jax.grad(loss, has_aux=True)(params)

    with jax.default_matmul_precision("highest"):
        g_direct, direct = logits_and_grads("direct", variables["params"])
        g_folded, folded = logits_and_grads("space_to_depth", variables["params"])
    np.testing.assert_allclose(folded, direct, rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(g_folded), jax.tree_util.tree_leaves(g_direct)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(float(jnp.max(jnp.abs(b))), 1.0))


def test_config_rejects_unknown_conv_impl():
    with pytest.raises(ValueError, match="conv_impl"):
        model.ModelConfig(conv_impl="fft")
