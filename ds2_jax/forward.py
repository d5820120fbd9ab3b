"""The inference forward pass of a restored state: waveforms -> logits -> decoder inputs.

Shared by the eval step (ds2_jax.eval_step adds the loss), the inference wing (ds2_jax.infer) and
the export; it imports the model and the featurizer only, never the input pipeline.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ds2_jax import ctc, features, model


def forward(state, audio, audio_lengths, *, model_cfg, feature_cfg, axis_name: str | None = None):
    """Inference forward pass with running batch-norm statistics.

    Args:
      audio: <int16>[B, S] zero-padded waveforms; audio_lengths: <int32>[B].
    Returns:
      (<float32>[B, T, 29] logits, <int32>[B] valid output frames).
    """
    net = model.DeepSpeech2(model_cfg, axis_name=axis_name)
    feats, frames = features.featurize(audio, audio_lengths, state.feature_mean, state.feature_std, feature_cfg)
    logits, out_lengths = net.apply(
        {"params": state.params, "batch_stats": state.batch_stats}, feats, frames, train=False
    )
    return logits.astype(jnp.float32), out_lengths


def decoder_inputs(logits, lengths, log_probs: bool) -> dict:
    """{'ids': <int32>[B, T] argmax path, 'lengths': <int32>[B] valid frames, 'log_probs':
    <float32>[B, T, 29] (only with log_probs=True)}: what greedy and beam decoding read."""
    outputs = {"ids": ctc.greedy_ids(logits), "lengths": lengths}
    if log_probs:
        outputs["log_probs"] = jax.nn.log_softmax(logits, axis=-1)
    return outputs


def infer(state, audio, audio_lengths, *, model_cfg, feature_cfg, log_probs: bool = False) -> dict:
    """decoder_inputs of a batch of waveforms (one device, no labels): transcription's step."""
    logits, lengths = forward(state, audio, audio_lengths, model_cfg=model_cfg, feature_cfg=feature_cfg)
    return decoder_inputs(logits, lengths, log_probs)
