"""CTC loss with paddings and a feasibility mask, and greedy decoding.

optax.ctc_loss returns a large finite value (about 1e5) rather than inf for a label
that cannot fit its frames, and float32 rounding can push a feasible loss slightly
below zero. Infeasible utterances are therefore masked out of the loss (and so out of
the gradient) explicitly and counted; feasible losses are clipped at zero.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from ds2_jax import batch_axis, geometry, text
from ds2_jax.kernels import ctc as ctc_kernel
from ds2_jax.kernels import dispatch


def paddings(lengths: jax.Array, size: int) -> jax.Array:
    """<float32>[B, size]: 1.0 on padded positions."""
    return (jnp.arange(size)[None, :] >= lengths[:, None]).astype(jnp.float32)


def feasible(logit_lengths, labels, label_lengths) -> jax.Array:
    """<bool>[B]: the labels fit their frames and are non-empty."""
    return (label_lengths > 0) & (geometry.ctc_min_frames(labels, label_lengths) <= logit_lengths)


def _optax_loss(logits, logit_lengths, labels, label_lengths):
    return optax.ctc_loss(
        logits,
        paddings(logit_lengths, logits.shape[1]),
        labels,
        paddings(label_lengths, labels.shape[1]),
        blank_id=text.BLANK,
    )


def _pallas_loss(logits, logit_lengths, labels, label_lengths):
    return ctc_kernel.ctc_loss(jax.nn.log_softmax(logits), logit_lengths, labels, label_lengths, text.BLANK)


_IMPLS = {"optax": _optax_loss, "pallas": _pallas_loss}


def per_utterance_loss(
    logits: jax.Array,
    logit_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    norm_by_times: bool = False,
    impl: str = "auto",
) -> tuple[jax.Array, jax.Array]:
    """Per-utterance CTC negative log likelihood.

    Args:
      logits: <float32>[B, T, V] unnormalized, blank = 0.
      logit_lengths, label_lengths: <int32>[B].
      labels: <int32>[B, L].
      impl: 'optax' (lax.scan), 'pallas' (ds2_jax.kernels.ctc) or 'auto' (kernels.dispatch decides). Under
        parallelism='jit' each device computes the losses of its own rows (batch_axis).
    Returns:
      (<float32>[B] loss, 0 where infeasible; <bool>[B] feasible).
    """
    ok = feasible(logit_lengths, labels, label_lengths)
    loss = batch_axis.map_batch(
        _IMPLS[dispatch.ctc_impl(impl)], [logits.astype(jnp.float32), logit_lengths, labels, label_lengths]
    )
    if norm_by_times:
        loss = loss / jnp.maximum(logit_lengths, 1).astype(jnp.float32)
    # jnp.where also blocks the gradient of the masked entries.
    return jnp.where(ok, jnp.maximum(loss, 0.0), 0.0), ok


def greedy_ids(logits: jax.Array) -> jax.Array:
    """On-device argmax <int32>[B, T], so only small ints travel to the host."""
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
