"""Audio in: any file (or upload) libsndfile reads -> <int16>[S] mono samples at the model's rate.

The one loader of the project, at the bottom of its import graph (numpy, soundfile, soxr and
ds2_jax.errors only, so a spawned build worker starts in a fraction of a second): the dataset build
(datasets/audio), transcribe, export and the server read audio through `decode` / `read`, so a file
gives the model the same samples wherever it is read.

FLAC, WAV, AIFF, W64, OGG/Opus and MP3 are decoded by libsndfile (soundfile); any other rate is
resampled once with soxr (quality 'HQ'); several channels are averaged, or refused (stereo='skip').
Samples keep their scale in every subtype: integer PCM is read as int16 by libsndfile (which
scales 8 to 32 bits exactly, truncating below 16), everything else (float, double, Vorbis,
Opus, MP3) as float32, mapped to int16 by x * 32768, with the samples beyond [-1, 1] clipped
and counted (`Audio.clipped`; libsndfile does not scale a float file read as int16: it rounds
0.3 to 0, so a float WAV would be silence). A file shorter than its header says (a cut WAV,
AIFF, W64; an MP3 decoding fewer frames than its Xing/LAME header declares; any file decoding
fewer frames than it declares) is `truncated_audio`, a decoder error anywhere in it
`corrupt_audio` (as is an Ogg stream with a hole, and NaN or infinite samples): each an
`Unreadable` with that reason. A file longer than READ_BLOCK_SECONDS is read a block at a time, so
memory holds the int16 result and one block, not the file's float32 channels.
"""

from __future__ import annotations

import io
import logging
import os
import re
from typing import BinaryIO, NamedTuple

import numpy as np
import soundfile
import soxr

from ds2_jax import errors

log = logging.getLogger("ds2_jax")

READ_BLOCK_SECONDS = 60.0  # A longer file is read, downmixed and resampled a block at a time.
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


class Audio(NamedTuple):
    """A file's audio: <int16>[S] mono samples and how many were clipped to int16's range."""

    samples: np.ndarray
    clipped: int = 0


Unreadable = errors.Unreadable  # the error class lives with the others (errors.py)


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
    """<T>[S, C] -> <T>[S]: the channels averaged (int16 rounded); NaN or infinite samples refused."""
    if audio.dtype != np.int16 and not np.isfinite(audio).all():
        raise Unreadable("corrupt_audio", f"{np.count_nonzero(~np.isfinite(audio))} samples are NaN or infinite")
    if audio.shape[1] == 1:
        return np.ascontiguousarray(audio[:, 0])
    if audio.dtype == np.int16:
        return np.round(audio.mean(axis=1, dtype=np.float32)).astype(np.int16)
    return audio.mean(axis=1, dtype=np.float32)


def _stored(mono: np.ndarray) -> Audio:
    return Audio(mono) if mono.dtype == np.int16 else Audio(*to_int16(mono))


def _open(source: str | bytes | BinaryIO) -> soundfile.SoundFile:
    """An open SoundFile, or the Unreadable that says why `source` is none."""
    if isinstance(source, (bytes, bytearray)):
        if not source:
            raise Unreadable("empty_audio", "0 bytes", "empty file (0 bytes)")
        source = io.BytesIO(source)
    elif isinstance(source, str):
        if os.path.isdir(source):
            raise Unreadable("missing_audio", "a directory, not an audio file")
        try:
            regular = os.path.isfile(source)
            if regular and os.path.getsize(source) == 0:
                raise Unreadable("empty_audio", "0 bytes", "empty file (0 bytes)")
            with open(source, "rb") as f:
                # A pipe or device (/dev/stdin, a FIFO) has no size and cannot seek: read whole.
                source = source if regular else io.BytesIO(f.read())
        except OSError as e:  # libsndfile would call it "System error"
            raise Unreadable("missing_audio", (e.strerror or str(e)).lower()) from e
        if not regular and not source.getbuffer().nbytes:
            raise Unreadable("empty_audio", "0 bytes", "no bytes came from it (an empty pipe)")
    try:
        return soundfile.SoundFile(source)
    except Exception as e:  # noqa: BLE001 - any decoder failure is a corrupt file
        detail = f"{type(e).__name__}: {e}"[:200]
        raise Unreadable(
            "corrupt_audio", detail, f"not audio that libsndfile reads (WAV, FLAC, OGG, MP3): {detail}"
        ) from e


