"""The reference recurrences: 'scan' (lax.scan, autodiff'd) and 'scan_vjp' (the same
forward with a hand-written backward pass), both directions in one loop.

The cores are time-major ([T, D, B, W] -> [T, D, B, H], every direction forward in time);
`scan_recurrence` and `scan_vjp_recurrence` wrap them into the [B, T, Dx, W] -> [B, T, D, H]
interface of every implementation (Dx = 1: one projection shared by all directions;
direction 1 in reverse time). `rnn.recurrence.bidirectional` is the layer's entry point.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from ds2_jax.activation import clipped_relu
from ds2_jax.kernels.gates import passes_gradient


def simple_cell(carry, proj_t, rec_t):
    h = clipped_relu(proj_t + rec_t)
    return h, h


def gru_cell(carry, proj_t, rec_t):
    """GRU in PyTorch's gate order (r, z, n), n = tanh(x_n + r * (h U_n))."""
    h = carry
    xr, xz, xn = jnp.split(proj_t, 3, axis=-1)
    hr, hz, hn = jnp.split(rec_t, 3, axis=-1)
    r = jax.nn.sigmoid(xr + hr)
    z = jax.nn.sigmoid(xz + hz)
    n = jnp.tanh(xn + r * hn)
    h = (1.0 - z) * n + z * h
    return h, h


def lstm_cell(carry, proj_t, rec_t):
    """LSTM in PyTorch's gate order (i, f, g, o); carry = (h, c)."""
    _, c = carry
    i, f, g, o = jnp.split(proj_t + rec_t, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h, c), h


CELLS: dict[str, Callable] = {"simple": simple_cell, "gru": gru_cell, "lstm": lstm_cell}


def _hidden(carry):
    return carry[0] if isinstance(carry, tuple) else carry


def _flip_direction_1(xs: jax.Array) -> jax.Array:
    """[T, D, ...]: direction 1 reversed in time (a flip; its gradient is a flip too)."""
    return jnp.stack([xs[:, 0], xs[::-1, 1]], axis=1) if xs.shape[1] == 2 else xs


def time_major(xs: jax.Array, directions: int) -> jax.Array:
    """[B, T, Dx, W] -> [T, D, B, W], direction 1 reversed in time."""
    xs = jnp.broadcast_to(xs, xs.shape[:2] + (directions,) + xs.shape[3:])
    return _flip_direction_1(xs.transpose(1, 2, 0, 3))


def batch_major(ys: jax.Array) -> jax.Array:
    """The inverse of time_major: [T, D, B, H] -> [B, T, D, H]."""
    return _flip_direction_1(ys).transpose(2, 0, 1, 3)


def _time_major_impl(core: Callable) -> Callable:
    """Wraps a time-major recurrence core into the [B, T, Dx, W] -> [B, T, D, H] interface."""

    @functools.wraps(core)
    def impl(xs: jax.Array, recurrent: jax.Array, cell: str, unroll: int = 1) -> jax.Array:
        return batch_major(core(time_major(xs, recurrent.shape[0]), recurrent, cell, unroll))

    return impl


def scan_recurrence_time_major(xs: jax.Array, recurrent: jax.Array, cell: str, unroll: int = 1) -> jax.Array:
    """Reference recurrence (every direction forward in time).

    Args:
      xs: [T, D, B, G*H] time-major projections for D directions (the compute dtype).
      recurrent: [D, H, G*H] recurrent matrices (any float dtype: cast to xs's for the products).
    Returns:
      [T, D, B, H] hidden states in xs's dtype.
    """
    carry0 = initial_carry(cell, recurrent.shape[0], xs.shape[2], recurrent.shape[1], xs.dtype)
    return recurrence_from(xs, recurrent, cell, carry0, unroll)[1]


