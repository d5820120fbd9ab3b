"""datasets.audio: every format and subtype stored at the same int16 scale; a short or broken file is
a counted skip, never audio kept with the whole transcript."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile

from ds2_jax.datasets import audio

RATE = 16_000
# One signal every subtype holds exactly: int16 multiples of 256 (8 bits suffice), up to -6 dBFS,
# a 220 Hz tone over 330 Hz (0.5 s).
_t = np.arange(RATE // 2) / RATE
SIGNAL = (np.round(64 * (0.7 * np.sin(2 * np.pi * 220 * _t) + 0.3 * np.sin(2 * np.pi * 330 * _t))) * 256).astype(
    np.int16
)
LOSSLESS = [
    *[("WAV", s) for s in ("PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE")],
    *[("AIFF", s) for s in ("PCM_S8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE")],
    *[("W64", s) for s in ("PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE")],
    *[("FLAC", s) for s in ("PCM_S8", "PCM_16", "PCM_24")],
]
LOSSY = [("OGG", "VORBIS"), ("OGG", "OPUS"), ("MP3", "MPEG_LAYER_III")]
SUFFIX = {"WAV": "wav", "AIFF": "aiff", "W64": "w64", "FLAC": "flac", "OGG": "ogg", "MP3": "mp3"}


def write(tmp_path, fmt: str, subtype: str, signal=SIGNAL) -> str:
    path = str(tmp_path / f"{fmt}_{subtype}.{SUFFIX[fmt]}")
    # Integer subtypes from int16 data (libsndfile shifts it exactly), the others from its float32 value
    # (int16 / 32768, as libsndfile reads int16 as float): what recorders of each kind write.
    data = signal if subtype.startswith("PCM_") else (signal / 32768).astype(np.float32)
    soundfile.write(path, data, RATE, format=fmt, subtype=subtype)
    return path


@pytest.mark.parametrize("fmt,subtype", LOSSLESS)
def test_every_lossless_subtype_is_stored_at_the_same_scale(tmp_path, fmt, subtype):
    got = audio.load(write(tmp_path, fmt, subtype), RATE)
    assert isinstance(got, audio.Audio), got
    assert got.samples.dtype == np.int16 and got.clipped == 0
    np.testing.assert_allclose(got.samples, SIGNAL, atol=1, rtol=0)


@pytest.mark.parametrize("fmt,subtype", LOSSY)
def test_every_lossy_codec_is_stored_at_the_same_level(tmp_path, fmt, subtype):
    """A lossy codec changes the waveform (quantized spectrum, its delay and phase), so sample-wise
    equality is no test; the level is: a wrong scale (silence, or 256x) misses the RMS by far more than
    the codec's +-10%, and the best-lag correlation holds the waveform to the signal."""
    got = audio.load(write(tmp_path, fmt, subtype), RATE)
    assert isinstance(got, audio.Audio), got
    x, y = SIGNAL.astype(np.float64), got.samples.astype(np.float64)
    n = min(len(x), len(y)) - 2000
    rms = np.sqrt(np.mean(y[1000:n] ** 2)) / np.sqrt(np.mean(x[1000:n] ** 2))
    assert 0.9 < rms < 1.1, rms
    lags = [lag for lag in range(-600, 600, 4) if n + lag <= len(y)]
    best = max(np.corrcoef(x[1000:n], y[1000 + lag : n + lag])[0, 1] for lag in lags)
    assert best > 0.9, best


def test_floats_beyond_full_scale_are_clipped_and_counted(tmp_path):
    signal = np.array([0.5, 1.5, -2.0, 0.25, -1.0, 1.0], np.float32)
    path = str(tmp_path / "loud.wav")
    soundfile.write(path, np.tile(signal, 100), RATE, subtype="FLOAT")
    got = audio.load(path, RATE)
    assert got.clipped == 200
    np.testing.assert_array_equal(got.samples[:6], [16384, 32767, -32768, 8192, -32768, 32767])  # 1.0: 32767, kept


def test_non_finite_float_samples_are_a_corrupt_skip(tmp_path):
    path = str(tmp_path / "nan.wav")
    soundfile.write(path, np.r_[np.zeros(100), np.nan, np.inf, np.zeros(100)].astype(np.float32), RATE, subtype="FLOAT")
    got = audio.load(path, RATE)
    assert isinstance(got, audio.Skip) and got.reason == "corrupt_audio" and "2 samples" in got.detail


