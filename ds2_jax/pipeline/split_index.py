"""One split's index: what filters and buckets need of each utterance (its samples and
labels, no audio), read once and cached as .npz beside the prepared dataset. No jax."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import zipfile
from typing import Callable, Iterable

import numpy as np

from ds2_jax import files, text


def split_names(spec: str) -> list[str]:
    """'train-clean-100+dev_clean' -> tfds names ['train_clean_100', 'dev_clean'] (every character
    but letters, digits and '_' becomes '_', as the builders name splits)."""
    names = [re.sub(r"[^A-Za-z0-9_]", "_", s.strip()) for s in spec.split("+") if s.strip()]
    if not names:
        raise ValueError(f"no split in {spec!r}")
    return names


@dataclasses.dataclass
class SplitIndex:
    """What filters and buckets need of one split, in record order (no audio)."""

    num_samples: np.ndarray  # <int64>[N]
    labels: list  # N <int32>[m] arrays; empty where the text has unknown characters
    bad_text: np.ndarray  # <bool>[N]: empty or outside the alphabet
    min_frames: np.ndarray  # <int64>[N]: geometry.ctc_min_frames of each label sequence

    @classmethod
    def from_flat(cls, num_samples, flat: np.ndarray, offsets: np.ndarray, bad_text) -> "SplitIndex":
        """From all label ids in one array and each utterance's [offsets[i], offsets[i+1]) slice."""
        flat = np.asarray(flat, np.int32)
        bounds = np.asarray(offsets).tolist()
        labels = [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        return cls(np.asarray(num_samples), labels, np.asarray(bad_text), min_frames_of(flat, offsets))


def min_frames_of(flat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """geometry.ctc_min_frames of every [offsets[i], offsets[i+1]) slice of `flat`, vectorized."""
    lengths = np.diff(offsets)
    repeat = np.zeros(len(flat), bool)
    repeat[1:] = flat[1:] == flat[:-1]
    repeat[offsets[:-1][lengths > 0]] = False  # an utterance's first label repeats nothing
    before = np.concatenate([[0], np.cumsum(repeat, dtype=np.int64)])
    return lengths.astype(np.int64) + before[offsets[1:]] - before[offsets[:-1]]


# (num_samples, all label ids as <int8> (<int16> past 127 labels), offsets, bad_text): what the cache holds.
FlatIndex = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def flat_index(
    examples: Iterable[tuple[int, str | bytes]],
    n: int,
    alphabet: text.Alphabet = text.LIBRISPEECH,
    normalize: Callable[[str], str] = functools.partial(text.normalize, strip_punctuation=False),
) -> FlatIndex:
    """The flat index of `n` (num_samples, transcript) pairs, in record order: each
    transcript `normalize`d and spelled in `alphabet`."""
    num_samples = np.zeros(n, np.int64)
    labels, bad = [], np.zeros(n, bool)
    for i, (samples, transcript) in enumerate(examples):
        num_samples[i] = samples
        t = normalize(transcript.decode("utf-8") if isinstance(transcript, bytes) else transcript)
        if not t or alphabet.unknown_chars(t):
            bad[i] = True
            labels.append(np.zeros(0, np.int32))
        else:
            labels.append(alphabet.encode(t))
    lengths = np.array([len(x) for x in labels], np.int64)
    dtype = np.int8 if alphabet.vocab_size <= 127 else np.int16
    flat = np.concatenate(labels + [np.zeros(0, np.int32)]).astype(dtype)
    return num_samples, flat, np.concatenate([[0], np.cumsum(lengths)]), bad


def cached(path: str, n: int, build: Callable[[], FlatIndex], name: str = "") -> SplitIndex:
    """The index cached at `path` if it holds `n` utterances, else `build()`'s, then cached there.
    Written under a temporary name of its own and renamed (files.replacing): two processes building
    it at once never mix their files; one torn anyway (an older version's) is rebuilt with a warning."""
    if os.path.exists(path):
        try:
            with np.load(path) as z:
                if len(z["num_samples"]) == n:
                    return SplitIndex.from_flat(z["num_samples"], z["labels"], z["label_offsets"], z["bad_text"])
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            logging.warning(
                "the cached index of %s at %s is torn (%s: %s): rebuilding it", name, path, type(e).__name__, e
            )
    num_samples, flat, offsets, bad_text = build()
    index = SplitIndex.from_flat(num_samples, flat, offsets, bad_text)
    try:
        with files.replacing(path, "wb") as f:
            np.savez(f, num_samples=num_samples, labels=flat, label_offsets=offsets, bad_text=bad_text)
    except OSError as e:
        logging.warning("could not cache the index of %s at %s: %s", name, path, e)
    return index
