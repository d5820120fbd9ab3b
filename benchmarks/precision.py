"""Convergence of the bfloat16 fast path against the float32 reference, on the bundled corpus.

    python -m benchmarks.precision --out=DIR [--config=configs/ds2_8gpu.py] [--steps=600] \
        [--data_dir=.demo/tfds] [--dtypes=float32,bfloat16] [--config.x=y ...]

Trains the config's model (default: the seed's) once per dtype on data/tiny_librispeech,
from the same seed, for the same steps and batches: only model.dtype differs, so with
model.rnn_impl='auto' the bfloat16 run takes the fast kernels and the float32 run the
float32 reference (scan_vjp). The dataset section always comes from configs/demo.py (the
bundled corpus: train-clean-100 of 16 espeak-ng speakers, evaluated on the held-out
test-clean speakers); --data_dir is where the corpus is (or will be) prepared, so a copy
prepared elsewhere (python -m ds2_jax.datasets.build --manual_dir=data/tiny_librispeech
--data_dir=D) can be reused. --config.* overrides apply to everything else.

Writes DIR/<dtype>/ (each run's workdir: metrics.jsonl, checkpoints; a rerun trains
only the missing steps), DIR/precision.json (both runs' curves and final figures),
DIR/precision.png (training loss and eval CER against step, both dtypes) and
DIR/NOTES.md (the command and the table).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import time

from absl import app, flags

from ds2_jax import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command line; defined only when run, so that tests can import this module."""
    cli.define_config_file("config", "configs/ds2_8gpu.py", "Model and optimizer (dataset: the bundled corpus).")
    flags.DEFINE_string("out", None, "Output directory.", required=True)
    flags.DEFINE_integer("steps", 600, "Training steps per run.")
    flags.DEFINE_integer("evals", 6, "Evaluations per run, evenly spaced; the last at the final step.")
    flags.DEFINE_integer("log_every", 10, "Steps per logged training-loss point.")
    flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "model.dtype of each run, the reference first.")
    flags.DEFINE_string("data_dir", "", "Prepared corpus (tfds data dir); '' = configs/demo.py's.")


def on_bundled_corpus(config, steps: int, evals: int, log_every: int, data_dir: str = ""):
    """`config` with configs/demo.py's dataset section, `steps` steps, `evals` evaluations."""
    from configs import demo

    if steps < 1 or not 1 <= evals <= steps or steps % evals:
        raise ValueError(f"--steps={steps} must be a positive multiple of --evals={evals} (the last eval is at the final step)")
    config = config.copy_and_resolve_references()
    config.dataset = demo.get_config().dataset
    if data_dir:
        config.dataset.data_dir = data_dir
    config.num_train_steps = steps
    config.eval_every_steps = steps // evals
    config.checkpoint_every_steps = steps
    config.log_every_steps = max(1, min(log_every, steps))
    config.eval.split = ""
    config.eval.max_utterances = 0  # the whole held-out split
    return config


def run(config, dtype: str, workdir: str) -> dict:
    """Trains `config` with model.dtype = `dtype` in `workdir`; its curves and final figures."""
    from ds2_jax import metrics, train

    config = config.copy_and_resolve_references()
    config.model.dtype = dtype
    t0 = time.perf_counter()
    train.train_and_evaluate(config, workdir)
    wall_s = time.perf_counter() - t0
    rows = metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    return summarize(rows, dtype, config.num_train_steps, wall_s)


def summarize(rows: list[dict], dtype: str, steps: int, wall_s: float) -> dict:
    """One run's curves ((step, value) lists) and its figures at the final step."""
    def curve(key):
        return sorted((r["step"], r[key]) for r in rows if key in r and r["step"] <= steps)

    evals = {r["step"]: r for r in rows if "eval_cer" in r}
    if steps not in evals:
        raise ValueError(f"{dtype}: no evaluation at the final step {steps} in metrics.jsonl (steps evaluated: {sorted(evals)})")
    last = evals[steps]
    times = [t for _, t in curve("step_time_s")[1:]]  # the first interval holds the compile
    return {
        "dtype": dtype, "steps": steps, "wall_s": round(wall_s, 1),
        "loss": curve("loss"), "eval_loss": curve("eval_loss"), "eval_cer": curve("eval_cer"), "eval_wer": curve("eval_wer"),
        "final_train_loss": curve("loss")[-1][1], "final_eval_loss": last["eval_loss"],
        "final_cer": last["eval_cer"], "final_wer": last["eval_wer"],
        "median_step_ms": round(1e3 * statistics.median(times), 2) if times else None,
    }


