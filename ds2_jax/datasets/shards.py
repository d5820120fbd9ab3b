"""A split's array_record shards, each written whole by one build worker process.

A build's per-file work (decode, resample, downmix, the CTC check, the tf.Example record and
its write) runs in the worker that owns the shard; the main process
only hands out `ShardJob`s and collects each utterance's outcome (its sample count, or the
`audio.Skip` saying why not). So nothing per byte passes through one process, and the build
scales with the workers (benchmarks/manifest_build.py).

What goes where does not depend on the number of processes: a split's utterances are put
in the order tfds's own writer gives (`tfds_order`: the md5 of each key salted with the split
name, which GeneratorBasedBuilder's shuffle sorts by) and cut into `shard_size(n)` runs, so
1, 2 or 16 workers write the same files. Host code: no jax, no TensorFlow.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import math
import multiprocessing
import os
import signal
from typing import Iterator, NamedTuple

import numpy as np

from ds2_jax import errors, geometry
from ds2_jax import workers as ds2_workers
from ds2_jax.datasets import audio as audio_lib

# tfds writes array_record with the format's default compression (brotli). Int16 speech
# barely compresses, and brotli decoding dominates a random read (figures: BUILD_NOTES.md,
# "Input pipeline"), so the records are written uncompressed; readers find it in each file.
RECORD_OPTIONS = "group_size:1,uncompressed"
TARGET_SHARDS = 64  # Shards a split is cut into, within the bounds below: work for 16+ workers.
MIN_SHARD = 16  # Utterances per shard, at least (a tiny split: a few small files)...
MAX_SHARD = 2048  # ...and at most (LibriSpeech's 12 s utterances: ~0.8 GB a shard).
BUILD_NUM_CONV_LAYERS = 2  # the conv stack the build's CTC feasibility check assumes (the default model's)


def shard_size(n: int) -> int:
    """Utterances per shard of a split of `n` (a function of n only: any worker count writes the same shards)."""
    return min(MAX_SHARD, max(MIN_SHARD, math.ceil(n / TARGET_SHARDS)))


def tfds_order(keys: list[str], split: str) -> list[int]:
    """Indices of `keys` in the order tfds's GeneratorBasedBuilder writes them (its shuffle: md5 of the
    key salted with the split name, ascending), so that a prepared split reads as tfds would have written it."""
    from tensorflow_datasets.core import hashing

    hasher = hashing.Hasher(salt=split)
    hashed = [hasher.hash_key(k) for k in keys]
    return sorted(range(len(keys)), key=hashed.__getitem__)


@dataclasses.dataclass(frozen=True)
class ShardJob:
    """A shard to write: `items` in order to the array_record file `path`."""

    split: str
    index: int  # of the split's shards
    path: str
    items: tuple  # of (position, id, audio path, normalized text, speaker)
    symbols: str  # the alphabet (text.Alphabet.symbols) the labels are counted in
    sample_rate: int
    stereo: str
    window: int
    hop: int

    def describe(self) -> str:
        first, last = self.items[0][2], self.items[-1][2]
        return f"shard {self.index} of split {self.split!r} ({len(self.items)} files, {first} ... {last})"


@functools.lru_cache(maxsize=4)
def _alphabet(symbols: str):
    from ds2_jax import text

    return text.Alphabet(symbols)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, parts: list) -> list:
    """A length-delimited protobuf field `number` holding the bytes-like `parts`, as a list of parts."""
    return [_varint(number << 3 | 2) + _varint(sum(len(p) for p in parts)), *parts]


def _feature(key: str, kind: int, value) -> list:
    """One entry of tf.train.Features' map: key -> Feature{kind: {value: [value]}} (kind 1: BytesList,
    3: Int64List, packed)."""
    return _field(1, _field(1, [key.encode()]) + _field(2, _field(kind, _field(1, [value]))))


def example_bytes(wav, normalized: str, key: str, speaker: str) -> bytes:
    """The serialized tf.train.Example of one utterance: the bytes tfds's ExampleSerializer gives for
    manifest.features() with protobuf's deterministic (key-sorted) map order (a test holds them equal).
    Written as protobuf's wire format here, the audio copied once: tfds's path (encode_example, a
    numpy conversion per feature, BytesList, SerializeToString) copies a 400 KB utterance four times,
    a sixth of a 16 kHz FLAC's decode, and would make every build worker import all of tfds."""
    audio = memoryview(np.ascontiguousarray(wav, "<i2")).cast("B")
    entries = (
        _feature("audio", 1, audio)
        + _feature("id", 1, key.encode())
        + _feature("num_samples", 3, _varint(len(wav)))
        + _feature("speaker", 1, speaker.encode())
        + _feature("text", 1, normalized.encode())
    )
    return b"".join(_field(1, entries))


