"""A stride-1 'VALID' 2-D convolution (NHWC input, HWIO kernel) whose gradients are written as
stride-1 'VALID' convolutions in that same layout, on the CPU.

XLA:CPU hands a convolution to its fast library (YNNPACK / Eigen) only in the canonical layout
(`b01f_01io->b01f`). Autodiff's transposed convolutions are in other layouts, which XLA:CPU
canonicalizes at a program's top level but not inside a while loop: there the generic emitter runs
them, ~20x slower (the conv front end's backward pass inside gradient accumulation's micro-batch
loop: benchmarks/results/2026-12-06-cpu-recipe). Here the backward pass is the same sums with the
transposes explicit:

    dx = conv(pad(dy, k - 1), flip(w) with in/out swapped)
    dw = conv(x with channels as the batch, dy with the batch as input channels)

Other platforms keep autodiff's form (`lax.platform_dependent`): cuDNN has its own backward kernels.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

LAYOUT = ("NHWC", "HWIO", "NHWC")
CANONICAL = "b01f_01io->b01f"  # LAYOUT as XLA's HLO writes a convolution's dim_labels


def _conv(x: jax.Array, w: jax.Array, precision) -> jax.Array:
    return jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=LAYOUT, precision=precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _canonical(x: jax.Array, w: jax.Array, precision=None) -> jax.Array:
    return _conv(x, w, precision)


def _forward(x, w, precision):
    return _conv(x, w, precision), (x, w)


def _backward(precision, residuals, dy):
    x, w = residuals
    kh, kw = w.shape[:2]
    padded = jnp.pad(dy, ((0, 0), (kh - 1, kh - 1), (kw - 1, kw - 1), (0, 0)))
    dx = _conv(padded, jnp.flip(w, (0, 1)).transpose(0, 1, 3, 2), precision)
    dw = _conv(x.transpose(3, 1, 2, 0), dy.transpose(1, 2, 0, 3), precision).transpose(1, 2, 0, 3)
    return dx.astype(x.dtype), dw.astype(w.dtype)


_canonical.defvjp(_forward, _backward)


def conv(x: jax.Array, w: jax.Array, precision=None) -> jax.Array:
    """`lax.conv_general_dilated(x, w, (1, 1), 'VALID', dimension_numbers=LAYOUT)`, the same values
    and gradients; on the CPU its gradients are canonical-layout convolutions."""
    return jax.lax.platform_dependent(
        x,
        w,
        cpu=lambda x, w: _canonical(x, w, precision),
        default=lambda x, w: _conv(x, w, precision),
    )
