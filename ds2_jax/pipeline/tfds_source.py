"""LibriSpeech from tfds as bucketed, sharded numpy batches (a `pipeline.source.Source`).

Reads `tfds` array_record data sources (random access, numpy; TensorFlow is never
imported). On the first run it builds `librispeech_local` from `dataset.manual_dir` and
caches, beside the prepared dataset, each split's index (pipeline.split_index: num_samples
and labels, so filters and buckets never decode audio) and the feature statistics.
Which utterances are used is pipeline.filters'; the buckets and the order of batches, a pure
function of (seed, step), are pipeline.plan's. No jax.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import re
from typing import Iterator

import numpy as np

from ds2_jax import files, text
from ds2_jax.pipeline import augment
from ds2_jax.pipeline import plan as plan_lib
from ds2_jax.pipeline.batch import Sharding, pad_batch
from ds2_jax.pipeline.filters import Filter
from ds2_jax.pipeline.source import DataSettings, StatsFn
from ds2_jax.pipeline.split_index import SplitIndex, cached, flat_index, split_names

_FEATURE_STATS_SALT = 0xFEA7  # Keeps the stats sample independent of the batch order.


class TfdsSource:
    """`pipeline.source.Source` over tfds `librispeech_local` (or a TF-free `librispeech`)."""

    def __init__(self, data: DataSettings, sharding: Sharding):
        d = data.dataset
        self.seed = data.seed
        self.sharding = sharding
        if sharding.global_batch % sharding.process_count:
            raise ValueError(
                f"global batch {sharding.global_batch} is not divisible by {sharding.process_count} processes"
            )
        self.spectrogram = data.spectrogram
        self.sample_rate = data.spectrogram.sample_rate
        self.filter = Filter(data)
        self.sortagrad = d.sortagrad
        self.num_stats_utterances = d.feature_stats_utterances
        self.builder = _open_builder(data, sharding)
        self.alphabet = _alphabet(self.builder)
        self.audio_key = "speech" if "speech" in self.builder.info.features else "audio"
        self._sources: dict[str, object] = {}
        self._indexes: dict[str, SplitIndex] = {}
        self.train_splits = [self._resolve(s) for s in split_names(d.train_splits)]
        self.eval_split = d.eval_split

        # Training set: (split, record) of every kept utterance, then buckets.
        parts = [(s, self._filtered(s)) for s in self.train_splits]
        self._train_split = np.concatenate([np.full(len(k), i) for i, (_, k) in enumerate(parts)])
        self._train_record = np.concatenate([k for _, k in parts])
        self._train_samples = np.concatenate([self._index(s).num_samples[k] for s, k in parts])
        self._train_labels = [self._index(s).labels[r] for s, k in parts for r in k]
        n, batch = len(self._train_record), sharding.global_batch
        if n < batch:
            raise ValueError(
                f"{n} training utterances after filtering, fewer than the global batch {batch}: "
                "lower per_device_batch_size or widen dataset.min/max_duration_s"
            )
        label_lengths = np.array([len(x) for x in self._train_labels], np.int64)
        self.augment = augment.make(data.waveform, data.seed, self.sample_rate)  # None: off
        self.buckets = plan_lib.make_buckets(
            self._train_samples,
            label_lengths,
            min(d.num_buckets, n // batch),
            self.spectrogram.hop,
            data.waveform.stretch,
        )
        self.steps_per_epoch = self.buckets.steps_per_epoch(batch)
        logging.info(
            "training buckets (%d steps per epoch):\n%s",
            self.steps_per_epoch,
            self.buckets.describe(batch, self.sample_rate),
        )
        self._plans: collections.OrderedDict = collections.OrderedDict()

    # --- Splits and their index ----------------------------------------------------------

    def _resolve(self, split: str) -> str:
        """Accepts 'train_clean_100' and tfds's official spelling 'train_clean100' for either."""
        for name in (split, re.sub(r"_(\d+)$", r"\1", split), re.sub(r"([a-z])(\d+)$", r"\1_\2", split)):
            if name in self.builder.info.splits:
                return name
        return split  # _source names the splits that exist

    def check_eval_split(self, spec: str) -> None:
        """A ValueError naming dataset.eval_split when `spec` is not prepared (training checks it
        before the first step, not at the first eval thousands of steps in)."""
        for split in split_names(spec):
            self._check_split(
                self._resolve(split),
                f"dataset.eval_split={spec!r}: ",
                " (or --config.eval_every_steps=0 to train without evals)",
            )

    def _check_split(self, split: str, setting: str = "", alternative: str = "") -> None:
        if split not in self.builder.info.splits:
            raise ValueError(
                f"{setting}split {split!r} is not in the prepared {self.builder.name} at "
                f"{self.builder.data_dir} (it has {sorted(self.builder.info.splits)}): put it in "
                "dataset.manual_dir and delete that directory to rebuild, or change "
                f"dataset.train_splits / dataset.eval_split{alternative}"
            )

    def _source(self, split: str):
        if split not in self._sources:
            self._check_split(split)
            self._sources[split] = self.builder.as_data_source(split)
        return self._sources[split]

    def _index(self, split: str) -> SplitIndex:
        """Per-split num_samples and labels, read once without audio and cached as .npz."""
        if split not in self._indexes:
            n = len(self._source(split))
            path = os.path.join(os.fspath(self.builder.data_dir), f"ds2_index_{split}.npz")
            self._indexes[split] = cached(path, n, lambda: self._build_index(split, n), split)
        return self._indexes[split]

    def _build_index(self, split: str, n: int):
        """split_index.flat_index of `split`, read without audio."""
        import tensorflow_datasets as tfds

        logging.info("indexing %s/%s (%d utterances, once)", self.builder.name, split, n)
        ds = self.builder.as_data_source(split, decoders={self.audio_key: tfds.decode.SkipDecoding()})

        def examples():
            for i in range(n):
                ex = ds[i]
                if "num_samples" in ex:
                    yield ex["num_samples"], ex["text"]
                else:  # official build: count the samples (slow path, cached)
                    yield len(self._source(split)[i][self.audio_key]), ex["text"]

        # Stored transcripts are normalized at build; tfds's own `librispeech` keeps capitals.
        return flat_index(examples(), n, self.alphabet, lambda t: text.normalize(t, strip_punctuation=False))

    def _filtered(self, split: str) -> np.ndarray:
        return self.filter.kept(self._index(split), f"{self.builder.name}/{split}")

    # --- Training batches ----------------------------------------------------------------

    def _plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        """plan.epoch_plan of `epoch`; the last two epochs' plans are kept."""
        if epoch not in self._plans:
            self._plans[epoch] = plan_lib.epoch_plan(
                self.seed, epoch, self.buckets, self.sharding.global_batch, self.sortagrad
            )
            while len(self._plans) > 2:
                self._plans.popitem(last=False)
        self._plans.move_to_end(epoch)
        return self._plans[epoch]

    def train_batch(self, step: int, audio_zeros=np.zeros) -> dict[str, np.ndarray]:
        """This process's rows of global batch `step` (pipeline.plan's order)."""
        epoch, pos = divmod(int(step), self.steps_per_epoch)
        bucket, members = self._plan(epoch)[pos]
        s = self.sharding
        rows = members[s.start : s.start + s.local_batch]
        audio = self._read(self._train_split[rows], self._train_record[rows])
        if self.augment is not None:  # row: its place in the global batch, whatever the processes
            audio = [self.augment(a, step, s.start + i) for i, a in enumerate(audio)]
        utts = [{"audio": a, "labels": self._train_labels[i]} for a, i in zip(audio, rows)]
        samples, label_len = self.buckets.shapes[bucket]
        return pad_batch(utts, samples, label_len, s.local_batch, audio_zeros)

    def _read(self, split_ids: np.ndarray, records: np.ndarray) -> list[np.ndarray]:
        """int16 waveforms of (train split id, record) pairs, in order."""

        def one(pair):
            split_id, record = pair
            ex = self._source(self.train_splits[split_id])[int(record)]
            return np.asarray(ex[self.audio_key]).astype(np.int16, copy=False)

        return [one(p) for p in zip(split_ids.tolist(), records.tolist())]

    def shapes(self) -> list[tuple[int, int]]:
        return list(self.buckets.shapes)

    # --- Evaluation ------------------------------------------------------------------------

    def eval_batches(self, split: str, max_utterances: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Every kept utterance of `split` once, in the training bucket shapes
        (plan.eval_shapes); each bucket's last batch is padded with weight-0 rows."""
        (name,) = [self._resolve(s) for s in split_names(split or self.eval_split)]
        idx = self._index(name)
        records = self._filtered(name)
        if max_utterances:
            records = records[:max_utterances]
        label_lens = np.array([len(idx.labels[r]) for r in records], np.int64)
        shapes, bucket = plan_lib.eval_shapes(
            idx.num_samples[records], label_lens, self.buckets.shapes, self.spectrogram.hop
        )
        if len(shapes) > len(self.buckets.shapes):
            logging.info(
                "%s: %d utterances exceed the training buckets; extra eval shape %s",
                name,
                (bucket == len(shapes) - 1).sum(),
                shapes[-1],
            )
        s = self.sharding
        source = self._source(name)
        for b, (num_samples, label_len) in enumerate(shapes):
            members = records[bucket == b]
            for first in range(0, len(members), s.global_batch):
                rows = members[first : first + s.global_batch][s.start : s.start + s.local_batch]
                utts = [
                    {
                        "audio": np.asarray(source[int(r)][self.audio_key]).astype(np.int16, copy=False),
                        "labels": idx.labels[r],
                    }
                    for r in rows
                ]
                yield pad_batch(utts, num_samples, label_len, s.local_batch)

    # --- Feature statistics ------------------------------------------------------------------

    def feature_stats(self, stats: StatsFn) -> tuple[np.ndarray, np.ndarray]:
        """`stats` over `feature_stats_utterances` random training utterances, computed once
        and cached as .npz in the dataset's data dir."""
        n = min(self.num_stats_utterances, len(self._train_record))
        rng = np.random.default_rng([self.seed, _FEATURE_STATS_SALT])
        rows = np.sort(rng.choice(len(self._train_record), size=n, replace=False))
        # The key is every input of the result: the utterances read (which the filters, the seed and
        # the count decide) and the whole spectrogram (eps too), so no other run shares the file.
        chosen = [(self.train_splits[int(self._train_split[r])], int(self._train_record[r])) for r in rows]
        key = f"{chosen}|{sorted(dataclasses.asdict(self.spectrogram).items())}"
        digest = hashlib.sha1(key.encode()).hexdigest()[:12]
        path = os.path.join(os.fspath(self.builder.data_dir), f"feature_stats_{digest}.npz")
        if os.path.exists(path):
            try:
                with np.load(path) as z:
                    mean, std = z["mean"], z["std"]
                if (
                    mean.shape == std.shape == (self.spectrogram.num_bins,)
                    and np.isfinite(mean).all()
                    and (std > 0).all()
                ):
                    return mean, std
                why = f"shapes {mean.shape}, {std.shape}, or values not finite / std not positive"
            except Exception as e:  # noqa: BLE001 - a torn or foreign file (np.load raises several types)
                why = f"{type(e).__name__}: {e}"
            logging.warning("the feature statistics cache %s is damaged (%s): computing them again", path, why)
        waves = (self._read(self._train_split[[r]], self._train_record[[r]])[0] for r in rows)
        mean, std = stats(waves, self.spectrogram)
        logging.info("feature stats from %d utterances of %s -> %s", n, "+".join(self.train_splits), path)
        try:
            with files.replacing(path, "wb") as f:  # a temporary name of its own: concurrent runs never mix
                np.savez(f, mean=mean, std=std)
        except OSError as e:
            logging.warning("could not cache feature stats at %s: %s", path, e)
        return mean, std


def _alphabet(builder) -> text.Alphabet:
    """The alphabet of a prepared dataset's labels: LibriSpeech's, or the one stored with a manifest build."""
    if builder.name == "manifest":
        from ds2_jax.datasets import manifest

        return manifest.read_alphabet(os.fspath(builder.data_dir))
    return text.LIBRISPEECH


def _open_builder(data: DataSettings, sharding: Sharding):
    """The prepared tfds builder named by dataset.name (building librispeech_local or manifest)."""
    d = data.dataset
    if d.name in ("librispeech_local", "manifest"):
        from ds2_jax.datasets import build, manifest

        options = manifest.Options.of(d, data.spectrogram) if d.name == "manifest" else None
        builder = build.get_builder(d.data_dir, d.name, options)
        if not builder.is_prepared():
            if sharding.process_count > 1:
                raise RuntimeError(
                    f"{d.name} is not prepared in dataset.data_dir={d.data_dir!r}; with "
                    f"several processes, build it first: {build.command(d.name, d.manual_dir, d.data_dir)} "
                    "with this run's --config=FILE and other --config.* flags"
                )
            logging.info("building %s from dataset.manual_dir=%r", d.name, d.manual_dir)
            builder = build.build(d.manual_dir, d.data_dir, d.name, options)
            split_reports = build.reports(builder)
            for report in split_reports.values():
                logging.info("%s", build.summary(report))
            if unknown := build.unknown_line(split_reports):
                logging.warning("%s", unknown)
        elif not data.source_checked:  # an input worker's copy is not: its main process has checked it
            if sharding.process_count > 1:
                build.check_source(builder, d.manual_dir)  # the files it was built from, or a DatasetMismatch
            else:  # the same check; a manifest dataset whose files changed is built again (its changed splits)
                builder = build.build(d.manual_dir, d.data_dir, d.name, options)
        return builder
    if d.name == "librispeech":
        # tfds's own `librispeech` builder class imports TensorFlow, so open the prepared
        # files directly (librispeech/[config/]version/); that works only if they were
        # written as array_record.
        import glob

        import tensorflow_datasets as tfds

        root = os.path.join(os.path.expanduser(d.data_dir or "~/tensorflow_datasets"), "librispeech")
        found = glob.glob(os.path.join(root, "*", "dataset_info.json"))
        found += glob.glob(os.path.join(root, "*", "*", "dataset_info.json"))
        if not found:
            raise FileNotFoundError(
                f"no prepared tfds 'librispeech' under {root} (dataset.data_dir={d.data_dir!r}); "
                "use dataset.name='librispeech_local' with dataset.manual_dir=<LibriSpeech archives>"
            )
        version = lambda p: tuple(int(x) for x in re.findall(r"\d+", os.path.basename(os.path.dirname(p))))  # noqa: E731
        builder = tfds.builder_from_directory(os.path.dirname(max(found, key=version)))
        if "array_record" not in str(builder.info.file_format).lower():
            raise NotImplementedError(
                f"tfds 'librispeech' in {builder.data_dir} is stored as {builder.info.file_format}, "
                "which only TensorFlow can read; use dataset.name='librispeech_local' with "
                "dataset.manual_dir=<LibriSpeech archives> (no TensorFlow needed)"
            )
        return builder
    raise ValueError(f"TfdsSource reads 'librispeech_local', 'manifest' or 'librispeech', not {d.name!r}")
