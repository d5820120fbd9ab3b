"""Featurization: Paddle's spectrogram, padding invariance, SpecAugment, feature statistics."""

import jax
import jax.numpy as jnp
import numpy as np

from ds2_jax import features, geometry


def paddle_log_spectrogram(samples: np.ndarray) -> np.ndarray:
    """Paddle DS2's numpy featurizer (float64), written out as the reference."""
    x = samples.astype(np.float64) / 32768.0
    window, stride = 320, 160
    n = (len(x) - window) // stride + 1
    frames = np.stack([x[i * stride : i * stride + window] for i in range(n)])
    weighting = np.hanning(window)
    power = np.abs(np.fft.rfft(frames * weighting, axis=1)) ** 2
    scale = np.sum(weighting**2) * 16000
    power[:, 1:-1] *= 2.0 / scale
    power[:, [0, -1]] /= scale
    return np.log(power + 1e-14)


def test_matches_paddle_featurizer():
    audio = (np.random.default_rng(0).standard_normal(12345) * 3000).astype(np.int16)
    got = np.asarray(features.log_spectrogram(jnp.asarray(audio)[None]))[0]
    want = paddle_log_spectrogram(audio)
    assert got.shape == want.shape == (geometry.num_frames(12345), 161)
    np.testing.assert_allclose(got, want, atol=1e-3)


def test_padding_never_changes_valid_frames():
    rng = np.random.default_rng(1)
    lengths = np.array([16000, 9000], np.int32)
    audio = (rng.standard_normal((2, 16000)) * 1000).astype(np.int16)
    audio[1, 9000:] = 0
    noisy = audio.copy()
    noisy[1, 9000:] = (rng.standard_normal(7000) * 1000).astype(np.int16)
    mean, std = jnp.zeros(161), jnp.ones(161)
    a, la = features.featurize(jnp.asarray(audio), jnp.asarray(lengths), mean, std)
    b, lb = features.featurize(jnp.asarray(noisy), jnp.asarray(lengths), mean, std)
    np.testing.assert_array_equal(la, lb)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(la[1]) == geometry.num_frames(9000)
    assert np.all(np.asarray(a)[1, int(la[1]) :] == 0)


def test_spec_augment_masks_only_within_limits():
    feats = jnp.ones((4, 50, 161))
    lengths = jnp.array([50, 40, 30, 20])
    out = np.asarray(features.spec_augment(feats, lengths, jax.random.PRNGKey(0), 2, 10, 2, 0.1))
    masked = out == 0
    assert masked.any()
    # frequency masks are at most 2 x 10 bins per utterance when no time mask covers the frame
    per_frame = masked.sum(-1)
    assert np.all((per_frame <= 20) | (per_frame == 161))
    assert np.all(features.spec_augment(feats, lengths, jax.random.PRNGKey(0), 0, 10, 0, 0.1) == 1)


def test_spec_augment_time_masks_stay_inside_each_utterance_and_within_their_width():
    """Up to 3 masks of at most floor(0.2 * length) frames each, never on padded frames."""
    lengths = np.array([60, 45, 30, 12, 5, 0])
    feats = jnp.ones((6, 60, 8))  # padded frames hold ones too, so a mask there would show
    augment = jax.jit(lambda rng: features.spec_augment(feats, jnp.asarray(lengths), rng, 0, 0, 3, 0.2))
    masked_frames = np.zeros(6)
    for seed in range(20):
        out = np.asarray(augment(jax.random.PRNGKey(seed)))
        masked = np.all(out == 0, axis=-1)  # [B, T] frames a time mask covers
        assert np.all((out == 0) == masked[..., None])  # time masks cover every bin of a frame
        for b, n in enumerate(lengths):
            assert not masked[b, n:].any(), (seed, b)
            assert masked[b].sum() <= 3 * int(0.2 * n)
        masked_frames += masked.sum(1)
    assert np.all(masked_frames[:4] > 0) and masked_frames[5] == 0, masked_frames


def test_spec_augment_frequency_masks_cover_the_same_bins_in_every_frame():
    feats = jnp.ones((3, 20, 161))
    out = np.asarray(features.spec_augment(feats, jnp.array([20, 15, 9]), jax.random.PRNGKey(2), 2, 10, 0, 0.1))
    masked = out == 0
    assert np.all(masked == masked[:, :1])  # one set of bins per utterance, all frames
    assert np.all(masked[:, 0].sum(-1) <= 20) and masked.any()


def test_feature_statistics_count_each_utterances_valid_frames_only():
    """spectrogram_stats pads waveforms to a few shapes; its per-bin mean/std are those of
    the utterances' own frames, each frame counted once, the padding's never."""
    rng = np.random.default_rng(0)
    waves = [(rng.standard_normal(n) * 3000).astype(np.int16) for n in (5_000, 12_345, 300, 7_000)]  # 300: no frame
    mean, std = features.spectrogram_stats(waves, pad_to=8_000)
    frames = np.concatenate(
        [np.asarray(features.log_spectrogram(jnp.asarray(w[None])), np.float64)[0] for w in waves if len(w) >= 320]
    )
    assert frames.shape[0] == sum(geometry.num_frames(len(w)) for w in waves)
    np.testing.assert_allclose(mean, frames.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(std, frames.std(0), rtol=1e-4, atol=1e-5)


def test_spec_augment_widths_are_drawn_over_their_whole_range_zero_and_the_maximum_included():
    """One frequency mask of at most 7 bins, then one time mask of at most floor(0.25 * 40) = 10
    frames, over 512 rows: every width from 0 to its maximum is drawn, none beyond (the draws follow
    their settings at both ends)."""
    rows = 512
    feats = jnp.ones((rows, 40, 30))
    lengths = jnp.full((rows,), 40)
    freq = np.asarray(features.spec_augment(feats, lengths, jax.random.PRNGKey(3), 1, 7, 0, 0.0))
    time = np.asarray(features.spec_augment(feats, lengths, jax.random.PRNGKey(4), 0, 0, 1, 0.25))
    freq_widths = (freq[:, 0, :] == 0).sum(-1)
    time_widths = (time[:, :, 0] == 0).sum(-1)
    assert sorted(set(freq_widths.tolist())) == list(range(8))
    assert sorted(set(time_widths.tolist())) == list(range(11))
