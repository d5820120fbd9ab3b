"""Persistent recurrence kernel (Pallas, Triton lowering) for the clipped-ReLU RNN.

One kernel launch runs a whole layer over time, in the spirit of Diamos et al. 2016.
The grid has one program per (direction, column block); program (d, j) owns columns
j*cols:(j+1)*cols of direction d, loads its slice of the recurrent matrix once, and per
time step reads the full previous hidden state of its direction from global memory,
computes its columns and publishes them. Direction 1 runs in reverse time. Inputs and
outputs are in the model's batch-major layout ([B, T, D, H]; a shared input projection
is read by both directions), so no reversal, stack or concatenation surrounds the
kernel. A per-direction counter, bumped atomically by every program after it stored its
columns, is the grid-wide barrier between time steps, so all programs must be resident
at once: the grid never exceeds the GPU's SM count.

The backward pass is the same kernel with every direction's time order flipped, on the
transposed matrix (dL/dz_t = active_t * (dL/dy_t + dL/dz_{t+1} W^T)); the weight
gradient is one GEMM over all time steps afterwards, as in `rnn.reference.scan_vjp_time_major`.

In Pallas interpret mode (CPU tests) the grid runs one program after another, so a
program cannot wait for a later one: interpret mode uses one column block per direction.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from ds2_jax.activation import clipped_relu
from ds2_jax.kernels.common import MIN_BLOCK, block_size, interpret_mode, sync_threads
from ds2_jax.kernels.gates import input_gradient, passes_gradient, previous_states

ROWS = MIN_BLOCK  # batch rows per matmul: the MMA tile height


@dataclasses.dataclass(frozen=True)
class KernelOptions:
    """Launch settings (GPU only). cols=None picks the smallest block that fits the SMs."""

    cols: int | None = None
    num_warps: int = 4


def forward_cell(x, rec):
    return clipped_relu(x + rec)


def backward_cell(dy, y, rec):
    return jnp.where(passes_gradient(y), dy + rec, 0.0)


def _recurrence_kernel(
    *refs,
    cell: Callable,
    n_inputs: int,
    reverse: bool,
    transposed: bool,
    cols: int,
    blocks_per_dir: int,
    precision,
    interpret: bool,
):
    """One program: columns [c0, c0 + cols) of direction d, all time steps.

    Rows go through the matmul ROWS at a time, so shared memory holds the weight slice
    and one [ROWS, H] slice of the previous state whatever the batch. The states are kept
    time-major ([T, D, B, H]), so each step's state is one contiguous block; the previous
    state is read with volatile loads (bypassing L1: the acquire on the barrier's atomic
    orders plain loads too, but volatile ones measured faster).
    """
    in_refs, (w_ref, _, out_ref, count_ref) = refs[:n_inputs], refs[n_inputs:]
    batch, n_steps = in_refs[0].shape[0], in_refs[0].shape[1]
    chunks = [pl.ds(r, ROWS) for r in range(0, batch, ROWS)]
    pid = pl.program_id(0)
    d = pid // blocks_per_dir
    backwards_in_time = (d % 2) ^ int(reverse)  # 0 or 1: direction 1 runs in reverse time
    col = pl.ds(pl.multiple_of((pid % blocks_per_dir) * cols, cols), cols)
    every = pl.ds(0, out_ref.shape[3])  # all hidden units
    # This program's slice of the recurrent matrix, loaded once for all time steps.
    w = w_ref[d, col, every] if transposed else w_ref[d, every, col]

    def state(rows, t, cols):  # index of the states of `rows` and `cols` at time t
        return t, d, rows, cols

    def time_of(step):
        # Arithmetic, not jnp.where: Pallas's Triton lowering turned where(pred, T - 1, 0)
        # with literal branches into a constant 0 (seen with jax 0.10.2 and 0.11.2).
        return step + backwards_in_time * (n_steps - 1 - 2 * step)

    def load_inputs(t, rows):
        # an input with one direction (a shared projection) is read by every direction
        return [r[rows, t, d if r.shape[2] > 1 else 0, col].astype(jnp.float32) for r in in_refs]

    def publish():
        sync_threads(interpret)  # every thread's store is issued before the release below
        plt.atomic_add(count_ref, (d,), jnp.int32(1))

    def wait_for(step):
        # Spin until every program of direction d has published step - 1. The target rides
        # in the carry (interpret mode wants no consts in the loop).
        def poll(carry):
            _, target = carry
            return plt.atomic_add(count_ref, (d,), target * 0), target

        jax.lax.while_loop(lambda carry: carry[0] < carry[1], poll, (jnp.int32(-1), blocks_per_dir * step))
        sync_threads(interpret)

    def chunk_step(step, t, rows, x):
        prev = plt.load(out_ref.at[state(rows, time_of(step - 1), every)], volatile=True)
        rec = jax.lax.dot_general(
            prev,
            w,
            (((1,), (1 if transposed else 0,)), ((), ())),
            precision=precision,
            preferred_element_type=jnp.float32,
        )
        out_ref[state(rows, t, col)] = cell(*x, rec).astype(out_ref.dtype)

    def step_fn(step, carry):
        t = time_of(step)
        if batch == ROWS:
            # Inputs do not depend on the other programs: issue their loads before waiting.
            x = load_inputs(t, chunks[0])
            wait_for(step)
            chunk_step(step, t, chunks[0], x)
        else:  # a loop (not unrolled), so the chunks share one shared-memory buffer
            wait_for(step)

            def one_chunk(c, unused):
                rows = pl.ds(pl.multiple_of(c * ROWS, ROWS), ROWS)
                chunk_step(step, t, rows, load_inputs(t, rows))
                return unused

            jax.lax.fori_loop(0, batch // ROWS, one_chunk, 0)
        publish()
        return carry

    t0 = time_of(0)
    for rows in chunks:
        out_ref[state(rows, t0, col)] = cell(*load_inputs(t0, rows), jnp.zeros((ROWS, cols), jnp.float32)).astype(
            out_ref.dtype
        )
    publish()
    jax.lax.fori_loop(1, n_steps, step_fn, 0)


def column_block(hidden: int, directions: int, cores: int) -> int:
    """Smallest power-of-two column block whose grid fits on `cores` SMs at once."""
    cols = MIN_BLOCK
    while directions * (hidden // cols) > cores and cols < hidden:
        cols *= 2
    return cols


def fits(hidden: int, directions: int, itemsize: int, sms: int, shared_memory: int) -> bool:
    """Whether the kernel's shared memory (weight slice + one row chunk) fits in `shared_memory`
    bytes per block on a GPU with `sms` SMs."""
    hidden = block_size(hidden)
    return (column_block(hidden, directions, sms) + ROWS) * hidden * itemsize <= shared_memory


def _run(cell, inputs, weights, *, reverse: bool, transposed: bool, options: KernelOptions):
    """Runs the kernel; inputs are [B, T, D or 1, H] arrays, weights [D, H, H]; returns [B, T, D, H]."""
    directions, hidden = weights.shape[0], weights.shape[1]
    interpret = interpret_mode()
    cols = options.cols
    if interpret:
        cols = hidden
    elif cols is None:
        cols = column_block(hidden, directions, getattr(jax.devices()[0], "core_count", 1))  # SMs
    blocks_per_dir = hidden // cols
    out_dtype = inputs[0].dtype
    precision = jax.lax.Precision.HIGHEST if out_dtype == jnp.float32 else None
    kernel = functools.partial(
        _recurrence_kernel,
        cell=cell,
        n_inputs=len(inputs),
        reverse=reverse,
        transposed=transposed,
        cols=cols,
        blocks_per_dir=blocks_per_dir,
        precision=precision,
        interpret=interpret,
    )
    batch, n_steps = inputs[0].shape[:2]
    out_shape = (n_steps, directions, batch, hidden)  # time-major inside the kernel
    counts = jnp.zeros((directions,), jnp.int32)
    out, _ = pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct(out_shape, out_dtype), jax.ShapeDtypeStruct(counts.shape, counts.dtype)),
        grid=(directions * blocks_per_dir,),
        input_output_aliases={len(inputs) + 1: 1},
        compiler_params=plt.CompilerParams(num_warps=options.num_warps, num_stages=1),
        interpret=interpret,
        name="persistent_rnn_backward" if reverse else "persistent_rnn_forward",
    )(*inputs, weights, counts)
    return out.transpose(2, 0, 1, 3)  # -> [B, T, D, H]


def persistent_simple_rnn(xs: jax.Array, recurrent: jax.Array, options: KernelOptions = KernelOptions()) -> jax.Array:
    """Clipped-ReLU recurrence h_t = min(max(x_t + h_{t-1} W, 0), 20); direction 1 runs
    from the last frame to the first (h_t from h_{t+1}).

    Runs as a Triton kernel on GPUs and in Pallas interpret mode elsewhere. Batch and
    hidden sizes are zero-padded to powers of two: zero units and rows stay zero and
    never reach the real ones.

    Args:
      xs: [B, T, D or 1, H] input projections (1: shared by the D directions).
      recurrent: [D, H, H] recurrent matrices.
      options: launch settings (GPU).
    Returns:
      [B, T, D, H] hidden states in xs.dtype.
    """
    batch, _, _, hidden = xs.shape
    pad_b, pad_h = block_size(batch) - batch, block_size(hidden) - hidden
    if pad_b or pad_h:
        xs = jnp.pad(xs, ((0, pad_b), (0, 0), (0, 0), (0, pad_h)))
        recurrent = jnp.pad(recurrent, ((0, 0), (0, pad_h), (0, pad_h)))
    shared_input = xs.shape[2] < recurrent.shape[0]
    return _persistent(xs, recurrent, options, shared_input)[:batch, ..., :hidden]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _persistent(xs: jax.Array, recurrent: jax.Array, options: KernelOptions, shared_input: bool) -> jax.Array:
    """shared_input: xs has one direction, read by all (static, for the backward's gradient shape)."""
    del shared_input
    return _run(forward_cell, [xs], recurrent.astype(xs.dtype), reverse=False, transposed=False, options=options)


def _fwd(xs, recurrent, options, shared_input):
    ys = _persistent(xs, recurrent, options, shared_input)
    return ys, (ys, recurrent)


def _bwd(options, shared_input, residuals, dys):
    ys, recurrent = residuals
    dzs = _run(
        backward_cell,
        [dys.astype(ys.dtype), ys],
        recurrent.astype(ys.dtype),
        reverse=True,
        transposed=True,
        options=options,
    )
    d_recurrent = jnp.einsum("btdh,btdw->dhw", previous_states(ys), dzs, preferred_element_type=jnp.float32)
    return input_gradient(dzs, shared_input), d_recurrent.astype(recurrent.dtype)


_persistent.defvjp(_fwd, _bwd)
