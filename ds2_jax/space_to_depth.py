"""Strided 2-D convolution computed as a stride-1 convolution on space-to-depth input.

Conv 1 of DS2 reads one input channel with strides 3 x 2: cuDNN has no tensor-core
kernel for a single channel. Folding each stride x stride patch of the input into
channels (space to depth) and the kernel the same way gives the identical sum of
products as a stride-1 convolution with strides[0] * strides[1] times the channels:

    y[i, j] = sum_{a, b} x[s i + a, r j + b] w[a, b],  a = s u + p, b = r v + q
            = sum_{u, v, (p, q)} x'[i + u, j + v, (p, q)] w'[u, v, (p, q)]

with w' zero where a or b runs past the kernel. `conv` has the signature of
`jax.lax.conv_general_dilated` as flax's `nn.Conv` calls it, so the parameter (and a
checkpoint) keeps its [kt, kf, C, O] shape whichever way the model computes.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from ds2_jax import valid_conv


def _taps(kernel: int, stride: int) -> int:
    return -(-kernel // stride)


def fold_kernel(kernel: jax.Array, strides: Sequence[int]) -> jax.Array:
    """[kt, kf, C, O] -> [ceil(kt / s), ceil(kf / r), s * r * C, O], zero-padded taps."""
    (kt, kf, c, o), (s, r) = kernel.shape, strides
    ut, uf = _taps(kt, s), _taps(kf, r)
    k = jnp.pad(kernel, ((0, ut * s - kt), (0, uf * r - kf), (0, 0), (0, 0)))
    return k.reshape(ut, s, uf, r, c, o).transpose(0, 2, 1, 3, 4, 5).reshape(ut, uf, s * r * c, o)


def fold_input(
    x: jax.Array, strides: Sequence[int], padding: Sequence[tuple[int, int]], kernel_shape: Sequence[int]
) -> jax.Array:
    """[B, T, F, C] -> [B, T', F', s * r * C]: the padded input cut (or zero-extended) to
    exactly the rows the folded kernel reads, then each s x r patch folded into channels."""
    b, *spatial, c = x.shape
    edges = [(0, 0, 0)]
    folded = []
    for size, (lo, hi), k, s in zip(spatial, padding, kernel_shape, strides):
        out = (size + lo + hi - k) // s + 1
        rows = s * (out + _taps(k, s) - 1)
        edges.append((lo, rows - lo - size, 0))  # a negative high edge crops
        folded.append(rows // s)
    x = jax.lax.pad(x, jnp.zeros((), x.dtype), edges + [(0, 0, 0)])
    (s, r), (t, f) = strides, folded
    return x.reshape(b, t, s, f, r, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, t, f, s * r * c)


def conv(
    lhs: jax.Array,
    rhs: jax.Array,
    window_strides: Sequence[int],
    padding,
    *,
    lhs_dilation=None,
    rhs_dilation=None,
    dimension_numbers=None,
    feature_group_count: int = 1,
    precision=None,
    **unused,
) -> jax.Array:
    """Drop-in for `lax.conv_general_dilated` on NHWC input, HWIO kernel, explicit padding."""
    del unused
    expected = jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, ("NHWC", "HWIO", "NHWC"))
    if (
        lhs.ndim != 4
        or isinstance(padding, str)
        or feature_group_count != 1
        or any(d not in (None, 1) and tuple(d) != (1, 1) for d in (lhs_dilation, rhs_dilation))
        or (
            dimension_numbers is not None
            and jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers) != expected
        )
    ):
        raise ValueError(
            "space_to_depth.conv takes a 2-D NHWC/HWIO convolution with explicit padding, "
            "no dilation and one feature group"
        )
    x = fold_input(lhs, window_strides, padding, rhs.shape[:2])
    return valid_conv.conv(x, fold_kernel(rhs, window_strides), precision)
