"""A "tone language" for tests that need a model which truly hears its words after a short training:
each letter a 40 ms tone of its own pitch, a word its letters back to back, words apart by 100-400 ms
of near-silence, so every word's start and end are known to the sample (tests/test_word_timings.py),
and a small model transcribes held-out utterances exactly (tests/test_page.py)."""

from __future__ import annotations

import json
import os

import numpy as np
import soundfile

from tests.helpers import tiny_config

RATE = 16_000
LETTERS = "abcdefgh"
TONE_S = 0.04


def tone(letter: str) -> np.ndarray:
    """One letter: a 40 ms sine at the letter's own pitch, its edges ramped over 2.5 ms."""
    n = int(TONE_S * RATE)
    ramp = np.minimum(1.0, np.minimum(np.arange(n), n - 1 - np.arange(n)) / 40)
    return np.sin(2 * np.pi * (300 + 420 * LETTERS.index(letter)) * np.arange(n) / RATE) * ramp


def utterance(rng: np.random.Generator) -> tuple[np.ndarray, str, list[tuple[float, float, float]]]:
    """(<int16> audio, text, per word (start, end of its first letter, end) in seconds): 2-4 words of
    1-3 letters (no letter twice running), 50-300 ms of lead-in, 100-400 ms after each word."""
    words = []
    for _ in range(rng.integers(2, 5)):
        word = ""
        for _ in range(rng.integers(1, 4)):
            word += rng.choice([c for c in LETTERS if not word or c != word[-1]])
        words.append(word)
    length = int(TONE_S * RATE)
    parts = [np.zeros(int(rng.uniform(0.05, 0.3) * RATE))]
    spans = []
    for word in words:
        at = sum(map(len, parts))
        spans.append((at / RATE, (at + length) / RATE, (at + len(word) * length) / RATE))
        parts += [tone(c) for c in word] + [np.zeros(int(rng.uniform(0.1, 0.4) * RATE))]
    audio = 0.3 * np.concatenate(parts)
    audio += rng.normal(0.0, 1e-3, len(audio))
    return (audio * 32767).astype(np.int16), " ".join(words), spans


def write_manifest(folder: str, split: str, count: int, seed: int) -> list[dict]:
    """`count` utterances as clips/ WAVs and a NeMo-style <split>.jsonl in `folder`; their rows."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(folder, "clips"), exist_ok=True)
    rows = []
    for i in range(count):
        audio, text, spans = utterance(rng)
        path = os.path.join("clips", f"{split}-{i}.wav")
        soundfile.write(os.path.join(folder, path), audio, RATE, subtype="PCM_16")
        rows.append({"audio_filepath": path, "text": text, "spans": spans})
    with open(os.path.join(folder, f"{split}.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps({"audio_filepath": row["audio_filepath"], "text": row["text"]}) + "\n")
    return rows


def train_model(root: str, steps: int = 150, **overrides) -> str:
    """The workdir of a small DS2 (smoke's convs, one 64-wide GRU layer, bidirectional unless
    `overrides` say otherwise) trained `steps` steps on 400 tone-language utterances through the
    manifest builder in 2 duration buckets, evaluated on "dev" (16 utterances) at the last step.

    Two buckets, not the default 4: each bucket is a train and an eval step compiled, most of the
    CPU time of this training (tests/test_word_timings.py holds at seed 0 either way)."""
    corpus = os.path.join(root, "corpus")
    write_manifest(corpus, "train", 400, seed=0)
    write_manifest(corpus, "dev", 16, seed=1)
    config = tiny_config(
        **{
            "dataset.name": "manifest",
            "dataset.manual_dir": corpus,
            "dataset.data_dir": os.path.join(root, "tfds"),
            "dataset.train_splits": "train",
            "dataset.eval_split": "dev",
            "dataset.alphabet_min_count": 1,
            "dataset.num_buckets": 2,
            "num_devices": 1,
            "per_device_batch_size": 16,
            "num_train_steps": steps,
            "eval_every_steps": steps,
            "checkpoint_every_steps": steps,
            "log_every_steps": 50,
            "optimizer.learning_rate": 2e-3,
            "optimizer.decay_steps": steps,
            "model.conv_channels": 8,
            "model.rnn_size": 64,
            "model.rnn_cell": "gru",
            **overrides,
        }
    )
    from ds2_jax import train

    workdir = os.path.join(root, "w")
    train.train_and_evaluate(config, workdir)
    return workdir
