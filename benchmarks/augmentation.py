"""What waveform augmentation (config.waveform, ds2_jax.pipeline.augment) costs, beside the train step.

    python -m benchmarks.augmentation --out=DIR [--manual_dir=corpora/tiny_librispeech] [--steps=20]
        [--train_steps=40 --num_workers=1]

For each part alone and all together (each at probability 1, the worst case): the host time to
make one training batch of the demo config (inline, one process: read, augment, pad), its excess
over no augmentation, and that excess as a share of the demo model's compiled train step on
this machine's devices (the share a step would wait if batches were made inline; with input
workers the batch is made beside the step and the step waits only when the workers fall behind).
--train_steps=N also runs train.train_and_evaluate with the demo config for N steps, augmentation
off and all on (--num_workers input processes), and reports metrics.jsonl's mean step time
and the input wait per step of the steady state (the first interval, which compiles, left out).
Noise (pink, 10 s) and impulse responses (0.3 s decaying noise) are generated under DIR.
Writes DIR/augmentation.json and DIR/augmentation.md.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time

import numpy as np
import soundfile

VARIANTS = {
    "off": {},
    "noise": {"noise_prob": 1.0},
    "speed": {"speed_prob": 1.0},
    "gain": {"gain_prob": 1.0},
    "rir": {"rir_prob": 1.0},
    "all": {"noise_prob": 1.0, "speed_prob": 1.0, "gain_prob": 1.0, "rir_prob": 1.0},
}


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_string(
        "out", None, "Folder for augmentation.json / .md (and the generated noise).", flag_values=fv, required=True
    )
    flags.DEFINE_string(
        "manual_dir", "corpora/tiny_librispeech", "LibriSpeech-layout corpus (train-clean-100).", flag_values=fv
    )
    flags.DEFINE_string("data_dir", "", "tfds data_dir for its build (default: DIR/tfds).", flag_values=fv)
    flags.DEFINE_integer("batch", 16, "Utterances per batch (the demo's).", flag_values=fv)
    flags.DEFINE_integer("steps", 20, "Batches (and train steps) timed per variant.", flag_values=fv)
    flags.DEFINE_integer(
        "train_steps", 0, "Also train the demo config this many steps, off vs all (0: skip).", flag_values=fv
    )
    flags.DEFINE_integer("num_workers", 1, "Input worker processes of --train_steps runs.", flag_values=fv)


def make_recordings(folder: str) -> tuple[str, str]:
    """(noise folder, impulse-response folder) of generated recordings."""
    rng = np.random.default_rng(0)
    noise, rir = os.path.join(folder, "noise"), os.path.join(folder, "rir")
    os.makedirs(noise, exist_ok=True)
    os.makedirs(rir, exist_ok=True)
    for i in range(3):
        x = np.cumsum(rng.standard_normal(160_000))
        x = 0.3 * (x - x.mean()) / np.abs(x - x.mean()).max()
        soundfile.write(os.path.join(noise, f"noise{i}.wav"), x.astype(np.float32), 16_000)
        h = rng.standard_normal(4800) * np.exp(-np.arange(4800) / 800)
        soundfile.write(os.path.join(rir, f"rir{i}.wav"), (0.5 * h / np.abs(h).max()).astype(np.float32), 16_000)
    return noise, rir


def demo_config(args, noise: str, rir: str, parts: dict):
    from configs import demo

    config = demo.get_config()
    config.dataset.manual_dir = args.manual_dir
    config.dataset.data_dir = args.data_dir or os.path.join(args.out, "tfds")
    config.per_device_batch_size = args.batch
    config.num_devices = 1
    config.waveform.noise_dir, config.waveform.rir_dir = noise, rir
    for k, v in parts.items():
        config.waveform[k] = v
    return config


def median_ms(fn, steps: int) -> float:
    times = []
    for i in range(steps):
        t = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t)
    return 1000 * float(np.median(times))


def step_ms(config, steps: int) -> float:
    """The compiled train step of `config` on a batch of its source, median over `steps` runs."""
    import jax

    from ds2_jax import settings, train
    from ds2_jax import state as state_lib
    from ds2_jax.pipeline.batch import Sharding
    from ds2_jax.pipeline.source import make_source

    config = settings.from_config_dict(config)
    source = make_source(config, Sharding(config.per_device_batch_size))
    state = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
    step = jax.jit(functools.partial(train.train_step, **state_lib.step_kwargs(config), axis_name=None))
    batches = [source.train_batch(i) for i in range(min(steps, 4))]
    box = [state]

    def run(i):
        box[0], m = step(box[0], batches[i % len(batches)], jax.random.PRNGKey(0))
        jax.block_until_ready(m)

    for i in range(len(batches)):  # one compile per bucket shape
        run(i)
    return median_ms(run, steps)


def train_run(config, workdir: str, steps: int, workers: int) -> dict:
    from ds2_jax import metrics, train

    config.num_train_steps = steps
    config.log_every_steps = max(steps // 4, 1)
    config.eval_every_steps = 0
    config.checkpoint_every_steps = steps
    config.dataset.num_workers = workers
    train.train_and_evaluate(config, workdir)
    rows = [r for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "step_time_s" in r][1:]
    per = config.log_every_steps
    return {
        "step_ms": round(1000 * float(np.mean([r["step_time_s"] for r in rows])), 1),
        "input_wait_ms_per_step": round(1000 * float(np.mean([r["input_wait_s"] for r in rows])) / per, 2),
    }


def main(argv=None) -> int:
    from ds2_jax import cli, settings
    from ds2_jax.pipeline.batch import Sharding
    from ds2_jax.pipeline.source import make_source

    args, _ = cli.parse_args(argv, define_flags, __doc__)
    os.makedirs(args.out, exist_ok=True)
    noise, rir = make_recordings(os.path.join(args.out, "recordings"))
    step = step_ms(demo_config(args, noise, rir, {}), args.steps)
    print(json.dumps({"train_step_ms": round(step, 1)}), flush=True)
    rows = []
    for name, parts in VARIANTS.items():
        config = settings.from_config_dict(demo_config(args, noise, rir, parts))
        source = make_source(config, Sharding(args.batch))
        source.train_batch(0)  # opens the split's readers
        ms = median_ms(lambda i: source.train_batch(i), args.steps)
        rows.append({"variant": name, "batch_ms": round(ms, 2)})
    off = rows[0]["batch_ms"]
    for r in rows:
        r["extra_ms"] = round(r["batch_ms"] - off, 2)
        r["share_of_step_pct"] = round(100 * r["extra_ms"] / step, 2)
        print(json.dumps(r), flush=True)
    result = {"cores": os.cpu_count(), "batch": args.batch, "train_step_ms": round(step, 1), "rows": rows}
    if args.train_steps:  # off, all, all, off: a drift of the machine's load hits both alike
        runs = []
        with tempfile.TemporaryDirectory() as tmp:
            for i, name in enumerate(("off", "all", "all", "off")):
                runs.append(
                    {
                        "variant": name,
                        **train_run(
                            demo_config(args, noise, rir, VARIANTS[name]),
                            os.path.join(tmp, f"{i}-{name}"),
                            args.train_steps,
                            args.num_workers,
                        ),
                    }
                )
                print(json.dumps(runs[-1]), flush=True)
        mean = {v: float(np.mean([r["step_ms"] for r in runs if r["variant"] == v])) for v in ("off", "all")}
        result["train"] = {
            "num_workers": args.num_workers,
            "runs": runs,
            "mean_step_ms": mean,
            "all_over_off_pct": round(100 * (mean["all"] / mean["off"] - 1), 1),
        }
        print(json.dumps({k: v for k, v in result["train"].items() if k != "runs"}), flush=True)
    with open(os.path.join(args.out, "augmentation.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [
        f"train step (demo model, batch {args.batch}): {step:.1f} ms",
        "",
        "| augmentation (probability 1) | host ms per batch | extra ms | extra / step |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {r['variant']} | {r['batch_ms']:.2f} | {r['extra_ms']:.2f} | {r['share_of_step_pct']:.2f}% |" for r in rows
    ]
    if "train" in result:
        t = result["train"]
        lines += [
            "",
            f"launch-equivalent training, {args.train_steps} steps each, {args.num_workers} input worker(s) "
            "(steady-state mean step time; input wait per step):",
            "",
            "| run | augmentation | ms/step | input wait ms/step |",
            "|---|---|---:|---:|",
        ]
        lines += [
            f"| {i + 1} | {r['variant']} | {r['step_ms']:.1f} | {r['input_wait_ms_per_step']:.2f} |"
            for i, r in enumerate(t["runs"])
        ]
        lines += ["", f"all on vs off: {t['all_over_off_pct']:+.1f}% step time"]
    with open(os.path.join(args.out, "augmentation.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    from ds2_jax import errors

    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
