"""make_corpus writes the exact LibriSpeech layout, make_own_corpus the Common Voice and NeMo ones,
and the builders keep all of it."""

import json
import os
import shutil

import numpy as np
import pytest
import soundfile

from ds2_jax.datasets import build
from ds2_jax.tools import make_corpus

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")


def test_layout_speakers_and_build(tmp_path):
    args = [
        "--out",
        str(tmp_path),
        "--train_speakers=2",
        "--dev_speakers=0",
        "--test_speakers=1",
        "--utts_per_speaker=3",
        "--workers=2",
    ]
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


def test_own_corpus_writes_common_voice_and_nemo_layouts_that_build_alike(tmp_path):
    from ds2_jax import text
    from ds2_jax.datasets import manifest
    from ds2_jax.tools import make_own_corpus

    args = [
        "--out",
        str(tmp_path),
        "--train_speakers=2",
        "--dev_speakers=1",
        "--test_speakers=1",
        "--utts_per_speaker=3",
        "--workers=2",
    ]
    assert make_own_corpus.main(args) == 0
    cv, nemo = tmp_path / "common_voice", tmp_path / "nemo"
    header, *rows = (cv / "train.tsv").read_text(encoding="utf-8").splitlines()
    assert header.split("\t") == list(make_own_corpus.CV_COLUMNS) and len(rows) == 6
    assert len({r.split("\t")[0] for r in rows}) == 2  # client_id: one per speaker
    for row in rows:
        path, sentence = row.split("\t")[1], row.split("\t")[3]
        assert sentence.lstrip("¿¡")[0].isupper() and sentence[-1] in ".?!"
        info = soundfile.info(str(cv / "clips" / path))
        assert (info.samplerate, info.channels, info.format) == (48_000, 1, "MP3")
    lines = [json.loads(x) for x in (nemo / "train.json").read_text(encoding="utf-8").splitlines()]
    assert [x["text"] for x in lines] == [text.normalize(r.split("\t")[3]) for r in rows]
    assert soundfile.info(str(nemo / lines[0]["audio_filepath"])).samplerate == 8_000
    built = [
        # 12 sentences: a letter seen once is real here (the default minimum count would skip it)
        build.build(
            str(d), str(tmp_path / f"tfds-{d.name}"), "manifest", manifest.Options(workers=0, alphabet_min_count=1)
        )
        for d in (cv, nemo)
    ]
    assert [{s: r["kept"] for s, r in build.reports(b).items()} for b in built] == [
        {"train": 6, "dev": 3, "test": 3}
    ] * 2


def test_own_corpus_sentences_are_written_as_common_voice_writes_them():
    from ds2_jax.tools import make_own_corpus

    rng = np.random.default_rng(0)
    sentences = [make_own_corpus.sentence(rng) for _ in range(200)]
    joined = "".join(sentences)
    assert set("¿?¡!.,") <= set(joined) and set("ñáéó") <= set(joined)
    assert all(s[0].isupper() or s[0] in "¿¡" for s in sentences)
