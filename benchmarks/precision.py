"""Convergence of the bfloat16 fast path against the float32 reference, over seeds, on the bundled corpus.

    python -m benchmarks.precision --out=DIR [--config=configs/ds2_8gpu.py] [--steps=600] [--evals=6] \
        [--seeds=0,1,2,3,4] [--runs=float32:scan_vjp,bfloat16:scan_vjp,bfloat16:auto] [--processes=5] \
        [--data_dir=.demo/tfds] [--config.deterministic=True] [--config.x=y ...]

Trains the config's model (default: the seed's) once per (run, seed) on corpora/tiny_librispeech
for the same steps and batches: a run is model.dtype:model.rnn_impl ('auto' takes the fast
kernels where they run), the seed is config.seed (initial parameters and batch order). The
first run is the reference. The dataset section always comes from configs/demo.py (the bundled
corpus: train-clean-100 of 16 espeak-ng speakers, evaluated on the held-out test-clean
speakers), with the command line's --config.dataset.* overrides on top (e.g.
--config.dataset.num_buckets=1); --data_dir is where the corpus is (or will be) prepared. A cosine schedule (the
seed config's) is fitted to --steps, decaying to 0 at the last step: under a constant rate
the final CER is wherever a late loss spike left a run, in either dtype
(benchmarks/results/2026-12-05-h200-bf16-converge/). --config.* overrides apply
to everything else; --config.deterministic=True (XLA's deterministic GPU ops) makes two runs of
a seed give the same losses, so a difference between runs is the dtype's, not the GPU's.

Writes DIR/<dtype>-<rnn_impl>-seed<S>/ (each run's workdir: a rerun trains only the missing
steps), DIR/precision.json ("runs": one entry per (run, seed) with seed, dtype, rnn_impl,
final_cer, final_wer, final_train_loss and the curves; "summary": per run the mean and worst
CER over the seeds and the goal against the reference: mean within GOAL_MEAN_POINTS, worst seed
within GOAL_WORST_POINTS), DIR/precision.png (every run's training loss and CER against step)
and DIR/NOTES.md (the command and the tables).

--processes=N trains N seeds at once, each in its own process (`python -m benchmarks.precision
--seeds=S --out=DIR/seed<S>`, its log DIR/seed<S>.log) with 0.9/N of the device's memory
(XLA_PYTHON_CLIENT_MEM_FRACTION), then merges their results into DIR: one H200 runs five seed-model
seeds at once about four times faster than one after another. Deterministic ops give the same
numbers either way.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
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
    flags.DEFINE_list("seeds", ["0"], "config.seed of each repeat (initial parameters and batch order).")
    flags.DEFINE_list(
        "runs",
        ["float32:scan_vjp", "bfloat16:scan_vjp", "bfloat16:auto"],
        "dtype:rnn_impl of each run (model.dtype, model.rnn_impl), the reference first.",
    )
    flags.DEFINE_string("data_dir", "", "Prepared corpus (tfds data dir); '' = configs/demo.py's.")
    flags.DEFINE_integer("processes", 1, "Seeds trained at once, each in its own process sharing the device.")


GOAL_MEAN_POINTS = 1.0  # a run's mean CER over the seeds within this many points of the reference's
GOAL_WORST_POINTS = 2.0  # and its worst seed within this many points of the reference's worst


def parse_runs(specs: list[str]) -> list[tuple[str, str]]:
    """['float32:scan_vjp', ...] -> [('float32', 'scan_vjp'), ...], each checked against settings."""
    from ds2_jax import settings

    runs = []
    for spec in specs:
        dtype, _, impl = spec.partition(":")
        if dtype not in settings.DTYPES or impl not in settings.RNN_IMPLS:
            raise ValueError(
                f"--runs entry {spec!r}: expected dtype:rnn_impl with dtype in {list(settings.DTYPES)} "
                f"and rnn_impl in {list(settings.RNN_IMPLS)}"
            )
        runs.append((dtype, impl))
    if not runs or len(set(runs)) != len(runs):
        raise ValueError(f"--runs {specs}: expected one or more distinct dtype:rnn_impl entries")
    return runs


def on_bundled_corpus(config, steps: int, evals: int, log_every: int, data_dir: str = "", overrides=None):
    """`config` with configs/demo.py's dataset section, `steps` steps, `evals` evaluations, and
    a cosine schedule's decay fitted to the steps. `overrides`: the command line's --config.*
    values ({'dataset.num_buckets': 1, ...}); its dataset.* ones apply on top of demo's section."""
    from configs import demo

    if steps < 1 or not 1 <= evals <= steps or steps % evals:
        raise ValueError(
            f"--steps={steps} must be a positive multiple of --evals={evals} (the last eval is at the final step)"
        )
    config = config.copy_and_resolve_references()
    config.dataset = demo.get_config().dataset
    config.update_from_flattened_dict({k: v for k, v in (overrides or {}).items() if k.startswith("dataset.")})
    if data_dir:
        config.dataset.data_dir = data_dir
    config.num_train_steps = steps
    config.eval_every_steps = steps // evals
    config.checkpoint_every_steps = steps
    config.log_every_steps = max(1, min(log_every, steps))
    config.eval.split = ""
    config.eval.max_utterances = 0  # the whole held-out split
    if config.optimizer.schedule == "cosine":  # the seed's decay, to 0 at this run's last step
        config.optimizer.decay_steps = 0
    return config


