"""The synthetic source: random int16 audio and random transcripts, a pure function of
(seed, index), for compute-only runs and tests. Host code, no jax."""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from ds2_jax import geometry, text
from ds2_jax.pipeline import augment
from ds2_jax.pipeline import plan as plan_lib
from ds2_jax.pipeline.batch import Sharding, pad_batch
from ds2_jax.pipeline.source import DataSettings, StatsFn

EVAL_INDEX_OFFSET = 10**9  # Synthetic indices from here on stand in for a held-out split.
MAX_CACHED_POOLS = 4  # Padded synthetic batches kept: at most this many pools' worth of rows.


class SyntheticSource:
    """Random int16 audio and random transcripts, a pure function of (seed, index).

    Durations are uniform in [min_s, max_s]; all batches are padded to the maximum,
    so there is one compiled shape. Transcripts fit their frames (CTC feasible).
    Index i is utterance i % synthetic_pool_size of a pool made once at construction,
    so a batch costs a copy, not random generation: the source never limits the step.
    """

    def __init__(self, data: DataSettings, sharding: Sharding):
        d = data.dataset
        self.seed = data.seed
        self.sharding = sharding
        self.spectrogram = data.spectrogram
        self.sample_rate = data.spectrogram.sample_rate
        self.alphabet = text.LIBRISPEECH
        self.min_samples = int(d.synthetic_min_duration_s * self.sample_rate)
        self.max_samples = int(d.synthetic_max_duration_s * self.sample_rate)
        if not 0 < self.min_samples <= self.max_samples:
            raise ValueError("dataset.synthetic_min_duration_s must be > 0 and <= synthetic_max_duration_s")
        if d.synthetic_pool_size < 1:
            raise ValueError(f"dataset.synthetic_pool_size must be >= 1, got {d.synthetic_pool_size}")
        self.pool_size = d.synthetic_pool_size
        self.chars_per_second = d.synthetic_chars_per_second
        self.num_conv_layers = data.num_conv_layers
        self.num_utterances = d.synthetic_num_utterances
        max_out = self._output_frames(self.max_samples)
        self.max_label_len = max(1, min(int(self.chars_per_second * d.synthetic_max_duration_s), max_out // 2))
        # Made up front: filling it lazily would hold the first pool_size / batch steps back.
        self._pool = {key: self.generate(key) for key in range(self.pool_size)}
        self.augment = augment.make(data.waveform, data.seed, self.sample_rate)  # None: off
        self.pad_samples = plan_lib.stretched(self.max_samples, data.waveform.stretch)
        self._batches: dict[int, dict[str, np.ndarray]] = {}  # first row % pool_size -> padded batch

    def _output_frames(self, num_samples: int) -> int:
        frames = geometry.num_frames(num_samples, self.spectrogram.window, self.spectrogram.hop)
        return geometry.output_frames(frames, self.num_conv_layers)

    def generate(self, key: int) -> dict[str, np.ndarray]:
        """Utterance `key` drawn from rng([seed, key])."""
        rng = np.random.default_rng([self.seed, key])
        n = int(rng.integers(self.min_samples, self.max_samples + 1))
        audio = (rng.standard_normal(n) * 2000).clip(-32768, 32767).astype(np.int16)
        out_frames = self._output_frames(n)
        m = max(1, min(int(self.chars_per_second * n / self.sample_rate), out_frames // 2, self.max_label_len))
        labels = rng.integers(1, self.alphabet.vocab_size, size=m).astype(np.int32)
        return {"audio": audio, "labels": labels}

    def utterance(self, index: int) -> dict[str, np.ndarray]:
        """Training index i -> pool entry i % pool_size; held-out indices have their own pool."""
        held_out = index >= EVAL_INDEX_OFFSET
        key = (EVAL_INDEX_OFFSET if held_out else 0) + index % self.pool_size
        if key not in self._pool:
            self._pool[key] = self.generate(key)
        return self._pool[key]

    def train_batch(self, step: int, audio_zeros=np.zeros) -> dict[str, np.ndarray]:
        """Rows first .. first + local of the pool. The padded batch depends on first % pool_size
        only, so the distinct ones are kept (read-only) and handed out again, unless they would
        hold more than MAX_CACHED_POOLS pools' worth of rows."""
        s = self.sharding
        first = step * s.global_batch + s.start
        key = first % self.pool_size
        if self.augment is not None:  # each step's own draws: nothing to keep
            utts = [
                dict(u, audio=self.augment(u["audio"], step, s.start + i))
                for i, u in enumerate(self.utterance(j) for j in range(first, first + s.local_batch))
            ]
            return pad_batch(utts, self.pad_samples, self.max_label_len, len(utts), audio_zeros)
        if audio_zeros is np.zeros and key in self._batches:
            return self._batches[key]
        utts = [self.utterance(i) for i in range(first, first + s.local_batch)]
        batch = pad_batch(utts, self.pad_samples, self.max_label_len, len(utts), audio_zeros)
        distinct = self.pool_size // math.gcd(s.global_batch, self.pool_size)
        if audio_zeros is np.zeros and distinct * s.local_batch <= MAX_CACHED_POOLS * self.pool_size:
            for array in batch.values():
                array.flags.writeable = False
            self._batches[key] = batch
        return batch

    def eval_batches(self, split: str, max_utterances: int = 0) -> Iterator[dict[str, np.ndarray]]:
        # A held-out range of indices stands in for a split.
        total = max_utterances or 4 * self.sharding.global_batch
        s = self.sharding
        for first in range(0, total, s.global_batch):
            lo = EVAL_INDEX_OFFSET + first + s.start
            n = max(0, min(s.local_batch, total - first - s.start))
            utts = [self.utterance(i) for i in range(lo, lo + n)]
            yield pad_batch(utts, self.pad_samples, self.max_label_len, s.local_batch)

    def shapes(self) -> list[tuple[int, int]]:
        return [(self.pad_samples, self.max_label_len)]

    def check_eval_split(self, spec: str) -> None:
        """Every split name is one: a held-out range of indices stands in for it."""

    def feature_stats(self, stats: StatsFn) -> tuple[np.ndarray, np.ndarray]:
        return stats((self.generate(EVAL_INDEX_OFFSET - 1 - i)["audio"] for i in range(8)), self.spectrogram)
