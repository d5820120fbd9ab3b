"""Waveform -> normalized log linear spectrogram, in jnp so it runs inside the step.

Follows Paddle DS2's featurizer: int16 samples scaled to [-1, 1), Hann windows of
features.window_ms every features.hop_ms (configs/default.py), power spectrum scaled by the window energy and the
sample rate (non-edge bins doubled), log(power + eps), then per-bin (x - mean) / std.
Frames that touch padding are zeroed, so padded input never changes valid output.
"""

from __future__ import annotations

from typing import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from ds2_jax import batch_axis, geometry, settings


def _frames(audio: jax.Array, fc: settings.Spectrogram) -> jax.Array:
    """<float32>[B, S] -> <float32>[B, T, window], T = geometry.num_frames(S, window, hop)."""
    if fc.window % fc.hop:
        raise ValueError("window must be a multiple of hop")
    per = fc.window // fc.hop
    b, s = audio.shape
    t = geometry.num_frames(s, fc.window, fc.hop)
    chunks = audio[:, : (t + per - 1) * fc.hop].reshape(b, t + per - 1, fc.hop)
    return jnp.concatenate([chunks[:, k : k + t] for k in range(per)], axis=-1)


def log_spectrogram(audio: jax.Array, fc: settings.Spectrogram = settings.Spectrogram()) -> jax.Array:
    """<int16>[B, S] -> <float32>[B, T, num_bins] log power spectrum (unnormalized)."""
    x = audio.astype(jnp.float32) / 32768.0
    window = jnp.asarray(np.hanning(fc.window), jnp.float32)  # as Paddle: np.hanning
    frames = _frames(x, fc) * window
    power = jnp.abs(jnp.fft.rfft(frames, axis=-1)) ** 2
    scale = jnp.sum(window**2) * fc.sample_rate
    bin_scale = jnp.full((fc.num_bins,), 2.0 / scale).at[0].set(1.0 / scale).at[-1].set(1.0 / scale)
    return jnp.log(power * bin_scale + fc.eps)


def featurize(
    audio: jax.Array,
    audio_lengths: jax.Array,
    mean: jax.Array,
    std: jax.Array,
    fc: settings.Spectrogram = settings.Spectrogram(),
) -> tuple[jax.Array, jax.Array]:
    """Normalized features and frame counts.

    Args:
      audio: <int16>[B, S] zero-padded waveforms.
      audio_lengths: <int32>[B] valid samples per utterance.
      mean, std: <float32>[num_bins] per-bin statistics.
    Returns:
      (<float32>[B, T, num_bins] with padded frames zeroed, <int32>[B] frame counts).
    """
    # Per device under parallelism='jit': XLA would gather the batch around the FFT.
    spectrogram = batch_axis.map_batch(lambda a: log_spectrogram(a, fc), [audio])
    lengths = geometry.num_frames(audio_lengths.astype(jnp.int32), fc.window, fc.hop)
    return normalize(spectrogram, lengths, mean, std), lengths


def normalize(spectrogram: jax.Array, lengths: jax.Array, mean: jax.Array, std: jax.Array) -> jax.Array:
    """<float32>[B, T, num_bins] (spectrogram - mean) / std with frames at and beyond <int32>[B] `lengths`
    zeroed (the exported model's first step, ds2_jax.export, as well as featurize's last)."""
    feats = (spectrogram - mean) / std
    # An iota, not arange()[None, :]: it converts to ONNX with a symbolic length (jax2onnx).
    mask = jax.lax.broadcasted_iota(jnp.int32, feats.shape[:2], 1) < jnp.expand_dims(lengths, 1)
    return jnp.where(jnp.expand_dims(mask, -1), feats, 0.0)


def spectrogram_stats(
    waveforms: Iterable[np.ndarray], fc: settings.Spectrogram = settings.Spectrogram(), pad_to: int = 64_000
) -> tuple[np.ndarray, np.ndarray]:
    """Per-bin <float32>[num_bins] mean and std of log spectrogram frames over int16 waveforms.

    Runs on the host once per run (a source's `feature_stats` picks the waveforms and caches
    the result). Waveforms are zero-padded to a multiple of `pad_to` samples so that the
    jitted spectrogram compiles for a handful of shapes; padded frames are excluded.
    """
    spectrogram = jax.jit(lambda a: log_spectrogram(a, fc))
    total, total_sq, count = 0.0, 0.0, 0
    for wav in waveforms:
        wav = np.asarray(wav, np.int16)
        frames = geometry.num_frames(len(wav), fc.window, fc.hop)
        if frames == 0:
            continue
        padded = np.zeros((-(-len(wav) // pad_to) * pad_to,), np.int16)
        padded[: len(wav)] = wav
        spec = np.asarray(spectrogram(padded[None]), np.float64)[0, :frames]
        total = total + spec.sum(0)
        total_sq = total_sq + (spec**2).sum(0)
        count += frames
    if count == 0:
        raise ValueError("no utterance long enough to compute feature statistics")
    mean = total / count
    std = np.sqrt(np.maximum(total_sq / count - mean**2, 1e-10))
    return mean.astype(np.float32), std.astype(np.float32)


def spec_augment(
    feats: jax.Array,
    lengths: jax.Array,
    rng: jax.Array,
    freq_masks: int,
    freq_mask_width: int,
    time_masks: int,
    time_mask_max_fraction: float,
) -> jax.Array:
    """SpecAugment frequency and time masks (set to 0, the normalized mean); the
    arguments are settings.SpecAugment's fields (config.features).

    Each mask's width is uniform in [0, max]; time masks stay inside the valid frames.
    """
    b, t, f = feats.shape
    keep = jnp.ones((b, t, f), bool)
    keys = jax.random.split(rng, 2 * (freq_masks + time_masks) + 1)
    k = 0
    bins = jnp.arange(f)[None, :]
    for _ in range(freq_masks):
        width = jax.random.randint(keys[k], (b, 1), 0, freq_mask_width + 1)
        start = jax.random.randint(keys[k + 1], (b, 1), 0, f) % jnp.maximum(f - width, 1)
        keep &= ~((bins >= start) & (bins < start + width))[:, None, :]
        k += 2
    steps = jnp.arange(t)[None, :]
    max_width = jnp.floor(lengths[:, None] * time_mask_max_fraction).astype(jnp.int32)
    for _ in range(time_masks):
        width = (jax.random.uniform(keys[k], (b, 1)) * (max_width + 1)).astype(jnp.int32)
        start = (jax.random.uniform(keys[k + 1], (b, 1)) * jnp.maximum(lengths[:, None] - width, 1)).astype(jnp.int32)
        keep &= ~((steps >= start) & (steps < start + width))[:, :, None]
        k += 2
    return jnp.where(keep, feats, 0.0)
