"""What launch.py runs against the step it is built on, in one process, one run.

    python -m benchmarks.trainer_vs_step --config=configs/ds2_8gpu.py \
        --config.model.dtype=bfloat16 --sources=synthetic,clips --out=DIR [--steps=300]

For each source: the step as benchmarks.scaling times it (synthetic batches already on
the devices; median of synchronized steps, and pipelined), then the trainer
(`train.train_and_evaluate`, the function launch.py calls) for --steps steps on that
source, its ms/step the median of metrics.jsonl's step_time_s over the log intervals
after the first (compile) one, with the seconds it waited for input. 'clips' writes
--clips LibriSpeech-layout clips of --clip_seconds (default 6-8 s) and trains on their
librispeech_local build in one bucket, so its padded shape is the synthetic step's.
Writes DIR/trainer_vs_step.{json,md}.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import statistics
import tempfile

from absl import flags

from benchmarks import input_pipeline as input_bench
from benchmarks import jax_bench
from ds2_jax import cli, settings, train
from ds2_jax.pipeline import loader

_CONFIG = cli.define_config_file("config", "configs/ds2_8gpu.py", "Config file.")
_SOURCES = flags.DEFINE_list("sources", ["synthetic", "clips"], "synthetic and/or clips.")
_OUT = flags.DEFINE_string("out", None, "Output directory.", required=True)
_STEPS = flags.DEFINE_integer("steps", 300, "Trainer steps per source.")
_STEP_STEPS = flags.DEFINE_integer("step_steps", 50, "Timed steps of the step alone.")
_CLIPS = flags.DEFINE_integer("clips", 1024, "Clips written for the 'clips' source.")
_CLIP_SECONDS = flags.DEFINE_list("clip_seconds", ["6", "8"], "Clip durations: lo,hi seconds.")
_WORKDIR = flags.DEFINE_string("workdir", "", "Where clips, their build and runs go ('' = a temp dir).")


def source_config(config, source: str, root: str):
    """config set up to train on `source` for the benchmark (no eval, no checkpoints on the way)."""
    c = copy.deepcopy(config)
    c.num_train_steps = _STEPS.value
    c.log_every_steps = max(10, _STEPS.value // 10)
    c.eval_every_steps = 0
    c.checkpoint_every_steps = 10 * _STEPS.value
    lo, hi = (float(x) for x in _CLIP_SECONDS.value)
    if source == "synthetic":
        c.dataset.name = "synthetic"
        c.dataset.synthetic_min_duration_s, c.dataset.synthetic_max_duration_s = lo, hi
        return c
    manual = os.path.join(root, "clips", "manual")
    if not os.path.isdir(manual):
        input_bench.make_clips(manual, _CLIPS.value, seconds=(lo, hi))
    c.dataset.name = "librispeech_local"
    c.dataset.manual_dir = manual
    c.dataset.data_dir = os.path.join(root, "clips", "tfds")
    c.dataset.train_splits = "train-clean-100"
    c.dataset.min_duration_s, c.dataset.max_duration_s = lo, hi + 0.01
    c.dataset.num_buckets = 1  # one padded shape, the longest clip: what the step measures
    c.dataset.feature_stats_utterances = 64
    return c


def trainer_ms(config, workdir: str) -> dict:
    """Runs the trainer from scratch; median ms/step and input wait over the intervals after the first."""
    shutil.rmtree(workdir, ignore_errors=True)  # a reused workdir would resume, training nothing
    train.train_and_evaluate(config, workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if "step_time_s" in r][1:]
    return {
        "trainer_ms_per_step": round(1e3 * statistics.median(r["step_time_s"] for r in rows), 2),
        "trainer_utterances_per_s": round(statistics.median(r["utterances_per_s"] for r in rows), 1),
        "input_wait_fraction": round(
            sum(r["input_wait_s"] for r in rows) / sum(r["step_time_s"] * config.log_every_steps for r in rows), 4
        ),
        "intervals": len(rows),
    }


def main(argv) -> int:
    del argv
    config = _CONFIG.value
    os.makedirs(_OUT.value, exist_ok=True)
    root = _WORKDIR.value or tempfile.mkdtemp(prefix="ds2_tvs_")
    n_dev = jax_bench.jax.local_device_count() if config.num_devices == 0 else config.num_devices
    rows = []
    for source in _SOURCES.value:
        c = source_config(config, source, root)
        synthetic = source_config(config, "synthetic", root)
        step = jax_bench.run(synthetic, "jax", n_dev, _STEP_STEPS.value, 3, 0, 4)
        row = {
            "source": source,
            "per_device_batch_size": c.per_device_batch_size,
            "devices": n_dev,
            "dtype": c.model.dtype,
            "clip_seconds": "-".join(_CLIP_SECONDS.value),
            "num_workers": loader.resolve_num_workers(settings.from_config_dict(c).dataset),
            "step_ms_median": round(step["step_ms_median"], 2),
            "step_ms_pipelined": round(step["pipelined_ms_per_step"], 2),
            **trainer_ms(c, os.path.join(root, f"run-{source}")),
        }
        row["trainer_over_step"] = round(row["trainer_ms_per_step"] / row["step_ms_median"], 3)
        row["trainer_over_pipelined"] = round(row["trainer_ms_per_step"] / row["step_ms_pipelined"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
        write(rows)
    return 0


def write(rows: list[dict]) -> None:
    with open(os.path.join(_OUT.value, "trainer_vs_step.json"), "w") as f:
        json.dump({"device": jax_bench.device_description(), "rows": rows}, f, indent=1)
    cols = [
        "source",
        "per_device_batch_size",
        "clip_seconds",
        "dtype",
        "num_workers",
        "step_ms_median",
        "step_ms_pipelined",
        "trainer_ms_per_step",
        "trainer_over_step",
        "trainer_over_pipelined",
        "input_wait_fraction",
        "trainer_utterances_per_s",
    ]
    lines = [
        f"Trainer (train_and_evaluate) vs its step, {jax_bench.device_description()}",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    with open(os.path.join(_OUT.value, "trainer_vs_step.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    cli.run(main)
