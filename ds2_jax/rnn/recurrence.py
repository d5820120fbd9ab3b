"""The RNN layers' recurrence, both directions in one call: one entry point, the
implementation chosen by `kernels.dispatch`.

`bidirectional` takes the input projections (already batch-normed) and the stacked
recurrent matrices and returns the concatenated hidden states. The backward direction
runs over the whole padded sequence in reverse time, with the projections zeroed on
padded frames: with no recurrent bias, a zero input and a zero state give a zero state
(clipped ReLU, GRU and LSTM alike), so each sequence's backward pass starts from zero at
its last valid frame, exactly as if it ran over the valid prefix alone, and no
per-sequence reversal (a gather, whose gradient is a scatter) is needed.

Every implementation in IMPLS maps [B, T, Dx, W] projections (Dx = 1: one projection
shared by all directions) to [B, T, D, H] states, direction 1 in reverse time: 'scan'
(the reference) and 'scan_vjp' (rnn.reference), 'pallas' (kernels.triton_rnn), 'mosaic'
(kernels.mosaic_rnn).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from ds2_jax import batch_axis
from ds2_jax.kernels import dispatch, mosaic_rnn, triton_rnn
from ds2_jax.rnn.reference import scan_recurrence, scan_vjp_recurrence


def pallas_recurrence(xs: jax.Array, recurrent: jax.Array, cell: str, unroll: int = 1) -> jax.Array:
    """Simple recurrence as one persistent Pallas kernel per direction pair (GPU; interpret mode elsewhere)."""
    del unroll  # the kernel loops over time itself
    if cell != "simple":
        raise ValueError(f"rnn_impl='pallas' supports rnn_cell='simple' only, not {cell!r}")
    return triton_rnn.persistent_simple_rnn(xs, recurrent)


def mosaic_recurrence(
    xs: jax.Array,
    recurrent: jax.Array,
    cell: str,
    unroll: int = 1,
    rows_per_call: int | None = None,
    pieces: int | None = None,
) -> jax.Array:
    """Simple recurrence as Mosaic GPU kernels (Hopper, bfloat16); the batch runs in the
    fewest calls of at most `rows_per_call` rows (`mosaic_rnn.row_chunks`), each padded to a
    multiple of 16 rows (zero rows stay zero), its state in `pieces` (None: the kernel's choice)."""
    del unroll
    if cell != "simple":
        raise ValueError(f"rnn_impl='mosaic' supports rnn_cell='simple' only, not {cell!r}")
    if not mosaic_rnn.supported():
        raise ValueError("rnn_impl='mosaic' needs a Hopper GPU (compute capability 9.0); use 'auto'")
    batch = xs.shape[0]
    chunks, rows = mosaic_rnn.row_chunks(batch, recurrent.shape[1], rows_per_call)
    padded = jnp.pad(xs, [(0, chunks * rows - batch)] + [(0, 0)] * (xs.ndim - 1))
    ys = [mosaic_rnn.mosaic_simple_rnn(padded[i : i + rows], recurrent, pieces) for i in range(0, chunks * rows, rows)]
    return jnp.concatenate(ys, axis=0)[:batch]


IMPLS: dict[str, Callable] = {
    "scan": scan_recurrence,
    "scan_vjp": scan_vjp_recurrence,
    "pallas": pallas_recurrence,
    "mosaic": mosaic_recurrence,
}


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
      impl: a name in settings.RNN_IMPLS ('auto': dispatch.choose_rnn decides).
    Returns:
      [B, T, D*H], directions concatenated (forward first); padded frames hold garbage.

    Under parallelism='jit' each device runs the recurrence on its own rows (batch_axis).
    """
    # An iota, not arange()[None, :]: it converts to ONNX with a symbolic length (jax2onnx).
    steps = jax.lax.broadcasted_iota(jnp.int32, projections[0].shape[:2], 1)
    valid = jnp.expand_dims(steps < jnp.expand_dims(lengths, 1), (2, 3))
    xs = jnp.where(valid, jnp.stack(projections, axis=2), jnp.zeros((), projections[0].dtype))

    def run(xs, recurrent):  # on one device's rows: the kernels and their policy see the local batch
        return IMPLS[dispatch.rnn_impl(impl, cell, xs, recurrent)](xs, recurrent, cell, unroll)

    ys = batch_axis.map_batch(run, [xs], [recurrent])  # [B, T, D, H]
    return ys.reshape(ys.shape[:2] + (-1,))