def test_a_float_file_at_another_rate_keeps_its_scale(tmp_path):
    path = str(tmp_path / "f8k.wav")
    soundfile.write(path, SIGNAL[::2] / 32768, RATE // 2, subtype="FLOAT")
    got = audio.load(path, RATE)
    assert abs(np.abs(got.samples[500:-500]).max() / np.abs(SIGNAL).max() - 1) < 0.05


# ----------------------------------------------------------------------------- short and broken files

DECLARED = [*LOSSLESS, ("MP3", "MPEG_LAYER_III")]


@pytest.mark.parametrize("fmt,subtype", DECLARED)
def test_a_file_cut_short_is_a_counted_skip(tmp_path, fmt, subtype):
    """A copy cut at two thirds: the header (or the MP3's Xing frame count) promises more than is there.
    A decoder that refuses it (FLAC) makes it a corrupt_audio skip; no format keeps it."""
    path = write(tmp_path, fmt, subtype)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) * 2 // 3])
    got = audio.load(path, RATE)
    assert isinstance(got, audio.Skip), f"{fmt} {subtype}: a cut file kept ({len(got.samples)} samples)"
    assert got.reason == ("corrupt_audio" if fmt == "FLAC" else "truncated_audio"), got


@pytest.mark.parametrize("fmt,subtype", [("FLAC", "PCM_16"), ("MP3", "MPEG_LAYER_III"), ("OGG", "VORBIS")])
def test_a_decoder_error_inside_a_file_is_a_counted_skip(tmp_path, fmt, subtype):
    path = write(tmp_path, fmt, subtype, np.tile(SIGNAL, 4))
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2 : len(data) // 2 + 200] = bytes(200)
    with open(path, "wb") as f:
        f.write(data)
    got = audio.load(path, RATE)
    assert isinstance(got, audio.Skip) and got.reason in ("corrupt_audio", "truncated_audio"), got


def test_a_streamed_wav_of_unknown_length_is_kept(tmp_path):
    """A WAV written to a pipe declares 0xFFFFFFFF data bytes: no length promised, nothing cut."""
    path = write(tmp_path, "WAV", "PCM_16")
    data = bytearray(open(path, "rb").read())
    at = data.index(b"data") + 4
    data[at : at + 4] = b"\xff\xff\xff\xff"
    with open(path, "wb") as f:
        f.write(data)
    got = audio.load(path, RATE)
    assert isinstance(got, audio.Audio), got
    np.testing.assert_array_equal(got.samples, SIGNAL)


def test_a_build_stores_float_audio_at_scale_and_counts_clipped_and_cut_files(tmp_path):
    """The report of a manifest build: a float WAV stored as its int16 samples, a loud one kept with its
    clipped samples counted, a cut one a truncated_audio skip naming its line."""
    from ds2_jax.datasets import build, manifest

    d = tmp_path / "manual"
    d.mkdir()
    write(d, "WAV", "FLOAT")
    soundfile.write(str(d / "loud.wav"), np.tile(SIGNAL, 2) / 32768 * 4, RATE, subtype="FLOAT")  # 4x: clipped
    cut = write(d, "AIFF", "PCM_16")
    data = open(cut, "rb").read()
    with open(cut, "wb") as f:
        f.write(data[: len(data) // 2])
    lines = ["path\tsentence", "WAV_FLOAT.wav\tla casa", "loud.wav\tel gato", "AIFF_PCM_16.aiff\tla casa grande"]
    (d / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    builder = build.build(str(d), str(tmp_path / "tfds"), "manifest", manifest.Options(workers=0, alphabet_min_count=1))
    with open(manifest.report_path(str(builder.data_dir), "train")) as f:
        report = json.load(f)
    assert report["kept"] == 2 and report["skipped"]["truncated_audio"] == 1
    assert report["examples"]["truncated_audio"][0].startswith(f"{d / 'train.tsv'}:4: ")
    loud_clipped = int(np.sum(np.abs(np.tile(SIGNAL, 2) / 32768 * 4) > 1))
    assert report["clipped_utterances"] == 1 and report["clipped_samples"] == loud_clipped
    assert "clipped to int16" in manifest.summary(report)
    ds = builder.as_data_source("train")
    stored = {ex["id"].decode(): ex["audio"] for ex in (ds[i] for i in range(len(ds)))}
    np.testing.assert_array_equal(stored["WAV_FLOAT"], SIGNAL)