class Kept(NamedTuple):
    """A written utterance's outcome: its sample count and how many of them were clipped."""

    samples: int
    clipped: int = 0


def utterance(job: ShardJob, audio_path: str, normalized: str) -> audio_lib.Audio | audio_lib.Skip:
    """The audio of one utterance, or the audio.Skip that says why it is not kept."""
    got = audio_lib.load(audio_path, job.sample_rate, job.stereo)
    if isinstance(got, audio_lib.Skip):
        return got
    labels = _alphabet(job.symbols).encode(normalized)
    frames = geometry.output_frames(geometry.num_frames(len(got.samples), job.window, job.hop), BUILD_NUM_CONV_LAYERS)
    if frames < geometry.ctc_min_frames(labels):
        return audio_lib.Skip("ctc_infeasible", f"{len(labels)} labels, {frames} frames")
    return got


def write_shard(job: ShardJob) -> list:
    """Writes a shard; per item, in order, its Kept or the Skip that says why it was left out.
    Any failure of one file's work is that file's counted skip ('failed'), never the build's end."""
    from array_record.python import array_record_module

    writer = array_record_module.ArrayRecordWriter(job.path, RECORD_OPTIONS)
    outcomes = []
    try:
        for _, key, audio_path, normalized, speaker in job.items:
            try:
                got = utterance(job, audio_path, normalized)
                if not isinstance(got, audio_lib.Skip):
                    writer.write(example_bytes(got.samples, normalized, key, speaker))
                    got = Kept(len(got.samples), got.clipped)
            except Exception as e:  # noqa: BLE001 - one file's failure is its skip
                got = audio_lib.Skip("failed", f"{type(e).__name__}: {e}"[:200])
            outcomes.append(got)
    finally:
        writer.close()
    return outcomes


def _died(pool, processes: list, job: ShardJob) -> errors.BuildWorkerError:
    """The one-line error of a worker (of `pool`'s `processes`) that died while `job` (or one beside it)
    was running: how it died, not how the pool then ended the others (SIGTERM)."""
    # The broken pool terminates and joins its other workers; read the exit codes only after that
    # (a join racing the pool's own can see neither the code nor the process).
    pool.shutdown(wait=True, cancel_futures=True)
    codes = [p.exitcode for p in processes if p.exitcode]
    first = [c for c in codes if c != -signal.SIGTERM] or codes
    how = (
        ", ".join(
            f"killed by {signal.Signals(-c).name}" if c < 0 and -c in signal.valid_signals() else f"exit {c}"
            for c in first
        )
        or "killed"
    )
    return errors.BuildWorkerError(
        f"a dataset build worker process died ({how}) while writing {job.describe()} or a shard beside it: "
        "nothing was prepared. A SIGKILL is most often the out-of-memory killer (lower dataset.build_workers); "
        "otherwise rerun with --config.dataset.build_workers=0 to build in one process and see which file"
    )


def run(jobs: list[ShardJob], workers: int) -> Iterator[tuple[ShardJob, list]]:
    """(job, write_shard(job)) of every job, in order: inline (workers <= 0) or on `workers` spawned
    processes. A worker that dies is a BuildWorkerError naming the shard and how it died."""
    if workers <= 0 or len(jobs) <= 1:
        for job in jobs:
            yield job, write_shard(job)
        return
    # spawn, not fork: a build may run inside a training process that runs jax's threads.
    ctx = multiprocessing.get_context("spawn")
    # Each worker ends with this process (kill -9 of a build leaves no worker or resource tracker behind).
    pool = concurrent.futures.ProcessPoolExecutor(
        min(workers, len(jobs)), mp_context=ctx, initializer=ds2_workers.die_with_parent
    )
    try:
        futures = [pool.submit(write_shard, job) for job in jobs]  # a job is a few KB: all queued at once
        # The workers, started by the submits: their exit codes say how one died (the pool forgets them).
        processes = list((getattr(pool, "_processes", None) or {}).values())
        for done, (job, future) in enumerate(zip(jobs, futures), 1):
            try:
                outcomes = future.result()
            except concurrent.futures.process.BrokenProcessPool as e:
                raise _died(pool, processes, job) from e
            if done % max(1, len(jobs) // 10) == 0:
                logging.getLogger("ds2_jax").info("manifest: %d of %d shards written", done, len(jobs))
            yield job, outcomes
    finally:  # an error or Ctrl-C: the shards not started are dropped, not waited for
        pool.shutdown(wait=True, cancel_futures=True)


def shard_jobs(split: str, items: list, folder: str, **common) -> list[ShardJob]:
    """The ShardJobs of a split's `items` (in their written order), writing to `folder`."""
    size = shard_size(len(items))
    return [
        ShardJob(split, i, os.path.join(folder, f"{split}.shard{i:05d}.tmp"), tuple(items[s : s + size]), **common)
        for i, s in enumerate(range(0, len(items), size))
    ]
