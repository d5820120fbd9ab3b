"""What the training loop needs from a dataset (`Source`), the settings a source reads
(`DataSettings`), and the choice of source by dataset.name (`SOURCES`, `make_source`, `open_source`).

Sources are random access by step (`train_batch(step)`), so a resumed run sees the same
batches as an uninterrupted one. Host code, no jax: the one jax computation a source
needs, the spectrogram statistics, is handed to `feature_stats` by its caller.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Iterable, Iterator, Protocol

import numpy as np

from ds2_jax import settings, text
from ds2_jax.pipeline.batch import Sharding

# dataset.name -> "module:class" of its source, imported on use (tfds is slow to import).
SOURCES = {
    "synthetic": "ds2_jax.pipeline.synthetic:SyntheticSource",
    "librispeech_local": "ds2_jax.pipeline.tfds_source:TfdsSource",
    "librispeech": "ds2_jax.pipeline.tfds_source:TfdsSource",
    "manifest": "ds2_jax.pipeline.tfds_source:TfdsSource",
}

# (int16 waveforms, the spectrogram) -> per-bin <float32>[num_bins] (mean, std): features.spectrogram_stats.
StatsFn = Callable[[Iterable[np.ndarray], settings.Spectrogram], tuple[np.ndarray, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """The settings the data side reads, typed; picklable (grain workers open their own source)."""

    dataset: settings.Dataset
    spectrogram: settings.Spectrogram  # sample rate, window and hop: frames per utterance
    num_conv_layers: int  # model.num_conv_layers: the CTC frames an utterance has
    seed: int
    faults: settings.Faults = settings.Faults()  # the input workers' fault point (faults.Hooks.input_batch)
    waveform: settings.Waveform = settings.Waveform()  # training utterances' augmentation (pipeline.augment)
    # The main process has checked the prepared data against dataset.manual_dir (datasets.build.check_source,
    # a walk of every file): the copies its input workers get open the data without checking it again.
    source_checked: bool = False

    @classmethod
    def of(cls, config: settings.Settings) -> DataSettings:
        """The data side's part of a run's Settings."""
        return cls(
            dataset=config.dataset,
            spectrogram=config.features.spectrogram,
            num_conv_layers=config.model.num_conv_layers,
            seed=config.seed,
            faults=config.faults,
            waveform=config.waveform,
        )


class Source(Protocol):
    """What the training loop needs from a dataset."""

    alphabet: text.Alphabet  # what its labels spell (text.LIBRISPEECH, or the prepared data's)

    def train_batch(self, step: int, audio_zeros=np.zeros) -> dict[str, np.ndarray]:
        """This process's share of global batch `step`; deterministic in (seed, step).

        `audio_zeros(shape, dtype)` allocates the audio array (workers: shared memory).
        """

    def eval_batches(self, split: str, max_utterances: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Whole split in fixed shapes; the last batch padded with weight-0 rows."""

    def shapes(self) -> list[tuple[int, int]]:
        """(samples, label length) of every padded train batch shape (= compiled shapes)."""

    def feature_stats(self, stats: StatsFn) -> tuple[np.ndarray, np.ndarray]:
        """Per-bin <float32>[num_bins] mean and std of the normalized features' input:
        `stats` (features.spectrogram_stats) over a sample of this source's waveforms."""

    def check_eval_split(self, spec: str) -> None:
        """A ValueError naming dataset.eval_split when a split of `spec` is not in the data
        (training checks before its first step, not at the first eval thousands of steps in)."""


def make_source(config: settings.Settings, sharding: Sharding) -> Source:
    """The source named by dataset.name, for a run's Settings."""
    return open_source(DataSettings.of(config), sharding)


def with_data_alphabet(config: settings.Settings, source: Source) -> settings.Settings:
    """`config` with model.alphabet set to the alphabet of the source's labels (training
    sets the model's outputs from the data). A model.alphabet given that differs is a
    ValueError naming both."""
    given = text.Alphabet.of_setting(config.model.alphabet)
    if config.model.alphabet and given != source.alphabet:
        raise ValueError(
            f"model.alphabet={config.model.alphabet!r} ({given.describe()}) is not the alphabet of the "
            f"prepared {config.dataset.name} data ({source.alphabet.describe()}): leave model.alphabet "
            "unset (training takes the data's), or prepare the data with dataset.vocabulary"
        )
    if source.alphabet.setting == config.model.alphabet:
        return config
    return settings.override(config, {"model.alphabet": source.alphabet.setting})


def open_source(data: DataSettings, sharding: Sharding) -> Source:
    """The source named by data.dataset.name (an input worker opens its own from the DataSettings it was sent)."""
    module, _, name = SOURCES[data.dataset.name].partition(":")
    return getattr(importlib.import_module(module), name)(data, sharding)
