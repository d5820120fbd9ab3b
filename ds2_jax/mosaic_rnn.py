"""Persistent clipped-ReLU recurrence as Mosaic GPU kernels (Hopper; `model.rnn_impl='mosaic'`).

Cluster pairs split the contraction: CTA (d, j, r) holds its half (r) of the K rows of
64 output columns (j) of direction d's matrix (128 KB of shared memory, loaded once by
TMA). Per time step it TMA-loads only its half of the previous state, multiplies with
wgmma (M = 64 columns, N = batch 16, K = hidden / 2), and rank 1 hands its fp32 partial
to rank 0 through distributed shared memory. Rank 0 adds the inputs, applies the cell,
stores the step's columns and bumps the direction's step counter, a grid-global GMEM
semaphore that every CTA of the direction polls before the next step. States live
[T, D, H, B] (hidden-major), so a step's tile is the wgmma B operand as stored; callers
transpose from and to the model's [B, T, D, H].

The backward pass is the same kernel on the untransposed matrices with every direction's
time order flipped (dL/dz_t = active_t * (dL/dy_t + dL/dz_{t+1} W^T)), its one input dL/dy
with -inf where the gate is shut; the weight gradient is one GEMM over all time steps, as
in `persistent_rnn`.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxlib.mlir.dialects import nvvm

from ds2_jax.persistent_rnn import forward_cell, input_gradient, passes_gradient, previous_states

COLS = 64  # wgmma M: the columns one CTA pair computes
BATCH = 16  # wgmma N: the batch the kernel takes
HIDDEN_MULTIPLE = 2 * COLS


def _swizzled(minor: int, dtype) -> tuple:
    """Tiling and swizzle of a [rows, minor] shared-memory operand (one swizzle for both wgmma operands)."""
    return (plgpu.TilingTransform((8, minor)), plgpu.SwizzleTransform(minor * jnp.dtype(dtype).itemsize))


def _signal_after_stores(sem_ref, value: int) -> None:
    """Adds `value` to a GMEM semaphore once this warpgroup's global stores are visible to
    readers that poll it and then TMA-load them.

    pl.semaphore_signal adds with a relaxed atomic and fences after it, which does not order
    the stores before the add: a poller could see the count before the data.
    """

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),))
    def signal(ctx, sem):
        del ctx
        nvvm.fence_proxy(nvvm.ProxyKind.async_global)  # generic-proxy stores before async-proxy (TMA) reads
        mgpu_utils.warpgroup_barrier()
        mgpu_utils.SemaphoreRef(mgpu_utils.memref_ptr(sem)).signal(value, memory_scope="gpu")  # release add

    signal(sem_ref)


@plgpu.inline_mgpu()
def _async_proxy_fence(ctx) -> None:
    """Orders what an acquiring semaphore read saw before this thread's later TMA loads."""
    del ctx
    nvvm.fence_proxy(nvvm.ProxyKind.async_global)


