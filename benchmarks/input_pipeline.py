"""Input throughput: utterances/s from a prepared librispeech_local to padded batches.

    python -m benchmarks.input_pipeline --make_clips=512 --workdir=/tmp/ds2_bench
    python -m benchmarks.input_pipeline --manual_dir=DIR [--data_dir=D]
    python -m benchmarks.input_pipeline --data_dir=D  # already prepared

--make_clips=N first writes N clips of 6-8 s (noisy tones; the reader never looks at the
content) in the LibriSpeech layout under --workdir and builds them, reporting build time
and peak memory. Reading uses only utterances of 6-8 s (the seed's training window),
one host thread unless --num_workers, so the number is per host core. --to_device also
copies each batch to the first jax device.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np
import soundfile

from configs import default
from ds2_jax import input_pipeline


def make_clips(manual_dir: str, count: int, seed: int = 0) -> None:
    """`count` 6-8 s clips, 50 per chapter, as LibriSpeech/train-clean-100/..."""
    rng = np.random.default_rng(seed)
    for k in range(0, count, 50):
        speaker, chapter = 1 + k // 50, 100 + k // 50
        d = os.path.join(manual_dir, "LibriSpeech", "train-clean-100", str(speaker), str(chapter))
        os.makedirs(d, exist_ok=True)
        lines = []
        for j in range(min(50, count - k)):
            n = int(rng.uniform(6.0, 8.0) * 16_000)
            t = np.arange(n) / 16_000
            audio = 2000 * np.sin(2 * np.pi * rng.uniform(100, 400) * t) + 300 * rng.standard_normal(n)
            utt = f"{speaker}-{chapter}-{j:04d}"
            soundfile.write(os.path.join(d, utt + ".flac"), audio.astype(np.int16), 16_000)
            lines.append(f"{utt} " + " ".join(["THE QUICK BROWN FOX"] * 4))
        with open(os.path.join(d, f"{speaker}-{chapter}.trans.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manual_dir", default="")
    p.add_argument("--data_dir", default="")
    p.add_argument("--make_clips", type=int, default=0, help="write and build this many 6-8 s clips")
    p.add_argument("--workdir", default="/tmp/ds2_input_bench")
    p.add_argument("--train_splits", default="train-clean-100")
    p.add_argument("--batch", type=int, default=32, help="global batch")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--num_workers", type=int, default=0)
    p.add_argument("--to_device", action="store_true")
    args = p.parse_args(argv)

    result = {}
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
        result["build_peak_rss_mb"] = round(peak_rss_mb(), 0)
        result["prepared_mb"] = round(
            sum(os.path.getsize(os.path.join(builder.data_dir, f)) for f in os.listdir(builder.data_dir)) / 1e6, 1
        )

    config = default.get_config()
    config.dataset.name = "librispeech_local"
    config.dataset.manual_dir = args.manual_dir
    config.dataset.data_dir = args.data_dir
    config.dataset.train_splits = args.train_splits
    config.dataset.min_duration_s, config.dataset.max_duration_s = 6.0, 8.0
    config.dataset.num_workers = args.num_workers
    t = time.perf_counter()
    source = input_pipeline.make_source(config, input_pipeline.Sharding(args.batch))
    result["open_s"] = round(time.perf_counter() - t, 2)
    put = None
    if args.to_device:
        import jax

        put = lambda b: jax.block_until_ready(jax.device_put(b, jax.devices()[0]))  # noqa: E731
    source.train_batch(0)  # warm the page cache and the plan
    steps = min(args.steps, source.steps_per_epoch * 3)
    t = time.perf_counter()
    cpu = time.process_time()
    for step in range(1, steps + 1):
        batch = source.train_batch(step)
        if put:
            put(batch)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    utts = steps * args.batch
    result.update(
        batches=steps,
        batch=args.batch,
        utterances_per_s=round(utts / wall, 1),
        utterances_per_cpu_s=round(utts / cpu, 1),
        audio_hours_per_s=round(utts * 7.0 / 3600 / wall, 3),
        num_workers=args.num_workers,
        to_device=args.to_device,
        cores=os.cpu_count(),
        peak_rss_mb=round(peak_rss_mb(), 0),
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