def decode(source: str | bytes | BinaryIO, sample_rate: int, stereo: str = "downmix", name: str | None = None) -> Audio:
    """The Audio of `source` (a path, the bytes of a file, or a binary file object) at `sample_rate`;
    an Unreadable if it gives none. Audio below `sample_rate` is upsampled with a warning naming
    `name` (default: the path): the model never saw it, and nothing above half its rate is in it."""
    try:
        with _open(source) as f:
            rate, channels, declared = f.samplerate, f.channels, f.frames
            if channels > 1 and stereo == "skip":
                raise Unreadable("not_mono", f"{channels} channels (dataset.stereo='skip')")
            short = declared_longer(f.extra_info)
            if short:
                raise Unreadable("truncated_audio", short)
            damaged = _DAMAGED.search(f.extra_info)
            if damaged:
                raise Unreadable("corrupt_audio", damaged.group(0).strip()[:200])
            if rate < sample_rate:
                log.warning(
                    "%s: %d Hz audio resampled to %d Hz; the model was trained on %d Hz audio, and nothing "
                    "above %d Hz is in this file, so expect more errors",
                    name or (source if isinstance(source, str) else "upload"),
                    rate,
                    sample_rate,
                    sample_rate,
                    rate // 2,
                )
            # Integer PCM: int16 from libsndfile's own conversion, and int16 through soxr (no float32
            # copy of the file: a third of a build's decode time for 16 kHz FLAC).
            dtype = "int16" if f.subtype in INT_SUBTYPES else "float32"
            block = int(READ_BLOCK_SECONDS * rate)
            if declared > block:
                return _blocks(f, dtype, block, rate, sample_rate, declared)
            audio = f.read(dtype=dtype, always_2d=True)
    except Unreadable:
        raise
    except Exception as e:  # noqa: BLE001 - any decoder failure is a corrupt file
        raise Unreadable("corrupt_audio", f"{type(e).__name__}: {e}"[:200]) from e
    if audio.shape[0] == 0:
        raise Unreadable("empty_audio", "0 frames", "no samples (0 frames)")
    if 0 < audio.shape[0] < declared:
        raise Unreadable("truncated_audio", f"{audio.shape[0]} of the {declared} frames its header declares")
    mono = _mono(audio)
    if rate != sample_rate:
        mono = soxr.resample(mono, rate, sample_rate, quality="HQ")
    return _stored(mono)


def _blocks(f: soundfile.SoundFile, dtype: str, block: int, rate: int, sample_rate: int, declared: int) -> Audio:
    """`decode` of a long file, a block at a time (soxr's stream resampler carries across blocks)."""
    stream = None if rate == sample_rate else soxr.ResampleStream(rate, sample_rate, 1, dtype=dtype, quality="HQ")
    parts, clipped, frames = [], 0, 0
    for chunk in f.blocks(blocksize=block, dtype=dtype, always_2d=True):
        frames += chunk.shape[0]
        mono = _mono(chunk)
        part = _stored(mono if stream is None else stream.resample_chunk(mono))
        parts.append(part.samples)
        clipped += part.clipped
    if frames < declared:
        raise Unreadable("truncated_audio", f"{frames} of the {declared} frames its header declares")
    if stream is not None:
        part = _stored(stream.resample_chunk(np.zeros(0, np.dtype(dtype)), last=True))
        parts.append(part.samples)
        clipped += part.clipped
    return Audio(np.concatenate(parts), clipped)


def read(
    source: str | bytes | BinaryIO, sample_rate: int, stereo: str = "downmix", name: str | None = None
) -> np.ndarray:
    """<int16>[S] mono samples of `source` at `sample_rate` (`decode`'s, without the clip count)."""
    return decode(source, sample_rate, stereo, name).samples