def plot(results: list[dict], path: str) -> None:
    """Training loss (log scale) and eval CER against step, one line per dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_cer) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, r in enumerate(results):
        color = f"C{i}"
        label = f"{r['dtype']} (CER {100 * r['final_cer']:.1f}% at step {r['steps']})"
        ax_loss.plot(*zip(*r["loss"]), color=color, label=f"{r['dtype']} train")
        if r["eval_loss"]:
            ax_loss.plot(*zip(*r["eval_loss"]), "o--", color=color, markersize=4, label=f"{r['dtype']} eval")
        ax_cer.plot(*zip(*r["eval_cer"]), "o-", color=color, markersize=4, label=label)
    if all(v > 0 for r in results for _, v in r["loss"] + r["eval_loss"]):
        ax_loss.set_yscale("log")
    ax_loss.set(title="CTC loss", xlabel="step", ylabel="loss")
    ax_cer.set(title="CER on the held-out speakers (greedy)", xlabel="step", ylabel="CER")
    for ax in (ax_loss, ax_cer):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def notes(results: list[dict], meta: dict) -> str:
    lines = ["# bfloat16 fast path vs float32 reference: convergence on the bundled corpus", "",
             *(f"- {k}: {v}" for k, v in meta.items()), "",
             "| dtype | steps | final train loss | eval loss | CER | WER | median ms/step | wall s (compile, evals included) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        ms = f"{r['median_step_ms']:.1f}" if r["median_step_ms"] else "-"
        lines.append(f"| {r['dtype']} | {r['steps']} | {r['final_train_loss']:.3f} | {r['final_eval_loss']:.3f} | "
                     f"{100 * r['final_cer']:.2f}% | {100 * r['final_wer']:.2f}% | {ms} | {r['wall_s']:.0f} |")
    ref, *others = results
    for r in others:
        lines.append("")
        lines.append(f"{r['dtype']} - {ref['dtype']}: CER {100 * (r['final_cer'] - ref['final_cer']):+.2f} points, "
                     f"final eval loss {r['final_eval_loss'] - ref['final_eval_loss']:+.3f}.")
    lines += ["", "Curves: precision.png (training loss per logged interval, eval loss and CER at each evaluation); "
              "data: precision.json; each run's workdir: <dtype>/."]
    return "\n".join(lines) + "\n"


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from ds2_jax import model

    bad = [d for d in FLAGS.dtypes if d not in model.DTYPES]
    if bad or not FLAGS.dtypes:
        raise app.UsageError(f"--dtypes {bad or '(none)'}: expected some of {sorted(model.DTYPES)}")
    try:
        config = on_bundled_corpus(FLAGS.config, FLAGS.steps, FLAGS.evals, FLAGS.log_every, FLAGS.data_dir)
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    import jax

    os.makedirs(FLAGS.out, exist_ok=True)
    m = config.model
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks.precision " + " ".join(sys.argv[1:]),
        "devices": f"{jax.local_device_count()} x {jax.local_devices()[0].device_kind}",
        "model": (f"{m.num_conv_layers} conv x {m.conv_channels} ch, {m.num_rnn_layers} x "
                  f"{'bi' if m.bidirectional else 'uni'}directional {m.rnn_cell} RNN of {m.rnn_size}; "
                  f"rnn_impl={m.rnn_impl}, ctc_impl={config.loss.ctc_impl}"),
        "data": (f"{config.dataset.manual_dir}: train {config.dataset.train_splits}, eval {config.dataset.eval_split} "
                 f"(held-out speakers), {config.per_device_batch_size} per device"),
        "optimizer": (f"Adam {config.optimizer.learning_rate:g}, {config.optimizer.schedule}, "
                      f"warm-up {config.optimizer.warmup_steps}, clip {config.optimizer.clip_global_norm:g}"),
        "seed": config.seed,
    }
    results = []
    for dtype in FLAGS.dtypes:
        results.append(run(config, dtype, os.path.join(FLAGS.out, dtype)))
        with open(os.path.join(FLAGS.out, "precision.json"), "w") as f:
            json.dump({"meta": meta, "runs": results}, f, indent=1)
    plot(results, os.path.join(FLAGS.out, "precision.png"))
    with open(os.path.join(FLAGS.out, "NOTES.md"), "w") as f:
        f.write(notes(results, meta))
    print(notes(results, meta))


if __name__ == "__main__":
    define_flags()
    cli.run(main)
