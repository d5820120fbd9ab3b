"""Which utterances of a split are used: the duration bounds and CTC feasibility. No jax."""

from __future__ import annotations

import logging

import numpy as np

from ds2_jax import geometry
from ds2_jax.pipeline.source import DataSettings
from ds2_jax.pipeline.split_index import SplitIndex


class Filter:
    """Keeps utterances in [dataset.min_duration_s, max_duration_s] with clean text and
    at least the CTC frames their labels need under model.num_conv_layers."""

    def __init__(self, data: DataSettings):
        d, self.spectrogram = data.dataset, data.spectrogram
        self.sample_rate = self.spectrogram.sample_rate
        self.num_conv_layers = data.num_conv_layers
        # round, not int: 2.01 s is 32160 samples, but int(2.01 * 16000) is 32159
        self.min_samples = round(d.min_duration_s * self.sample_rate)
        self.max_samples = round(d.max_duration_s * self.sample_rate) if d.max_duration_s > 0 else None

    def kept(self, idx: SplitIndex, name: str) -> np.ndarray:
        """Record indices of split `name` that pass the duration and CTC filters; logs the counts."""
        n = idx.num_samples
        short = n < self.min_samples
        long = n > self.max_samples if self.max_samples is not None else np.zeros(len(n), bool)
        window, hop = self.spectrogram.window, self.spectrogram.hop
        frames = geometry.output_frames(geometry.num_frames(n, window, hop), self.num_conv_layers)
        need = idx.min_frames
        infeasible = ~short & ~long & ~idx.bad_text & (frames < need)
        keep = ~(short | long | idx.bad_text | infeasible)
        logging.info(
            "%s: %d of %d utterances kept (%.2f h); filtered: shorter than %.1f s: %d, "
            "longer than %s s: %d, bad text: %d, CTC-infeasible for %d conv layers: %d",
            name,
            keep.sum(),
            len(n),
            n[keep].sum() / self.sample_rate / 3600,
            self.min_samples / self.sample_rate,
            short.sum(),
            "inf" if self.max_samples is None else f"{self.max_samples / self.sample_rate:.1f}",
            long.sum(),
            (idx.bad_text & ~short & ~long).sum(),
            self.num_conv_layers,
            infeasible.sum(),
        )
        return np.flatnonzero(keep)
