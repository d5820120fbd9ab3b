"""Recurrences over time for the RNN layers, both directions in one loop.

`bidirectional` takes the input projections (already batch-normed) and the stacked
recurrent matrices and returns the concatenated hidden states. The backward direction
runs over the whole padded sequence in reverse time, with the projections zeroed on
padded frames: with no recurrent bias, a zero input and a zero state give a zero state
(clipped ReLU, GRU and LSTM alike), so each sequence's backward pass starts from zero at
its last valid frame, exactly as if it ran over the valid prefix alone, and no
per-sequence reversal (a gather, whose gradient is a scatter) is needed.

Every implementation maps [B, T, Dx, W] projections (Dx = 1: one projection shared by
all directions) to [B, T, D, H] states, direction 1 in reverse time. `impl` picks one;
'scan' (lax.scan, time-major, both directions stacked) is the reference.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from ds2_jax import batch_axis, mosaic_rnn, pallas_common, persistent_rnn
from ds2_jax.activation import clipped_relu


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
      xs: [T, D, B, G*H] time-major projections for D directions.
      recurrent: [D, H, G*H] recurrent matrices.
    Returns:
      [T, D, B, H] hidden states.
    """
    d, h_size = recurrent.shape[0], recurrent.shape[1]
    b = xs.shape[2]
    dtype = xs.dtype
    step_fn = CELLS[cell]
    h0 = jnp.zeros((d, b, h_size), dtype)
    carry0 = (h0, jnp.zeros((d, b, h_size), jnp.float32)) if cell == "lstm" else h0

    def step(carry, x_t):
        h = _hidden(carry)
        rec = jnp.einsum("dbh,dhw->dbw", h, recurrent, preferred_element_type=jnp.float32)
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

    _, ys = jax.lax.scan(step, carry0, xs, unroll=unroll)
    return ys


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
    active = persistent_rnn.passes_gradient(ys)

    def step(g, inputs):
        dy_t, active_t = inputs
        dz = jnp.where(active_t, dy_t.astype(jnp.float32) + g, 0.0)
        g = jnp.einsum("dbw,dhw->dbh", dz.astype(dtype), recurrent, preferred_element_type=jnp.float32)
        return g, dz.astype(dtype)

    g0 = jnp.zeros(ys.shape[1:], jnp.float32)
    _, dzs = jax.lax.scan(step, g0, (dys, active), reverse=True, unroll=unroll)
    h_prev = jnp.concatenate([jnp.zeros_like(ys[:1]), ys[:-1]], axis=0)
    d_recurrent = jnp.einsum("tdbh,tdbw->dhw", h_prev, dzs, preferred_element_type=jnp.float32)
    return dzs, d_recurrent.astype(recurrent.dtype)


_simple_rnn.defvjp(_simple_rnn_fwd, _simple_rnn_bwd)


def scan_vjp_time_major(xs: jax.Array, recurrent: jax.Array, cell: str, unroll: int = 1) -> jax.Array:
    """Simple (clipped-ReLU) recurrence with a hand-written backward pass; same math as 'scan'."""
    if cell != "simple":
        raise ValueError(f"rnn_impl='scan_vjp' supports rnn_cell='simple' only, not {cell!r}")
    return _simple_rnn(xs, recurrent, unroll)


def pallas_recurrence(xs: jax.Array, recurrent: jax.Array, cell: str, unroll: int = 1) -> jax.Array:
    """Simple recurrence as one persistent Pallas kernel per direction pair (GPU; interpret mode elsewhere)."""
    del unroll  # the kernel loops over time itself
    if cell != "simple":
        raise ValueError(f"rnn_impl='pallas' supports rnn_cell='simple' only, not {cell!r}")
    return persistent_rnn.persistent_simple_rnn(xs, recurrent)


