"""Audio files as a dataset build stores them: int16, mono, at the model's sample rate.

`load` is what a build worker process runs per utterance (this module imports numpy,
soundfile and soxr only, so a spawned worker starts in a fraction of a second). FLAC, WAV,
OGG/Opus and MP3 are decoded by libsndfile (soundfile); any other rate is resampled once
with soxr (quality 'HQ'); several channels are averaged, or the file is skipped
(dataset.stereo='skip'). A file that gives no audio is a reason (a `Skip`), never an exception.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np
import soundfile
import soxr


class Skip(NamedTuple):
    """Why a file gives no stored audio: one of manifest.REASONS, and a detail."""

    reason: str
    detail: str = ""


def load(path: str, sample_rate: int, stereo: str = "downmix") -> np.ndarray | Skip:
    """<int16>[S] mono samples of `path` at `sample_rate`, or the Skip that says why not."""
    try:
        if os.path.getsize(path) == 0:
            return Skip("empty_audio", "0 bytes")
    except OSError as e:
        return Skip("missing_audio", e.strerror or str(e))
    try:
        with soundfile.SoundFile(path) as f:
            rate, channels = f.samplerate, f.channels
            if channels > 1 and stereo == "skip":
                return Skip("not_mono", f"{channels} channels (dataset.stereo='skip')")
            # int16 from libsndfile's own conversion, and int16 through soxr: no float32 copy of
            # the file (a third of a build's decode time for 16 kHz FLAC).
            audio = f.read(dtype="int16", always_2d=True)
    except Exception as e:  # noqa: BLE001 - any decoder failure is a corrupt file
        return Skip("corrupt_audio", f"{type(e).__name__}: {e}"[:200])
    if audio.shape[0] == 0:
        return Skip("empty_audio", "0 frames")
    if channels == 1:
        mono = np.ascontiguousarray(audio[:, 0])
    else:
        mono = np.round(audio.mean(axis=1, dtype=np.float32)).astype(np.int16)
    if rate != sample_rate:
        mono = soxr.resample(mono, rate, sample_rate, quality="HQ")
    return mono


def load_many(jobs: list[tuple[str, int, str]]) -> list[np.ndarray | Skip]:
    """`load` of each (path, sample_rate, stereo): one task of a build worker."""
    return [load(*job) for job in jobs]