def _kernel(in_gmem, w_gmem, out_gmem, w_smem, h_smem, in_smem, part_smem, w_bar, h_bar, in_bar, pair_bar, *,
            cell: Callable, reverse: bool, n_steps: int, blocks: int, k_half: int, directions: int):
    # Steps published per direction: a grid-global semaphore, zeroed by Pallas for every call.
    count = pl.get_global(plgpu.SemaphoreType.REGULAR((directions,)))
    g, r = jax.lax.axis_index("g"), jax.lax.axis_index("c")
    d, j = g // blocks, g % blocks
    cols = pl.ds(j * COLS, COLS)
    flip = d if not reverse else 1 - d  # 1: this direction walks time backwards

    def time_of(step):
        return step + flip * (n_steps - 1 - 2 * step)

    def wait_for(sem, target):
        jax.lax.while_loop(lambda _: pl.semaphore_read(sem) < target, lambda c: c, 0)
        _async_proxy_fence()

    plgpu.copy_gmem_to_smem(w_gmem.at[d, cols, pl.ds(r * k_half, k_half)], w_smem, w_bar)
    plgpu.barrier_wait(w_bar)

    def load_input(t):  # an input with one direction (a shared projection) serves both
        plgpu.copy_gmem_to_smem(in_gmem.at[t, d if in_gmem.shape[1] > 1 else 0, cols, :], in_smem, in_bar)

    def input_tile():
        plgpu.barrier_wait(in_bar)
        return plgpu.load(in_smem, (), layout=plgpu.Layout.WGMMA).astype(jnp.float32)

    def publish(h, t):
        out_gmem.at[t, d, cols, :][...] = h.astype(out_gmem.dtype)
        plgpu.commit_smem()  # the input reads are done before the next step's TMA overwrites them
        _signal_after_stores(count.at[d], 1)

    @pl.when(r == 0)
    def _():
        t0 = time_of(0)
        load_input(t0)
        publish(cell(input_tile(), jnp.zeros((COLS, BATCH), jnp.float32)), t0)

    def step_fn(step, carry):
        t, t_prev = time_of(step), time_of(step - 1)

        @pl.when(r == 0)
        def _():
            load_input(t)  # independent of the other CTAs: in flight while we wait

        wait_for(count.at[d], blocks * step)
        plgpu.copy_gmem_to_smem(out_gmem.at[t_prev, d, pl.ds(r * k_half, k_half), :], h_smem, h_bar)
        plgpu.barrier_wait(h_bar)

        def product(acc_ref):
            plgpu.wgmma(acc_ref, w_smem, h_smem)
            plgpu.wgmma_wait(0)
            return acc_ref[...]

        rec = pl.run_scoped(product, plgpu.ACC((COLS, BATCH), jnp.float32))

        @pl.when(r == 1)
        def _():
            plgpu.cluster_ref(part_smem, {"c": 0})[...] = rec
            plgpu.commit_smem()  # every thread's store lands before the (single-thread) arrive

        plgpu.barrier_arrive(pair_bar)
        plgpu.barrier_wait(pair_bar)

        @pl.when(r == 0)
        def _():
            partial = plgpu.load(part_smem, (), layout=plgpu.Layout.WGMMA)
            publish(cell(input_tile(), rec + partial), t)

        return carry

    jax.lax.fori_loop(1, n_steps, step_fn, 0)


def _run(cell: Callable, xs: jax.Array, weights: jax.Array, *, reverse: bool) -> jax.Array:
    """xs: [T, D or 1, H, B] cell inputs; weights: [D, H_out, H_in] (A = rows of output columns). -> [T, D, H, B]."""
    n_steps, _, hidden, batch = xs.shape
    directions = weights.shape[0]
    dtype = xs.dtype
    k_half, blocks = hidden // 2, hidden // COLS
    kernel = plgpu.kernel(
        functools.partial(_kernel, cell=cell, reverse=reverse, n_steps=n_steps, blocks=blocks, k_half=k_half,
                          directions=directions),
        out_type=jax.ShapeDtypeStruct((n_steps, directions, hidden, batch), dtype),
        scratch_types=[
            plgpu.SMEM((COLS, k_half), dtype, transforms=_swizzled(batch, dtype)),
            plgpu.SMEM((k_half, batch), dtype, transforms=_swizzled(batch, dtype)),
            plgpu.SMEM((COLS, batch), dtype, transforms=_swizzled(batch, dtype)),
            plgpu.SMEM((COLS, batch), jnp.float32),
            plgpu.Barrier(),
            plgpu.Barrier(),
            plgpu.Barrier(),
            plgpu.ClusterBarrier(collective_axes=("c",)),
        ],
        grid=(directions * blocks,),
        grid_names=("g",),
        cluster=(2,),
        cluster_names=("c",),
        # Lane semantics (the default before jax 0.11): the warpgroup dialect of jax
        # 0.11.2 cannot store to another CTA's shared memory.
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
    )
    return kernel(xs, weights)