def mosaic_recurrence(xs: jax.Array, recurrent: jax.Array, cell: str, unroll: int = 1) -> jax.Array:
    """Simple recurrence as Mosaic GPU kernels (Hopper, bfloat16); the batch is padded to
    and run in chunks of 16 (zero rows stay zero)."""
    del unroll
    if cell != "simple":
        raise ValueError(f"rnn_impl='mosaic' supports rnn_cell='simple' only, not {cell!r}")
    if not mosaic_rnn.supported():
        raise ValueError("rnn_impl='mosaic' needs a Hopper GPU (compute capability 9.0); use 'auto'")
    batch, chunk = xs.shape[0], mosaic_rnn.BATCH
    padded = jnp.pad(xs, [(0, -batch % chunk)] + [(0, 0)] * (xs.ndim - 1))
    ys = [mosaic_rnn.mosaic_simple_rnn(padded[i:i + chunk], recurrent) for i in range(0, padded.shape[0], chunk)]
    return jnp.concatenate(ys, axis=0)[:batch]


scan_recurrence = _time_major_impl(scan_recurrence_time_major)
scan_vjp_recurrence = _time_major_impl(scan_vjp_time_major)

IMPLS: dict[str, Callable] = {
    "scan": scan_recurrence, "scan_vjp": scan_vjp_recurrence, "pallas": pallas_recurrence, "mosaic": mosaic_recurrence,
    "auto": None}


def resolve_impl(impl: str, cell: str) -> str:
    """'auto' -> the fastest implementation that is correct for `cell` on this backend.

    The persistent kernel runs natively only on GPUs; elsewhere it would be interpreted.
    """
    if impl != "auto":
        return impl
    if cell != "simple":
        return "scan"
    return "scan_vjp" if pallas_common.interpret_mode() else "pallas"


def _impl_for(impl: str, cell: str, xs: jax.Array, recurrent: jax.Array) -> str:
    """resolve_impl for these shapes on this backend.

    'auto' keeps the persistent kernels to batches of at most 16 per device: above that their
    row chunks run one after another and scan_vjp is faster. On Hopper GPUs it takes the
    Mosaic GPU kernels where they run (bfloat16, hidden a multiple of 128), faster than the
    Triton kernel (figures: BUILD_NOTES.md "Current profile"). A kernel
    whose shared memory would not fit is an error when asked for explicitly and scan_vjp
    under 'auto'.
    """
    name = resolve_impl(impl, cell)
    if name != "pallas" or pallas_common.interpret_mode():
        return name
    d, h = recurrent.shape[0], recurrent.shape[1]
    if (impl == "auto" and mosaic_rnn.supported() and xs.shape[0] <= mosaic_rnn.BATCH
            and mosaic_rnn.unsupported(xs.dtype, mosaic_rnn.BATCH, d, h) is None):
        return "mosaic"
    if not persistent_rnn.fits(h, d, recurrent.dtype.itemsize):
        if impl != "auto":
            raise ValueError(f"rnn_impl='pallas': a {recurrent.dtype} recurrence of width {h} does not fit the "
                             "GPU's shared memory; use model.rnn_impl='auto' (falls back to scan_vjp) or bfloat16")
        return "scan_vjp"
    if impl == "auto" and xs.shape[0] > persistent_rnn.ROWS:
        return "scan_vjp"
    return name


def bidirectional(
    projections: list[jax.Array],
    recurrent: jax.Array,
    lengths: jax.Array,
    cell: str = "simple",
    impl: str = "scan",
    unroll: int = 1,
) -> jax.Array:
    """Runs D = recurrent.shape[0] directions (1: forward; 2: forward, backward).

    Args:
      projections: <dtype>[B, T, G*H] each; one (shared by all directions) or one per direction.
      recurrent: [D, H, G*H].
      lengths: <int32>[B] valid frames.
    Returns:
      [B, T, D*H], directions concatenated (forward first); padded frames hold garbage.

    Under parallelism='jit' each device runs the recurrence on its own rows (batch_axis).
    """
    valid = (jnp.arange(projections[0].shape[1])[None, :] < lengths[:, None])[:, :, None, None]
    xs = jnp.where(valid, jnp.stack(projections, axis=2), jnp.zeros((), projections[0].dtype))

    def run(xs, recurrent):  # on one device's rows: the kernels and their policy see the local batch
        chosen = _impl_for(impl, cell, xs, recurrent)
        pallas_common.log_choice("recurrence", impl, chosen, f"{cell}, {xs.shape[0]} rows per device, {xs.dtype}")
        return IMPLS[chosen](xs, recurrent, cell, unroll)

    ys = batch_axis.map_batch(run, [xs], [recurrent])  # [B, T, D, H]
    return ys.reshape(ys.shape[:2] + (-1,))
