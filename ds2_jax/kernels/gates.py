"""The clipped ReLU's gradient gate and the state bookkeeping that the hand-written backward
passes share ('scan_vjp' in rnn.reference, the Triton and Mosaic kernels)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ds2_jax.activation import CLIP


def passes_gradient(y):
    """Where the clipped ReLU passes gradient: strictly inside (0, CLIP)."""
    return (y > 0) & (y < CLIP)


def input_gradient(dzs: jax.Array, shared_input: bool) -> jax.Array:
    """dL/dxs from dL/dz [B, T, D, H]: a projection shared by every direction gets their sum."""
    if not shared_input:
        return dzs
    return jnp.sum(dzs, axis=2, keepdims=True, dtype=jnp.float32).astype(dzs.dtype)


def previous_states(ys: jax.Array, time_axis: int = 1) -> jax.Array:
    """States with directions right after time ([B, T, D, H]; the Mosaic kernels' [T, D, B, H]
    with time_axis=0) -> the state each step started from (h_{t-1}; h_{t+1} for direction 1)."""
    steps, dir_axis = ys.shape[time_axis], time_axis + 1

    def take(x, start, stop, axis):
        return jax.lax.slice_in_dim(x, start, stop, axis=axis)

    zero = jnp.zeros_like(take(ys, 0, 1, time_axis))
    earlier = jnp.concatenate([zero, take(ys, 0, steps - 1, time_axis)], axis=time_axis)
    if ys.shape[dir_axis] == 1:
        return earlier
    later = jnp.concatenate([take(ys, 1, steps, time_axis), zero], axis=time_axis)
    return jnp.concatenate([take(earlier, 0, 1, dir_axis), take(later, 1, ys.shape[dir_axis], dir_axis)], axis=dir_axis)
