"""LibriSpeech from tfds as bucketed, sharded numpy batches (the `Source` of input_pipeline).

Reads `tfds` array_record data sources (random access, numpy; TensorFlow is never
imported). On the first run it builds `librispeech_local` from `dataset.manual_dir` and
caches, beside the prepared dataset, a per-split index (num_samples and labels, so
filters and buckets never decode audio) and the feature statistics.

Order of a training run, a pure function of (seed, step):
  * utterances outside [min_duration_s, max_duration_s] or CTC-infeasible for
    model.num_conv_layers are dropped (counts logged);
  * the rest fall into <= dataset.num_buckets equal-count duration buckets, each with one
    padded (samples, label length) shape; a batch is drawn from one bucket;
  * epoch e: each bucket's utterances in ascending duration (e = 0 with SortaGrad) or
    shuffled by (seed, e, bucket), cut into global batches, and the batches in ascending
    order (SortaGrad) or shuffled by (seed, e). Step 0 is always a batch of the longest
    bucket, so running out of device memory shows at once.
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

from ds2_jax import batching, geometry, text

LABEL_ALIGN = 8  # Padded label lengths are multiples of this (fewer distinct shapes).
_FEATURE_STATS_SALT = 0xFEA7  # Keeps the stats sample independent of the batch order.


def split_names(spec: str) -> list[str]:
    """'train-clean-100+dev_clean' -> tfds names ['train_clean_100', 'dev_clean']."""
    names = [s.strip().replace("-", "_") for s in spec.split("+") if s.strip()]
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


def _round_up(x: int, multiple: int) -> int:
    return -(-int(x) // multiple) * multiple


class TfdsSource:
    """`input_pipeline.Source` over tfds `librispeech_local` (or a TF-free `librispeech`)."""

    def __init__(self, config, sharding: batching.Sharding):
        d = config.dataset
        self.seed = config.seed
        self.sharding = sharding
        if sharding.global_batch % sharding.process_count:
            raise ValueError(
                f"global batch {sharding.global_batch} is not divisible by {sharding.process_count} processes"
            )
        self.sample_rate = config.features.sample_rate
        self.window = int(round(self.sample_rate * config.features.window_ms / 1000))
        self.hop = int(round(self.sample_rate * config.features.hop_ms / 1000))
        self.num_conv_layers = config.model.num_conv_layers
        # round, not int: 2.01 s is 32160 samples, but int(2.01 * 16000) is 32159
        self.min_samples = round(d.min_duration_s * self.sample_rate)
        self.max_samples = round(d.max_duration_s * self.sample_rate) if d.max_duration_s > 0 else None
        self.sortagrad = d.sortagrad
        self.num_stats_utterances = d.feature_stats_utterances
        self.builder = _open_builder(config, sharding)
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
        self._make_buckets(min(d.num_buckets, n // batch))
        self._plans: collections.OrderedDict = collections.OrderedDict()

    # --- Index and filters ---------------------------------------------------------

    def _resolve(self, split: str) -> str:
        """Accepts 'train_clean_100' and tfds's official spelling 'train_clean100' for either."""
        for name in (split, re.sub(r"_(\d+)$", r"\1", split), re.sub(r"([a-z])(\d+)$", r"\1_\2", split)):
            if name in self.builder.info.splits:
                return name
        return split  # _source names the splits that exist

    def _source(self, split: str):
        if split not in self._sources:
            if split not in self.builder.info.splits:
                raise ValueError(
                    f"split {split!r} is not in the prepared {self.builder.name} at "
                    f"{self.builder.data_dir} (it has {sorted(self.builder.info.splits)}): put it in "
                    "dataset.manual_dir and delete that directory to rebuild, or change "
                    "dataset.train_splits / dataset.eval_split"
                )
            self._sources[split] = self.builder.as_data_source(split)
        return self._sources[split]

    def _index(self, split: str) -> SplitIndex:
        """Per-split num_samples and labels, read once without audio and cached as .npz."""
        if split in self._indexes:
            return self._indexes[split]
        n = len(self._source(split))
        path = os.path.join(os.fspath(self.builder.data_dir), f"ds2_index_{split}.npz")
        index = None
        if os.path.exists(path):
            with np.load(path) as z:
                if len(z["num_samples"]) == n:
                    index = SplitIndex.from_flat(z["num_samples"], z["labels"], z["label_offsets"], z["bad_text"])
        if index is None:
            num_samples, flat, offsets, bad_text = self._build_index(split, n)
            index = SplitIndex.from_flat(num_samples, flat, offsets, bad_text)
            try:
                np.savez(path + ".tmp.npz", num_samples=num_samples, labels=flat, label_offsets=offsets,
                         bad_text=bad_text)
                os.replace(path + ".tmp.npz", path)
            except OSError as e:
                logging.warning("could not cache the index of %s at %s: %s", split, path, e)
        self._indexes[split] = index
        return index

    def _build_index(self, split: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(num_samples, all label ids as <int8>, offsets, bad_text) of `split`, read without audio."""
        import tensorflow_datasets as tfds

        logging.info("indexing %s/%s (%d utterances, once)", self.builder.name, split, n)
        ds = self.builder.as_data_source(split, decoders={self.audio_key: tfds.decode.SkipDecoding()})
        num_samples = np.zeros(n, np.int64)
        labels, bad = [], np.zeros(n, bool)
        for i in range(n):
            ex = ds[i]
            if "num_samples" in ex:
                num_samples[i] = ex["num_samples"]
            else:  # official build: count the samples (slow path, cached)
                num_samples[i] = len(self._source(split)[i][self.audio_key])
            t = text.normalize(ex["text"].decode("utf-8") if isinstance(ex["text"], bytes) else ex["text"])
            if not t or text.unknown_chars(t):
                bad[i] = True
                labels.append(np.zeros(0, np.int32))
            else:
                labels.append(text.encode(t))
        lengths = np.array([len(x) for x in labels], np.int64)
        flat = np.concatenate(labels + [np.zeros(0, np.int32)]).astype(np.int8)
        return num_samples, flat, np.concatenate([[0], np.cumsum(lengths)]), bad

    def _filtered(self, split: str) -> np.ndarray:
        """Record indices of `split` that pass the duration and CTC filters; logs the counts."""
        idx = self._index(split)
        n = idx.num_samples
        short = n < self.min_samples
        long = n > self.max_samples if self.max_samples is not None else np.zeros(len(n), bool)
        frames = geometry.output_frames(geometry.num_frames(n, self.window, self.hop), self.num_conv_layers)
        need = idx.min_frames
        infeasible = ~short & ~long & ~idx.bad_text & (frames < need)
        keep = ~(short | long | idx.bad_text | infeasible)
        logging.info(
            "%s/%s: %d of %d utterances kept (%.2f h); filtered: shorter than %.1f s: %d, "
            "longer than %s s: %d, bad text: %d, CTC-infeasible for %d conv layers: %d",
            self.builder.name, split, keep.sum(), len(n), n[keep].sum() / self.sample_rate / 3600,
            self.min_samples / self.sample_rate, short.sum(),
            "inf" if self.max_samples is None else f"{self.max_samples / self.sample_rate:.1f}",
            long.sum(), (idx.bad_text & ~short & ~long).sum(), self.num_conv_layers, infeasible.sum(),
        )
        return np.flatnonzero(keep)

    # --- Buckets and the training order ----------------------------------------------

    def _make_buckets(self, num_buckets: int) -> None:
        """Equal-count buckets over the duration order; each padded to its longest member."""
        order = np.argsort(self._train_samples, kind="stable")
        self._buckets = np.array_split(order, num_buckets)
        self._shapes = []
        for members in self._buckets:
            samples = _round_up(self._train_samples[members].max(), self.hop)
            label_len = _round_up(max(len(self._train_labels[i]) for i in members), LABEL_ALIGN)
            self._shapes.append((samples, label_len))
        batch = self.sharding.global_batch
        lines = [
            f"  bucket {b}: {len(m)} utterances, <= {s / self.sample_rate:.2f} s -> "
            f"[{batch}, {s}] samples, [{batch}, {l}] labels"
            for b, (m, (s, l)) in enumerate(zip(self._buckets, self._shapes))
        ]
        logging.info(
            "training buckets (%d steps per epoch):\n%s", self.steps_per_epoch, "\n".join(lines)
        )

    @property
    def steps_per_epoch(self) -> int:
        return sum(len(m) // self.sharding.global_batch for m in self._buckets)

    def _plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        """[(bucket, global batch of training indices)] of one epoch; a function of (seed, epoch)."""
        if epoch in self._plans:
            self._plans.move_to_end(epoch)
            return self._plans[epoch]
        batch = self.sharding.global_batch
        ascending = self.sortagrad and epoch == 0
        plan = []
        for b, members in enumerate(self._buckets):
            if not ascending:
                members = np.random.default_rng([self.seed, epoch, b]).permutation(members)
            for k in range(len(members) // batch):
                plan.append((b, members[k * batch : (k + 1) * batch]))
        if not ascending:
            plan = [plan[i] for i in np.random.default_rng([self.seed, epoch]).permutation(len(plan))]
        if epoch == 0:  # the longest shape first: an OOM shows at step 0, not hours later
            last = len(self._buckets) - 1
            first = len(plan) - 1 if ascending else next(i for i, (b, _) in enumerate(plan) if b == last)
            plan.insert(0, plan.pop(first))
        self._plans[epoch] = plan
        while len(self._plans) > 2:
            self._plans.popitem(last=False)
        return plan

    def train_batch(self, step: int, audio_zeros=np.zeros) -> dict[str, np.ndarray]:
        """This process's rows of global batch `step` (see the module docstring)."""
        epoch, pos = divmod(int(step), self.steps_per_epoch)
        bucket, members = self._plan(epoch)[pos]
        s = self.sharding
        rows = members[s.start : s.start + s.local_batch]
        audio = self._read(self._train_split[rows], self._train_record[rows])
        utts = [{"audio": a, "labels": self._train_labels[i]} for a, i in zip(audio, rows)]
        samples, label_len = self._shapes[bucket]
        return batching.pad_batch(utts, samples, label_len, s.local_batch, audio_zeros)

    def _read(self, split_ids: np.ndarray, records: np.ndarray) -> list[np.ndarray]:
        """int16 waveforms of (train split id, record) pairs, in order."""
        def one(pair):
            split_id, record = pair
            ex = self._source(self.train_splits[split_id])[int(record)]
            return np.asarray(ex[self.audio_key]).astype(np.int16, copy=False)

        return [one(p) for p in zip(split_ids.tolist(), records.tolist())]

    def shapes(self) -> list[tuple[int, int]]:
        return list(self._shapes)

    # --- Evaluation --------------------------------------------------------------------

    def eval_batches(self, split: str, max_utterances: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Every kept utterance of `split` once, in the training bucket shapes.

        Utterances go to the smallest bucket they fit; ones longer than every bucket get
        one extra shape. Each bucket's last batch is padded with weight-0 rows.
        """
        (name,) = [self._resolve(s) for s in split_names(split or self.eval_split)]
        idx = self._index(name)
        records = self._filtered(name)
        if max_utterances:
            records = records[:max_utterances]
        samples = idx.num_samples[records]
        label_lens = np.array([len(idx.labels[r]) for r in records], np.int64)
        shapes = list(self._shapes)
        fits = lambda s, l: (samples <= s) & (label_lens <= l)  # noqa: E731
        if records.size and not fits(*shapes[-1]).all():
            extra = (_round_up(samples.max(), self.hop), _round_up(label_lens.max(), LABEL_ALIGN))
            shapes.append((max(extra[0], shapes[-1][0]), max(extra[1], shapes[-1][1])))
            logging.info("%s: %d utterances exceed the training buckets; extra eval shape %s",
                         name, (~fits(*self._shapes[-1])).sum(), shapes[-1])
        bucket = np.full(len(records), -1)
        for b in reversed(range(len(shapes))):
            bucket[fits(*shapes[b])] = b
        s = self.sharding
        source = self._source(name)
        for b, (num_samples, label_len) in enumerate(shapes):
            members = records[bucket == b]
            for first in range(0, len(members), s.global_batch):
                rows = members[first : first + s.global_batch][s.start : s.start + s.local_batch]
                utts = [
                    {"audio": np.asarray(source[int(r)][self.audio_key]).astype(np.int16, copy=False),
                     "labels": idx.labels[r]}
                    for r in rows
                ]
                yield batching.pad_batch(utts, num_samples, label_len, s.local_batch)

    # --- Feature statistics --------------------------------------------------------------

    def feature_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-bin mean/std over `feature_stats_utterances` random training utterances.

        Computed once and cached as .npz in the dataset's data dir.
        """
        n = min(self.num_stats_utterances, len(self._train_record))
        key = f"{'+'.join(self.train_splits)}|{n}|{self.seed}|{self.window}|{self.hop}"
        digest = hashlib.sha1(key.encode()).hexdigest()[:12]
        path = os.path.join(os.fspath(self.builder.data_dir), f"feature_stats_{digest}.npz")
        if os.path.exists(path):
            with np.load(path) as z:
                return z["mean"], z["std"]
        rng = np.random.default_rng([self.seed, _FEATURE_STATS_SALT])
        rows = np.sort(rng.choice(len(self._train_record), size=n, replace=False))
        waves = (self._read(self._train_split[[r]], self._train_record[[r]])[0] for r in rows)
        mean, std = batching.compute_feature_stats(waves)
        logging.info("feature stats from %d utterances (%s) -> %s", n, key, path)
        try:
            np.savez(path + ".tmp.npz", mean=mean, std=std)
            os.replace(path + ".tmp.npz", path)
        except OSError as e:
            logging.warning("could not cache feature stats at %s: %s", path, e)
        return mean, std


def _open_builder(config, sharding: batching.Sharding):
    """The prepared tfds builder named by config.dataset.name (building librispeech_local)."""
    d = config.dataset
    if d.name == "librispeech_local":
        from ds2_jax.datasets import build

        builder = build.get_builder(d.data_dir)
        if not builder.is_prepared():
            if sharding.process_count > 1:
                raise RuntimeError(
                    f"librispeech_local is not prepared in dataset.data_dir={d.data_dir!r}; with "
                    "several processes, build it first: python -m ds2_jax.datasets.build "
                    f"--manual_dir={d.manual_dir or 'DIR'} --data_dir={d.data_dir or 'D'}"
                )
            logging.info("building librispeech_local from dataset.manual_dir=%r", d.manual_dir)
            builder = build.build(d.manual_dir, d.data_dir)
            for report in build.reports(builder).values():
                logging.info("%s", build.summary(report))
        else:
            build.check_source(builder, d.manual_dir)  # the files it was built from, or a DatasetMismatch
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
    raise ValueError(f"TfdsSource reads 'librispeech_local' or 'librispeech', not {d.name!r}")