def run_name(dtype: str, rnn_impl: str) -> str:
    return f"{dtype}:{rnn_impl}"


def with_run(config, dtype: str, rnn_impl: str):
    """A copy of `config` with model.dtype and model.rnn_impl set."""
    config = config.copy_and_resolve_references()
    config.model.dtype, config.model.rnn_impl = dtype, rnn_impl
    return config


def run(config, dtype: str, rnn_impl: str, seed: int, workdir: str) -> dict:
    """Trains `config` with model.dtype, model.rnn_impl and seed set, in `workdir`; its curves and figures."""
    from ds2_jax import metrics, train

    config = with_run(config, dtype, rnn_impl)
    config.seed = seed
    t0 = time.perf_counter()
    train.train_and_evaluate(config, workdir)
    wall_s = time.perf_counter() - t0
    rows = metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    return dict(summarize(rows, dtype, config.num_train_steps, wall_s), rnn_impl=rnn_impl, seed=seed)


def summarize(rows: list[dict], dtype: str, steps: int, wall_s: float) -> dict:
    """One run's curves ((step, value) lists) and its figures at the final step."""

    def curve(key):
        return sorted((r["step"], r[key]) for r in rows if key in r and r["step"] <= steps)

    evals = {r["step"]: r for r in rows if "eval_cer" in r}
    if steps not in evals:
        raise ValueError(
            f"{dtype}: no evaluation at the final step {steps} in metrics.jsonl (steps evaluated: {sorted(evals)})"
        )
    last = evals[steps]
    times = [t for _, t in curve("step_time_s")[1:]]  # the first interval holds the compile
    return {
        "dtype": dtype,
        "steps": steps,
        "wall_s": round(wall_s, 1),
        "loss": curve("loss"),
        "eval_loss": curve("eval_loss"),
        "eval_cer": curve("eval_cer"),
        "eval_wer": curve("eval_wer"),
        "final_train_loss": curve("loss")[-1][1],
        "final_eval_loss": last["eval_loss"],
        "final_cer": last["eval_cer"],
        "final_wer": last["eval_wer"],
        "median_step_ms": round(1e3 * statistics.median(times), 2) if times else None,
    }


def summary(results: list[dict], runs: list[tuple[str, str]]) -> list[dict]:
    """Per run, over its seeds: mean, worst and spread of the final CER, and whether it meets the
    goal against the first run (the reference)."""
    rows = []
    for dtype, impl in runs:
        cers = [r["final_cer"] for r in results if (r["dtype"], r["rnn_impl"]) == (dtype, impl)]
        if cers:
            rows.append(
                {
                    "run": run_name(dtype, impl),
                    "seeds": len(cers),
                    "mean_cer": statistics.fmean(cers),
                    "worst_cer": max(cers),
                    "best_cer": min(cers),
                }
            )
    ref = rows[0] if rows else None
    for row in rows:
        # In points to 1e-6, so that a difference exactly at a limit is not lost to rounding.
        row["mean_minus_reference_points"] = round(100 * (row["mean_cer"] - ref["mean_cer"]), 6)
        row["worst_minus_reference_points"] = round(100 * (row["worst_cer"] - ref["worst_cer"]), 6)
        row["meets_goal"] = (
            row["mean_minus_reference_points"] <= GOAL_MEAN_POINTS
            and row["worst_minus_reference_points"] <= GOAL_WORST_POINTS
        )
    return rows


