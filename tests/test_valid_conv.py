"""valid_conv.conv: the values and gradients of lax's stride-1 'VALID' convolution, and on the CPU
gradients written as canonical-layout convolutions (what XLA:CPU compiles inside a loop:
test_accumulate.py holds the compiled step to it); other platforms keep autodiff's form."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ds2_jax import valid_conv


def reference(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=valid_conv.LAYOUT)


def normal(seed, *shapes):
    """float32 arrays of standard normal draws (numpy's: jax.random compiles a sampler per shape)."""
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(shape), jnp.float32) for shape in shapes]


def loss(conv):
    """A loss whose cotangent differs at every output element (a wrong index shows)."""

    def f(x, w):
        y = conv(x, w).astype(jnp.float32)
        return jnp.sum(y * jnp.cos(jnp.arange(y.size, dtype=jnp.float32).reshape(y.shape)))

    return f


@pytest.mark.parametrize(
    "x_shape, w_shape",
    [
        ((1, 9, 11, 1), (1, 1, 1, 1)),  # a 1 x 1 kernel: no padding of the cotangent
        ((3, 17, 23, 6), (4, 21, 6, 5)),  # conv 1's folded shape: wide in frequency
        ((2, 12, 10, 3), (5, 2, 3, 7)),  # tall kernel, more outputs than inputs
        ((2, 8, 8, 4), (8, 8, 4, 2)),  # the kernel covers the whole input: one output per row
    ],
)
def test_values_and_gradients_are_lax_convs(x_shape, w_shape):
    x, w = normal(sum(x_shape) + sum(w_shape), x_shape, w_shape)
    with jax.default_matmul_precision("highest"):
        np.testing.assert_allclose(jax.jit(valid_conv.conv)(x, w), jax.jit(reference)(x, w), rtol=1e-5, atol=1e-5)
        got = jax.jit(jax.grad(loss(valid_conv.conv), (0, 1)))(x, w)
        want = jax.jit(jax.grad(loss(reference), (0, 1)))(x, w)
    for name, a, b in zip(("dx", "dw"), got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(b))), err_msg=name)


def test_bfloat16_gradients_are_bfloat16_and_as_close_to_float32_as_lax():
    x, w = normal(0, (2, 14, 20, 6), (4, 7, 6, 8))
    with jax.default_matmul_precision("highest"):
        truth = jax.jit(jax.grad(loss(reference), (0, 1)))(x, w)
    half = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    mine = jax.jit(jax.grad(loss(valid_conv.conv), (0, 1)))(*half)
    lax = jax.jit(jax.grad(loss(reference), (0, 1)))(*half)
    for a, b, t in zip(mine, lax, truth):
        assert a.dtype == b.dtype == jnp.bfloat16

        def error(g):
            return float(jnp.linalg.norm(g.astype(jnp.float32) - t) / jnp.linalg.norm(t))

        assert error(a) <= 1.5 * error(b) + 1e-3, (error(a), error(b))


def _scanned_gradient(conv):
    """dL/dw summed and dL/dx of each step over a lax.scan (as accumulation's loop), L needing the
    forward's values too."""

    def squared(x, w):
        return jnp.sum(jnp.square(conv(x, w)))

    def accumulated(x, w):
        def one(total, xi):
            dx, dw = jax.grad(squared, (0, 1))(xi, w)
            return total + dw, dx

        return jax.lax.scan(one, jnp.zeros_like(w), x)

    return jax.jit(accumulated)


def test_other_platforms_keep_autodiffs_convolutions():
    """Lowered for CUDA (no GPU needed), the gradient is lax's: its transposed convolutions keep
    their own dimension orders, which cuDNN's backward kernels take."""
    x, w = jnp.ones((3, 2, 17, 23, 6)), jnp.ones((4, 21, 6, 5))
    text = _scanned_gradient(valid_conv.conv).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    control = _scanned_gradient(reference).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    convs = re.findall(r"stablehlo.convolution.*?dim_numbers = (\[[^\]]*\]x\[[^\]]*\]->\[[^\]]*\])", text)
    want = re.findall(r"stablehlo.convolution.*?dim_numbers = (\[[^\]]*\]x\[[^\]]*\]->\[[^\]]*\])", control)
    assert sorted(convs) == sorted(want) and len(set(convs)) > 1, (convs, want)
