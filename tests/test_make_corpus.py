"""make_corpus writes the exact LibriSpeech layout, and the builder keeps all of it."""

import os
import shutil

import numpy as np
import pytest
import soundfile

from ds2_jax.datasets import build
from ds2_jax.tools import make_corpus

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")


def test_layout_speakers_and_build(tmp_path):
    args = ["--out", str(tmp_path), "--train_speakers=2", "--dev_speakers=0", "--test_speakers=1",
            "--utts_per_speaker=3", "--workers=2"]
    assert make_corpus.main(args) == 0
    root = tmp_path / "LibriSpeech"
    assert sorted(os.listdir(root)) == ["SPEAKERS.TXT", "test-clean", "train-clean-100"]
    train, test = set(os.listdir(root / "train-clean-100")), set(os.listdir(root / "test-clean"))
    assert len(train) == 2 and len(test) == 1 and not train & test  # held-out speakers
    speaker = sorted(train)[0]
    (chapter,) = os.listdir(root / "train-clean-100" / speaker)
    d = root / "train-clean-100" / speaker / chapter
    lines = (d / f"{speaker}-{chapter}.trans.txt").read_text().splitlines()
    assert len(lines) == 3
    for line in lines:
        utt_id, words = line.split(" ", 1)
        assert words == words.upper() and utt_id.startswith(f"{speaker}-{chapter}-")
        audio, rate = soundfile.read(d / f"{utt_id}.flac", dtype="int16")
        assert rate == 16_000 and audio.ndim == 1 and 0.3 < len(audio) / rate < 4.0
        assert np.abs(audio).max() > 1000
    builder = build.build(str(tmp_path), str(tmp_path / "tfds"))
    reports = build.reports(builder)
    assert {s: r["kept"] for s, r in reports.items()} == {"train_clean_100": 6, "test_clean": 3}
    assert all(r["skipped_total"] == 0 for r in reports.values())


def test_sentences_are_in_the_alphabet():
    from ds2_jax import text

    rng = np.random.default_rng(0)
    for _ in range(200):
        s = make_corpus.sentence(rng)
        assert s == text.normalize(s) and not text.unknown_chars(s) and 2 <= len(s.split()) <= 5
