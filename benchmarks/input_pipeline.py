"""Input throughput: utterances/s from a prepared librispeech_local to padded batches.

    python -m benchmarks.input_pipeline --make_clips=512 --workdir=/tmp/ds2_bench
    python -m benchmarks.input_pipeline --manual_dir=DIR [--data_dir=D]
    python -m benchmarks.input_pipeline --data_dir=D  # already prepared

--make_clips=N first writes N clips of 6-8 s (noisy tones; the reader never looks at the
content) in the LibriSpeech layout under --workdir and builds them, reporting build time
and peak memory. Reading uses only utterances of 6-8 s (the seed's training window),
through ds2_jax.pipeline.loader as the trainer reads (inline with --num_workers=0, else grain
worker processes; several counts in one run, e.g. --num_workers=0,1,2,4,8,16), after a
warm-up of four batches per worker (the first batch's wait, worker start-up, reported apart).
--to_device also stages every batch on all local jax
devices as the trainer does (parallel.put_batches). Each row: utt/s, the main process's
CPU use, and the peak resident memory of the process tree (workers included).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time

import numpy as np
import soundfile

from configs import default
from ds2_jax import settings
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import make_source


def make_clips(manual_dir: str, count: int, seed: int = 0, seconds: tuple[float, float] = (6.0, 8.0)) -> None:
    """`count` clips of `seconds` (uniform), 50 per chapter, as LibriSpeech/train-clean-100/..."""
    rng = np.random.default_rng(seed)
    for k in range(0, count, 50):
        speaker, chapter = 1 + k // 50, 100 + k // 50
        d = os.path.join(manual_dir, "LibriSpeech", "train-clean-100", str(speaker), str(chapter))
        os.makedirs(d, exist_ok=True)
        lines = []
        for j in range(min(50, count - k)):
            n = int(rng.uniform(*seconds) * 16_000)
            t = np.arange(n) / 16_000
            audio = 2000 * np.sin(2 * np.pi * rng.uniform(100, 400) * t) + 300 * rng.standard_normal(n)
            utt = f"{speaker}-{chapter}-{j:04d}"
            soundfile.write(os.path.join(d, utt + ".flac"), audio.astype(np.int16), 16_000)
            lines.append(f"{utt} " + " ".join(["THE QUICK BROWN FOX"] * 4))
        with open(os.path.join(d, f"{speaker}-{chapter}.trans.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


class PeakTreeRss:
    """Peak resident memory of this process plus its children (the workers), sampled."""

    def __init__(self, interval_s: float = 0.05):
        import psutil

        self._proc, self._interval, self.peak_mb = psutil.Process(), interval_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> float:
        total = 0
        for p in [self._proc, *self._proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except Exception:  # noqa: BLE001 - a child that just exited
                pass
        return total / 1e6

    def _run(self):
        while not self._stop.wait(self._interval):
            self.peak_mb = max(self.peak_mb, self._sample())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def read_rate(config, sharding, source, steps: int, to_device: bool) -> dict:
    """utt/s of steps 1..steps through ds2_jax.pipeline.loader (and the devices), after a warm-up."""
    import jax

    from ds2_jax import parallel
    from ds2_jax.pipeline import loader

    warm = 4 * max(1, loader.resolve_num_workers(config.dataset))  # every worker past its first batches
    host = loader.train_batches(config, sharding, source, 0, 1 + warm + steps)
    batches = (
        parallel.Parallel("pmap", jax.local_devices()).put_batches(host, config.prefetch_batches) if to_device else host
    )
    with PeakTreeRss() as rss:
        t = time.perf_counter()
        jax.block_until_ready(next(batches))
        first_batch_s = time.perf_counter() - t
        for _ in range(warm):
            jax.block_until_ready(next(batches))
        t, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            jax.block_until_ready(next(batches))
        wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    batches.close()
    utts = steps * sharding.global_batch
    return {
        "num_workers": loader.resolve_num_workers(config.dataset),
        "first_batch_s": round(first_batch_s, 2),
        "to_device": to_device,
        "utterances_per_s": round(utts / wall, 1),
        "main_process_cpu_fraction": round(cpu / wall, 2),
        "audio_hours_per_s": round(utts * 7.0 / 3600 / wall, 3),
        "peak_tree_rss_mb": round(rss.peak_mb, 0),
    }


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_string("manual_dir", "", "LibriSpeech tree or archives (as dataset.manual_dir).", flag_values=fv)
    flags.DEFINE_string("data_dir", "", "tfds data dir (as dataset.data_dir).", flag_values=fv)
    flags.DEFINE_integer("make_clips", 0, "Write and build this many 6-8 s clips.", flag_values=fv)
    flags.DEFINE_string("workdir", "/tmp/ds2_input_bench", "Where made clips and their build go.", flag_values=fv)
    flags.DEFINE_string("train_splits", "train-clean-100", "Splits read (as dataset.train_splits).", flag_values=fv)
    flags.DEFINE_integer("batch", 128, "Global batch.", flag_values=fv)
    flags.DEFINE_integer("steps", 40, "Timed batches per measurement.", flag_values=fv)
    flags.DEFINE_string("num_workers", "0", "Comma-separated worker counts, e.g. 0,1,2,4,8,16.", flag_values=fv)
    flags.DEFINE_bool("to_device", False, "Also stage each batch on the local jax devices.", flag_values=fv)
    flags.DEFINE_string("out", "", "Write the rows as JSON here.", flag_values=fv)


def main(argv=None) -> int:
    from ds2_jax import cli

    args, _ = cli.parse_args(argv, define_flags, __doc__)

    result = {"cores": os.cpu_count()}
    if args.make_clips:
        args.manual_dir = os.path.join(args.workdir, "manual")
        args.data_dir = args.data_dir or os.path.join(args.workdir, "tfds")
        if not os.path.isdir(args.manual_dir):
            t = time.perf_counter()
            make_clips(args.manual_dir, args.make_clips)
            result["make_clips_s"] = round(time.perf_counter() - t, 1)
    if args.manual_dir:
        from ds2_jax.datasets import build

        t = time.perf_counter()
        builder = build.build(args.manual_dir, args.data_dir)
        result["build_s"] = round(time.perf_counter() - t, 1)
        result["build_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 0)
        result["prepared_mb"] = round(
            sum(os.path.getsize(os.path.join(builder.data_dir, f)) for f in os.listdir(builder.data_dir)) / 1e6, 1
        )

    config = default.get_config()
    config.dataset.name = "librispeech_local"
    config.dataset.manual_dir = args.manual_dir
    config.dataset.data_dir = args.data_dir
    config.dataset.train_splits = args.train_splits
    config.dataset.min_duration_s, config.dataset.max_duration_s = 6.0, 8.0
    config = settings.from_config_dict(config)
    sharding = Sharding(args.batch)
    t = time.perf_counter()
    source = make_source(config, sharding)
    result["open_s"] = round(time.perf_counter() - t, 2)
    print(json.dumps(result), flush=True)
    rows = []
    for workers in (int(w) for w in args.num_workers.split(",")):
        with_workers = settings.override(config, {"dataset.num_workers": workers})
        row = {"batch": args.batch, **read_rate(with_workers, sharding, source, args.steps, args.to_device)}
        row["utterances_per_s_per_worker"] = round(row["utterances_per_s"] / max(workers, 1), 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**result, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    from ds2_jax import errors

    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
