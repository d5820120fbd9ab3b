"""Audio files as a dataset build stores them: int16, mono, at the model's sample rate.

`load` is what a build worker process runs per utterance (this module imports numpy,
soundfile and soxr only, so a spawned worker starts in a fraction of a second). FLAC, WAV,
AIFF, W64, OGG/Opus and MP3 are decoded by libsndfile (soundfile); any other rate is resampled
once with soxr (quality 'HQ'); several channels are averaged, or the file is skipped
(dataset.stereo='skip'). A file that gives no audio is a reason (a `Skip`), never an exception.

Samples keep their scale in every subtype: integer PCM is read as int16 by libsndfile (which
scales 8 to 32 bits exactly, truncating below 16), everything else (float, double, Vorbis,
Opus, MP3) as float32, mapped to int16 by x * 32768, with the samples beyond [-1, 1] clipped
and counted (`Audio.clipped`; libsndfile does not scale a float file read as int16: it rounds
0.3 to 0, so a float WAV would be silence). A file shorter than its header says (a cut WAV,
AIFF, W64; an MP3 decoding fewer frames than its Xing/LAME header declares; any file decoding
fewer frames than it declares) is a `truncated_audio` skip, a decoder error anywhere in it a
`corrupt_audio` one (as is an Ogg stream with a hole, and NaN or infinite samples).
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

import numpy as np
import soundfile
import soxr

# Subtypes libsndfile scales exactly when read as int16; any other is read as float32.
INT_SUBTYPES = ("PCM_S8", "PCM_U8", "PCM_16", "PCM_24", "PCM_32", "ULAW", "ALAW")
INT16_SCALE = 32768.0  # float full scale [-1, 1) -> int16, as libsndfile reads int16 as float
# A chunk size this large is a stream's "length unknown" (0xFFFFFFFF; sox's 0x7ffff000), no promise.
UNKNOWN_LENGTH = 0x7FFF0000
# libsndfile's header log: "data : 32000 (should be 21318)" (WAV, W64, AIFF chunks), and AIFF's
# "Chunk size 32008 > file length 21369": a chunk that declares more bytes than the file holds.
_SHOULD_BE = re.compile(r"^\s*(\w+)\s*:\s*(\d+)\s*\(should be (\d+)\)", re.M)
_PAST_END = re.compile(r"Chunk size (\d+) > file length (\d+)")
# ... and of an Ogg stream with a page missing or damaged (Vorbis and Opus decode on around the hole).
_DAMAGED = re.compile(r"^.*(reports a hole|orrupted bitstream).*$", re.M)


class Skip(NamedTuple):
    """Why a file gives no stored audio: one of manifest.REASONS, and a detail."""

    reason: str
    detail: str = ""


class Audio(NamedTuple):
    """A file's stored audio: <int16>[S] mono samples and how many were clipped to int16's range."""

    samples: np.ndarray
    clipped: int = 0


def declared_longer(header_log: str) -> str:
    """Why libsndfile's header log (SoundFile.extra_info) shows a chunk longer than the file ('' if none)."""
    for chunk, declared, actual in _SHOULD_BE.findall(header_log):
        if int(actual) < int(declared) < UNKNOWN_LENGTH:
            return f"its {chunk} chunk declares {declared} bytes, the file holds {actual}"
    for declared, length in _PAST_END.findall(header_log):
        if int(length) < int(declared) < UNKNOWN_LENGTH:
            return f"a chunk declares {declared} bytes, the file is {length}"
    return ""


def to_int16(audio: np.ndarray) -> tuple[np.ndarray, int]:
    """<float32>[...] in [-1, 1] -> (<int16>[...], the samples clipped: beyond [-1, 1])."""
    clipped = int(np.count_nonzero(np.abs(audio) > 1.0))
    return np.clip(np.rint(audio * INT16_SCALE), -32768, 32767).astype(np.int16), clipped


def _mono(audio: np.ndarray) -> np.ndarray:
    """<T>[S, C] -> <T>[S]: the channels averaged (int16 rounded)."""
    if audio.shape[1] == 1:
        return np.ascontiguousarray(audio[:, 0])
    if audio.dtype == np.int16:
        return np.round(audio.mean(axis=1, dtype=np.float32)).astype(np.int16)
    return audio.mean(axis=1, dtype=np.float32)


def load(path: str, sample_rate: int, stereo: str = "downmix") -> Audio | Skip:
    """The stored audio of `path` at `sample_rate` (Audio), or the Skip that says why not."""
    try:
        if os.path.getsize(path) == 0:
            return Skip("empty_audio", "0 bytes")
    except OSError as e:
        return Skip("missing_audio", e.strerror or str(e))
    try:
        with soundfile.SoundFile(path) as f:
            rate, channels, declared = f.samplerate, f.channels, f.frames
            if channels > 1 and stereo == "skip":
                return Skip("not_mono", f"{channels} channels (dataset.stereo='skip')")
            short = declared_longer(f.extra_info)
            if short:
                return Skip("truncated_audio", short)
            damaged = _DAMAGED.search(f.extra_info)
            if damaged:
                return Skip("corrupt_audio", damaged.group(0).strip()[:200])
            # Integer PCM: int16 from libsndfile's own conversion, and int16 through soxr (no float32
            # copy of the file: a third of a build's decode time for 16 kHz FLAC).
            audio = f.read(dtype="int16" if f.subtype in INT_SUBTYPES else "float32", always_2d=True)
    except Exception as e:  # noqa: BLE001 - any decoder failure is a corrupt file
        return Skip("corrupt_audio", f"{type(e).__name__}: {e}"[:200])
    if audio.shape[0] == 0:
        return Skip("empty_audio", "0 frames")
    if 0 < audio.shape[0] < declared:
        return Skip("truncated_audio", f"{audio.shape[0]} of the {declared} frames its header declares")
    mono = _mono(audio)
    if mono.dtype != np.int16 and not np.isfinite(mono).all():
        return Skip("corrupt_audio", f"{np.count_nonzero(~np.isfinite(mono))} samples are NaN or infinite")
    if rate != sample_rate:
        mono = soxr.resample(mono, rate, sample_rate, quality="HQ")
    if mono.dtype == np.int16:
        return Audio(mono)
    return Audio(*to_int16(mono))


def load_many(jobs: list[tuple[str, int, str]]) -> list[Audio | Skip]:
    """`load` of each (path, sample_rate, stereo): one task of a build worker."""
    return [load(*job) for job in jobs]