def initial_carry(cell: str, directions: int, batch: int, hidden: int, dtype):
    """The zero state: [D, B, H] in `dtype` (LSTM: and its float32 cell state)."""
    h0 = jnp.zeros((directions, batch, hidden), dtype)
    return (h0, jnp.zeros((directions, batch, hidden), jnp.float32)) if cell == "lstm" else h0


def recurrence_from(xs: jax.Array, recurrent: jax.Array, cell: str, carry0, unroll: int = 1):
    """(final carry, [T, D, B, H] states) of the recurrence started from `carry0` (initial_carry's
    layout): scan_recurrence_time_major's loop, which ds2_jax.infer.streaming continues chunk by chunk."""
    dtype = xs.dtype
    step_fn = CELLS[cell]

    def step(carry, x_t):
        h = _hidden(carry)
        # Cast here, not before the loop: autodiff then sums the weight gradient over the steps
        # in recurrent's dtype (float32), not in the compute dtype.
        rec = jnp.einsum("dbh,dhw->dbw", h, recurrent.astype(dtype), preferred_element_type=jnp.float32)
        if cell == "lstm":
            carry = (carry[0].astype(jnp.float32), carry[1])
        else:
            carry = carry.astype(jnp.float32)
        carry, out = step_fn(carry, x_t.astype(jnp.float32), rec)
        if cell == "lstm":
            carry = (carry[0].astype(dtype), carry[1])
        else:
            carry = carry.astype(dtype)
        return carry, out.astype(dtype)

    return jax.lax.scan(step, carry0, xs, unroll=unroll)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _simple_rnn(xs: jax.Array, recurrent: jax.Array, unroll: int) -> jax.Array:
    return scan_recurrence_time_major(xs, recurrent, "simple", unroll)


def _simple_rnn_fwd(xs, recurrent, unroll):
    ys = scan_recurrence_time_major(xs, recurrent, "simple", unroll)
    return ys, (ys, recurrent)


def _simple_rnn_bwd(unroll, residuals, dys):
    """Backward scan carries only dL/dh; the weight gradient is one matmul over all steps.

    Autodiff of the plain scan accumulates the [D, H, H] weight gradient inside the loop
    (a full read-modify-write of it every time step); here the loop does one small
    matmul per step and dW = sum_t h_{t-1}^T dz_t runs afterwards as a single GEMM.
    """
    ys, recurrent = residuals
    dtype = ys.dtype
    active = passes_gradient(ys)
    weights = recurrent.astype(dtype)

    def step(g, inputs):
        dy_t, active_t = inputs
        dz = jnp.where(active_t, dy_t.astype(jnp.float32) + g, 0.0)
        g = jnp.einsum("dbw,dhw->dbh", dz.astype(dtype), weights, preferred_element_type=jnp.float32)
        return g, dz.astype(dtype)

    g0 = jnp.zeros(ys.shape[1:], jnp.float32)
    _, dzs = jax.lax.scan(step, g0, (dys, active), reverse=True, unroll=unroll)
    h_prev = jnp.concatenate([jnp.zeros_like(ys[:1]), ys[:-1]], axis=0)
    d_recurrent = jnp.einsum("tdbh,tdbw->dhw", h_prev, dzs, preferred_element_type=jnp.float32)
    return dzs, d_recurrent.astype(recurrent.dtype)  # float32 weights get a float32 gradient


_simple_rnn.defvjp(_simple_rnn_fwd, _simple_rnn_bwd)


def scan_vjp_time_major(xs: jax.Array, recurrent: jax.Array, cell: str, unroll: int = 1) -> jax.Array:
    """Simple (clipped-ReLU) recurrence with a hand-written backward pass; same math as 'scan'."""
    if cell != "simple":
        raise ValueError(f"rnn_impl='scan_vjp' supports rnn_cell='simple' only, not {cell!r}")
    return _simple_rnn(xs, recurrent, unroll)


scan_recurrence = _time_major_impl(scan_recurrence_time_major)
scan_vjp_recurrence = _time_major_impl(scan_vjp_time_major)
