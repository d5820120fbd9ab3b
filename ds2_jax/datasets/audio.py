"""Audio files as a dataset build stores them: int16, mono, at the model's sample rate.

`load` is what a build worker process runs per utterance: ds2_jax.audio.decode, the project's one
loader (numpy, soundfile and soxr only, so a spawned worker starts in a fraction of a second; its
numerics, scale and truncation checks are described there), with its failures turned into reasons:
a file that gives no audio is a `Skip`, never an exception.
"""

from __future__ import annotations

from typing import NamedTuple

from ds2_jax import audio as audio_lib
from ds2_jax.audio import Audio  # noqa: F401  (what load returns; tests and shards read it here)


class Skip(NamedTuple):
    """Why a file gives no stored audio: one of manifest.REASONS, and a detail."""

    reason: str
    detail: str = ""


def load(path: str, sample_rate: int, stereo: str = "downmix") -> Audio | Skip:
    """The stored audio of `path` at `sample_rate` (Audio), or the Skip that says why not."""
    try:
        return audio_lib.decode(path, sample_rate, stereo)
    except audio_lib.Unreadable as e:
        return Skip(e.reason, e.detail[:200])


def load_many(jobs: list[tuple[str, int, str]]) -> list[Audio | Skip]:
    """`load` of each (path, sample_rate, stereo): one task of a build worker."""
    return [load(*job) for job in jobs]
