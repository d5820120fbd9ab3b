"""Opening a LibriSpeech-sized training index: seconds and host memory.

    python -m benchmarks.index_scale [--utterances=281241] [--chars_per_second=15]

Writes the cached per-split index (ds2_index_<split>.npz, what TfdsSource reads on
every start after the first) for --utterances utterances of 1-35 s with random
transcripts, then times `TfdsSource(...)` over it: load, duration and CTC filters,
buckets, and two epoch plans. The audio records are not needed for that, so the data
source is a stand-in with the right length (a proxy for a 960 h build, which would not
fit the GPU host's disk as clips of its real length). Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time

import numpy as np

from configs import default
from ds2_jax.data import tfds_source
from ds2_jax import settings
from ds2_jax.data.batch import Sharding
from ds2_jax.data.source import DataSettings

SPLIT = "train_clean_100"


def write_index(directory: str, n: int, chars_per_second: float, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    seconds = rng.uniform(1.0, 35.0, n)
    lengths = np.clip((seconds * chars_per_second).astype(np.int64), 1, None)
    np.savez(os.path.join(directory, f"ds2_index_{SPLIT}.npz"),
             num_samples=(seconds * 16_000).astype(np.int64),
             labels=rng.integers(1, 29, lengths.sum()).astype(np.int8),
             label_offsets=np.concatenate([[0], np.cumsum(lengths)]),
             bad_text=np.zeros(n, bool))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_integer("utterances", 281_241, "Utterances in the index (LibriSpeech 960 h has 281,241).",
                         flag_values=fv)
    flags.DEFINE_float("chars_per_second", 15.0, "Transcript length per second of audio.", flag_values=fv)
    flags.DEFINE_integer("batch", 128, "Global batch.", flag_values=fv)


def main(argv=None) -> int:
    from ds2_jax import cli

    args, _ = cli.parse_args(argv, define_flags, __doc__)

    directory = tempfile.mkdtemp(prefix="ds2_index_")
    write_index(directory, args.utterances, args.chars_per_second)

    class Builder:  # the prepared builder's surface that TfdsSource reads
        name, data_dir = "librispeech_local", directory

        class info:  # noqa: N801
            splits = {SPLIT: None}
            features = {"audio": None}

    class Records:
        def __len__(self):
            return args.utterances

    tfds_source._open_builder = lambda dataset, sharding: Builder()
    tfds_source.TfdsSource._source = lambda self, split: Records()
    config = default.get_config()
    config.dataset.name = "librispeech_local"
    config.dataset.train_splits = SPLIT
    before = rss_mb()
    t = time.perf_counter()
    source = tfds_source.TfdsSource(DataSettings.of(settings.from_config_dict(config)), Sharding(args.batch))
    opened = time.perf_counter() - t
    source._plan(0), source._plan(1)
    print(json.dumps({
        "utterances": args.utterances,
        "open_s": round(opened, 2),
        "open_and_two_plans_s": round(time.perf_counter() - t, 2),
        "steps_per_epoch": source.steps_per_epoch,
        "index_rss_mb": round(rss_mb() - before, 0),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 0),
    }))
    return 0


if __name__ == "__main__":
    from ds2_jax import errors

    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