def plot(results: list[dict], path: str) -> None:
    """Training loss (log scale) and eval CER against step: a color per run, a line per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(run_name(r["dtype"], r["rnn_impl"]) for r in results))
    fig, (ax_loss, ax_cer) = plt.subplots(1, 2, figsize=(13, 5))
    for r in results:
        name = run_name(r["dtype"], r["rnn_impl"])
        color, first = (
            f"C{names.index(name)}",
            r is next(x for x in results if run_name(x["dtype"], x["rnn_impl"]) == name),
        )
        ax_loss.plot(*zip(*r["loss"]), color=color, alpha=0.7, linewidth=1, label=name if first else None)
        ax_cer.plot(*zip(*r["eval_cer"]), "o-", color=color, alpha=0.7, markersize=3, label=name if first else None)
        ax_cer.annotate(f"s{r['seed']}", r["eval_cer"][-1], fontsize=7, color=color)
    if all(v > 0 for r in results for _, v in r["loss"]):
        ax_loss.set_yscale("log")
    ax_loss.set(title="CTC loss (training, per logged interval)", xlabel="step", ylabel="loss")
    ax_cer.set(title="CER on the held-out speakers (greedy); sN = seed", xlabel="step", ylabel="CER")
    for ax in (ax_loss, ax_cer):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def notes(results: list[dict], rows: list[dict], meta: dict) -> str:
    lines = [
        "# bfloat16 fast path vs float32 reference: convergence over seeds on the bundled corpus",
        "",
        *(f"- {k}: {v}" for k, v in meta.items()),
        "",
        "| run | seeds | mean CER | worst CER | best CER | mean - reference | worst - reference | goal |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['run']} | {row['seeds']} | {100 * row['mean_cer']:.2f}% | {100 * row['worst_cer']:.2f}% | "
            f"{100 * row['best_cer']:.2f}% | {row['mean_minus_reference_points']:+.2f} | "
            f"{row['worst_minus_reference_points']:+.2f} | {'met' if row['meets_goal'] else 'MISSED'} |"
        )
    lines += [
        "",
        f"Goal: mean CER within {GOAL_MEAN_POINTS:g} point(s) of the reference's (the first run), worst "
        f"seed within {GOAL_WORST_POINTS:g} of its worst.",
        "",
        "| run | seed | steps | final train loss | eval loss | CER | WER | median ms/step | wall s (compile, "
        "evals included) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ms = f"{r['median_step_ms']:.1f}" if r["median_step_ms"] else "-"
        lines.append(
            f"| {run_name(r['dtype'], r['rnn_impl'])} | {r['seed']} | {r['steps']} | {r['final_train_loss']:.3f} | "
            f"{r['final_eval_loss']:.3f} | {100 * r['final_cer']:.2f}% | {100 * r['final_wer']:.2f}% | {ms} | "
            f"{r['wall_s']:.0f} |"
        )
    lines += ["", "Curves: precision.png; data: precision.json; each run's workdir: <dtype>-<rnn_impl>-seed<S>/."]
    return "\n".join(lines) + "\n"


OWN_FLAGS = ("--seeds", "--out", "--processes")  # set per child by seed_command


def seed_command(argv: list[str], seed: int, out: str) -> list[str]:
    """The command line training one seed into `out`: argv's flags but --seeds, --out, --processes."""
    args, skip = [], False
    for a in argv[1:]:
        if skip or a.split("=", 1)[0] in OWN_FLAGS:
            skip = not skip and "=" not in a  # `--seeds 0,1`: its value is the next argument
            continue
        args.append(a)
    return [sys.executable, "-m", "benchmarks.precision", *args, f"--seeds={seed}", f"--out={out}"]


