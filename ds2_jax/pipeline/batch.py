"""The batch format, how a global batch is split over processes, and padding.

A batch is a dict of numpy arrays holding this process's share of one global batch:

    audio          <int16>[B, S]    waveforms, zero-padded to the bucket's S samples
    audio_lengths  <int32>[B]       valid samples
    labels         <int32>[B, L]    label ids 1..28 (text.py), zero-padded
    label_lengths  <int32>[B]
    weights        <float32>[B]     1 for real utterances, 0 for padding rows (eval)

Host code, no jax: `parallel.Parallel.put_batch` places these arrays on the devices.
"""

from __future__ import annotations

import dataclasses

import numpy as np

BATCH_KEYS = ("audio", "audio_lengths", "labels", "label_lengths", "weights")


@dataclasses.dataclass(frozen=True)
class Sharding:
    """How a global batch is split: this process takes rows [start, start + local)."""

    global_batch: int
    process_index: int = 0
    process_count: int = 1

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.process_count

    @property
    def start(self) -> int:
        return self.process_index * self.local_batch


def pad_batch(
    utts: list[dict], samples: int, label_len: int, batch: int, audio_zeros=np.zeros
) -> dict[str, np.ndarray]:
    """Packs utterances ({'audio': int16[n], 'labels': int32[m]}) into one padded batch.

    `audio_zeros(shape, dtype)` allocates the (large) audio array, zero-filled.
    """
    out = {
        "audio": audio_zeros((batch, samples), np.int16),
        "audio_lengths": np.zeros((batch,), np.int32),
        "labels": np.zeros((batch, label_len), np.int32),
        "label_lengths": np.zeros((batch,), np.int32),
        "weights": np.zeros((batch,), np.float32),
    }
    for i, utt in enumerate(utts):
        n, m = len(utt["audio"]), len(utt["labels"])
        if n > samples or m > label_len:
            raise ValueError(f"utterance of {n} samples / {m} labels exceeds bucket {samples}/{label_len}")
        out["audio"][i, :n] = utt["audio"]
        out["audio_lengths"][i] = n
        out["labels"][i, :m] = utt["labels"]
        out["label_lengths"][i] = m
        out["weights"][i] = 1.0
    return out


def shard_for_devices(batch: dict[str, np.ndarray], num_devices: int) -> dict[str, np.ndarray]:
    """[B, ...] -> [num_devices, B / num_devices, ...]."""

    def split(x):
        if x.shape[0] % num_devices:
            raise ValueError(f"local batch {x.shape[0]} is not divisible by {num_devices} devices")
        return x.reshape((num_devices, x.shape[0] // num_devices) + x.shape[1:])

    return {k: split(v) for k, v in batch.items()}
