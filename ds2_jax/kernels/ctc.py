"""CTC negative log likelihood with the forward-backward recursions as Pallas kernels.

optax.ctc_loss runs the alpha recursion as a lax.scan and its gradient as the scan's
autodiff: one time step at a time, several small kernels each way (BUILD_NOTES.md,
"Kernels and the 'auto' policy"). Here each recursion is one kernel launch: one program per
utterance loops over time with the extended-label vector (blank, l1, blank, l2, ...,
blank; padded to a power of two) in registers. The s-1 / s-2 (alpha) and s+1 / s+2
(beta) neighbours are read back from the row just written to global memory, after a
barrier among the program's threads. The gradient with respect to the log
probabilities is the posterior of each (frame, extended label) (a `jax.custom_vjp`);
the autodiff of the gather that built the extended-label log probabilities sums it
back per vocabulary entry.

Log zero is a large finite negative number, so that max/exp never see inf - inf.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from ds2_jax.kernels.common import block_size, interpret_mode, sync_threads

LOG_ZERO = -1e30
GUARD = 2  # slots before and after the flattened rows so shifted reads stay in bounds


def _lse3(a, b, c):
    m = jnp.maximum(jnp.maximum(a, b), c)
    return m + jnp.log(jnp.exp(a - m) + jnp.exp(b - m) + jnp.exp(c - m))


def _recursion_kernel(
    lp_ref, skip_ref, bounds_ref, out_ref, *, n_frames: int, width: int, reverse: bool, interpret: bool
):
    """Alpha (forward) or beta (reverse) of one utterance over all frames.

    lp_ref: flat [B*T*S] log probs of the extended labels; skip_ref: [B, S] 1.0 where
    the two-step transition is allowed; bounds_ref: [B, 2] (frames, extended length);
    out_ref: flat [GUARD + B*T*S + GUARD].
    """
    b = pl.program_id(0)
    frames, ext_len = bounds_ref[b, 0], bounds_ref[b, 1]
    lanes = jnp.arange(width)
    skip = skip_ref[b, :] > 0
    step = 1 if reverse else -1  # where the neighbours sit relative to s

    def row_start(t):
        return GUARD + (b * n_frames + t) * width

    def neighbour(t, shift):
        ok = (lanes + shift * step >= 0) & (lanes + shift * step < width)
        return plt.load(out_ref.at[pl.ds(row_start(t) + shift * step, width)], mask=ok, other=LOG_ZERO)

    def first_row(t, lp):
        if reverse:  # beta starts at the last valid frame in the last blank or label
            start = (lanes == ext_len - 1) | (lanes == ext_len - 2)
        else:
            start = lanes < 2
        return jnp.where(start & (t == frames - 1 if reverse else t == 0), lp, LOG_ZERO)

    def body(i, prev):
        t = n_frames - 1 - i if reverse else i
        lp = lp_ref[pl.ds(row_start(t) - GUARD, width)]
        sync_threads(interpret)  # the previous row is stored by all threads
        before = t + 1 if reverse else t - 1
        one, two = neighbour(before, 1), jnp.where(skip, neighbour(before, 2), LOG_ZERO)
        new = _lse3(prev, one, two) + lp
        if reverse:  # beta: start at frames - 1, nothing beyond
            row = jnp.where(t == frames - 1, first_row(t, lp), jnp.where(t < frames - 1, new, LOG_ZERO))
        else:  # alpha: frozen past the last frame, so row T-1 holds the final alpha
            row = jnp.where(t < frames, new, prev)
        out_ref[pl.ds(row_start(t), width)] = row
        return row

    t0 = n_frames - 1 if reverse else 0
    row = first_row(t0, lp_ref[pl.ds(row_start(t0) - GUARD, width)])
    out_ref[pl.ds(row_start(t0), width)] = row
    jax.lax.fori_loop(1, n_frames, body, row)


def _recursion(lp_ext, skip, bounds, reverse: bool):
    """<float32>[B, T, S] alpha (or beta) for lp_ext [B, T, S]."""
    batch, n_frames, width = lp_ext.shape
    interpret = interpret_mode()
    kernel = functools.partial(_recursion_kernel, n_frames=n_frames, width=width, reverse=reverse, interpret=interpret)
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((GUARD + batch * n_frames * width + GUARD,), jnp.float32),
        grid=(batch,),
        compiler_params=plt.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="ctc_beta" if reverse else "ctc_alpha",
    )(lp_ext.reshape(-1), skip, bounds)
    return out[GUARD:-GUARD].reshape(batch, n_frames, width)


def _log_likelihood(alpha, bounds):
    """log p(labels | x): alpha at the last frame in the last label or the final blank."""
    last = alpha[:, -1, :]
    idx = jnp.stack([bounds[:, 1] - 1, jnp.maximum(bounds[:, 1] - 2, 0)], axis=1)
    ends = jnp.take_along_axis(last, idx, axis=1)
    ends = ends.at[:, 1].set(jnp.where(bounds[:, 1] >= 2, ends[:, 1], LOG_ZERO))
    return jnp.logaddexp(ends[:, 0], ends[:, 1])


@jax.custom_vjp
def _nll(lp_ext, skip, skip_next, bounds):
    return _nll_fwd(lp_ext, skip, skip_next, bounds)[0]


def _nll_fwd(lp_ext, skip, skip_next, bounds):
    alpha = _recursion(lp_ext, skip, bounds, reverse=False)
    log_z = _log_likelihood(alpha, bounds)
    return -log_z, (lp_ext, skip_next, bounds, alpha, log_z)


def _nll_bwd(residuals, g):
    lp_ext, skip_next, bounds, alpha, log_z = residuals
    beta = _recursion(lp_ext, skip_next, bounds, reverse=True)
    feasible = log_z > LOG_ZERO / 2
    # Posterior of (t, s); <= 1 in exact arithmetic, clipped so rounding never overflows.
    log_post = jnp.minimum(alpha + beta - lp_ext - jnp.where(feasible, log_z, 0.0)[:, None, None], 0.0)
    frames = jnp.arange(lp_ext.shape[1])[None, :, None] < bounds[:, 0, None, None]
    post = jnp.where(frames & feasible[:, None, None], jnp.exp(log_post), 0.0)
    return -g[:, None, None] * post, None, None, None


_nll.defvjp(_nll_fwd, _nll_bwd)


def ctc_loss(
    log_probs: jax.Array, logit_lengths: jax.Array, labels: jax.Array, label_lengths: jax.Array, blank_id: int = 0
) -> jax.Array:
    """Per-utterance CTC negative log likelihood (about -LOG_ZERO where labels cannot fit).

    Args:
      log_probs: <float32>[B, T, V] log-softmax outputs.
      logit_lengths, label_lengths: <int32>[B].
      labels: <int32>[B, L].
    Returns:
      <float32>[B].
    """
    batch, max_label = labels.shape
    width = block_size(2 * max_label + 1)
    s = jnp.arange(width)
    label_at = jnp.take_along_axis(labels, jnp.clip((s - 1) // 2, 0, max_label - 1)[None, :].repeat(batch, 0), axis=1)
    ext_len = 2 * label_lengths + 1
    in_ext = s[None, :] < ext_len[:, None]
    ext = jnp.where((s[None, :] % 2 == 1) & in_ext, label_at, blank_id)
    # Two-step transition into s: from a label to a different label across a blank.
    prev2 = jnp.concatenate([jnp.full((batch, 2), blank_id, ext.dtype), ext[:, :-2]], axis=1)
    skip = ((ext != blank_id) & (ext != prev2) & (s[None, :] >= 2) & in_ext).astype(jnp.float32)
    skip_next = jnp.concatenate([skip[:, 2:], jnp.zeros((batch, 2), skip.dtype)], axis=1)
    lp_ext = jnp.take_along_axis(log_probs.astype(jnp.float32), ext[:, None, :].repeat(log_probs.shape[1], 1), axis=2)
    lp_ext = jnp.where(in_ext[:, None, :], lp_ext, LOG_ZERO)
    bounds = jnp.stack([logit_lengths, ext_len], axis=1).astype(jnp.int32)
    return _nll(lp_ext, skip, skip_next, bounds)