def prepare_corpus(dataset) -> None:
    """Builds the corpus once before seeds train at once: each would otherwise build it into
    the same fresh data_dir and all but one fail ("Cannot rename ... already exists").
    A process of its own: the build command starts no jax, so the device stays the seeds'."""
    cmd = [
        sys.executable,
        "-m",
        "ds2_jax.datasets.build",
        f"--config.dataset.manual_dir={dataset.manual_dir}",
        f"--config.dataset.data_dir={dataset.data_dir}",
    ]
    print("preparing the corpus once: " + " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)


def in_processes(argv: list[str], seeds: list[int], processes: int, out: str) -> list[dict]:
    """Every seed's results, `processes` seeds at a time in processes sharing the device."""
    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / processes:.3f}")
    running, failed = [], []

    def reap(proc_seed):
        proc, seed, log = proc_seed
        if proc.wait() != 0:
            failed.append(f"seed {seed} (exit {proc.returncode}; its log: {log})")

    for seed in seeds:
        if len(running) == processes:
            reap(running.pop(0))
        log = os.path.join(out, f"seed{seed}.log")
        with open(log, "w") as f:
            proc = subprocess.Popen(
                seed_command(argv, seed, os.path.join(out, f"seed{seed}")), stdout=f, stderr=subprocess.STDOUT, env=env
            )
        running.append((proc, seed, log))
        print(f"seed {seed}: training in process {proc.pid} (log: {log})", flush=True)
    for proc_seed in running:
        reap(proc_seed)
    if failed:
        raise RuntimeError("failed: " + "; ".join(failed))
    return [r for seed in seeds for r in json.load(open(os.path.join(out, f"seed{seed}", "precision.json")))["runs"]]


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        runs = parse_runs(FLAGS.runs)
        seeds = [int(s) for s in FLAGS.seeds]
        config = on_bundled_corpus(
            FLAGS.config, FLAGS.steps, FLAGS.evals, FLAGS.log_every, FLAGS.data_dir, command_line_overrides()
        )
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    from ds2_jax import files

    os.makedirs(FLAGS.out, exist_ok=True)
    meta = describe(config, seeds)
    if FLAGS.processes > 1 and len(seeds) > 1:  # (this process never starts jax: the device is the seeds')
        prepare_corpus(config.dataset)
        results = in_processes(sys.argv, seeds, FLAGS.processes, FLAGS.out)
        meta["devices"] = json.load(open(os.path.join(FLAGS.out, f"seed{seeds[0]}", "precision.json")))["meta"][
            "devices"
        ]
    else:
        results = in_this_process(config, runs, seeds, meta)
    rows = summary(results, runs)
    files.write_text(
        os.path.join(FLAGS.out, "precision.json"),
        json.dumps({"meta": meta, "runs": results, "summary": rows}, indent=1),
    )
    plot(results, os.path.join(FLAGS.out, "precision.png"))
    files.write_text(os.path.join(FLAGS.out, "NOTES.md"), notes(results, rows, meta))
    print(notes(results, rows, meta))


def command_line_overrides() -> dict:
    """The --config.* values given on the command line, {'model.rnn_size': 16, ...}."""
    from ml_collections import config_flags

    return config_flags.get_override_values(FLAGS["config"])


def describe(config, seeds: list[int]) -> dict:
    """The NOTES.md header: date, command, devices, model, data, optimizer, seeds."""
    m = config.model
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks.precision " + " ".join(sys.argv[1:]),
        "devices": "",  # set by the process that starts jax
        "model": (
            f"{m.num_conv_layers} conv x {m.conv_channels} ch, {m.num_rnn_layers} x "
            f"{'bi' if m.bidirectional else 'uni'}directional {m.rnn_cell} RNN of {m.rnn_size}; "
            f"ctc_impl={config.loss.ctc_impl}"
        ),
        "data": (
            f"{config.dataset.manual_dir}: train {config.dataset.train_splits}, eval {config.dataset.eval_split} "
            f"(held-out speakers), {config.per_device_batch_size} per device"
        ),
        "optimizer": (
            f"Adam {config.optimizer.learning_rate:g}, {config.optimizer.schedule}, "
            f"warm-up {config.optimizer.warmup_steps}, clip {config.optimizer.clip_global_norm:g}"
        ),
        "seeds": seeds,
        "deterministic": bool(config.deterministic),
    }


def in_this_process(config, runs: list[tuple[str, str]], seeds: list[int], meta: dict) -> list[dict]:
    """Every (seed, run) trained here, one after another."""
    from ds2_jax import determinism, files

    determinism.apply(config)  # before jax starts
    import jax

    meta["devices"] = f"{jax.local_device_count()} x {jax.local_devices()[0].device_kind}"
    results = []
    for seed in seeds:  # all runs of a seed together: a cut-short command still compares like with like
        for dtype, impl in runs:
            workdir = os.path.join(FLAGS.out, f"{dtype}-{impl}-seed{seed}")
            results.append(run(config, dtype, impl, seed, workdir))
            # After each run, atomically: a command cut short keeps every finished run.
            files.write_text(
                os.path.join(FLAGS.out, "precision.json"),
                json.dumps({"meta": meta, "runs": results, "summary": summary(results, runs)}, indent=1),
            )
    return results


if __name__ == "__main__":
    define_flags()
    cli.run(main)