def supported() -> bool:
    """wgmma kernels: Hopper (compute capability 9.0) only."""
    return jax.default_backend() == "gpu" and getattr(jax.devices()[0], "compute_capability", "") == "9.0"


def unsupported(dtype, batch: int, directions: int, hidden: int) -> str | None:
    """Why the kernels cannot run this problem (None: they can): they take bfloat16, batch 16,
    a hidden size that is a multiple of 128, and a grid (2 CTAs per 64 columns per direction)
    that fits on the GPU at once: the grid barrier would otherwise wait for CTAs that can
    never start."""
    if dtype != jnp.bfloat16 or batch != BATCH or hidden % HIDDEN_MULTIPLE:
        return (f"mosaic_rnn takes bfloat16, batch {BATCH} and a hidden size that is a multiple of "
                f"{HIDDEN_MULTIPLE}; got {jnp.dtype(dtype).name}, batch {batch}, hidden {hidden}")
    ctas, sms = 2 * directions * (hidden // COLS), getattr(jax.devices()[0], "core_count", None)
    if supported() and sms is not None and ctas > sms:
        return f"mosaic_rnn needs {ctas} CTAs resident at once for hidden {hidden}; this GPU has {sms} SMs"
    return None


def check_shapes(xs: jax.Array, recurrent: jax.Array) -> None:
    if reason := unsupported(xs.dtype, xs.shape[0], *recurrent.shape[:2]):
        raise ValueError(reason)


def mosaic_simple_rnn(xs: jax.Array, recurrent: jax.Array) -> jax.Array:
    """Clipped-ReLU recurrence (direction 1 reversed in time) on Hopper GPUs.

    Args:
      xs: <bf16>[16, T, D or 1, H] input projections (1: shared by the D directions).
      recurrent: [D, H, H] recurrent matrices.
    Returns:
      <bf16>[16, T, D, H] hidden states.
    """
    check_shapes(xs, recurrent)
    return _mosaic(xs, recurrent.astype(xs.dtype), xs.shape[2] < recurrent.shape[0]).transpose(3, 0, 1, 2)


def _kernel_layout(x: jax.Array) -> jax.Array:
    return x.transpose(1, 2, 3, 0)  # [B, T, D, H] -> [T, D, H, B]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _mosaic(xs, recurrent, shared_input):
    """-> [T, D, H, B] states. shared_input: xs has one direction (static, for the gradient's shape)."""
    del shared_input
    return _run(forward_cell, _kernel_layout(xs), recurrent.transpose(0, 2, 1), reverse=False)


def _fwd(xs, recurrent, shared_input):
    ys = _mosaic(xs, recurrent, shared_input)
    return ys, (ys, recurrent)


def _gated_backward_cell(gated_dy, rec):
    """backward_cell with the clipped ReLU's gate folded into the input: -inf where it is shut."""
    return jnp.where(gated_dy == -jnp.inf, 0.0, gated_dy + rec)


def _bwd(shared_input, residuals, dys):
    ys, recurrent = residuals
    # One input tile per step, as in the forward kernel: with a second input (dys and ys
    # apart) the kernel came out wrong at hidden 2048 (batch entries 8-15; cause not found).
    gated = jnp.where(passes_gradient(ys), dys.astype(ys.dtype), -jnp.inf)
    dzs = _run(_gated_backward_cell, gated, recurrent, reverse=True)
    d_recurrent = jnp.einsum("tdhb,tdwb->dhw", previous_states(ys, time_axis=0), dzs,
                             preferred_element_type=jnp.float32)
    return input_gradient(dzs.transpose(3, 0, 1, 2), shared_input), d_recurrent.astype(recurrent.dtype)


_mosaic.defvjp(_fwd, _bwd)
