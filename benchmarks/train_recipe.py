"""The toolkits' training habits measured on the bundled corpus (issue 51): per seed, configs/demo.py
trained --steps updates twice,

  k1: per_device_batch_size=B, accumulate_steps=1, with a weight EMA (optimizer.ema_decay) and
      --keep checkpoints spaced over the last part of the run; scored greedily on test-clean as
      trained, with its EMA weights, and as the average of its last --keep checkpoints (ds2-average);
  k4: per_device_batch_size=B/4, accumulate_steps=4: the same global batch, scored as trained,

with each run's step time per update (the median of its logged intervals after the first, which
holds the compile).

    python -m benchmarks.train_recipe --out=DIR [--steps=200] [--seeds=0,1,2] [--batch=16] [--corpus=es]

--corpus=es: the same on the bundled Spanish corpus (configs/tiny_es.py, Common Voice layout, 48 kHz
MP3), scored on its held-out test speakers.

Each run has its own workdir (DIR/run-<name>-seed<N>); a run already trained is only scored, and a
seed already scored (DIR/row-seed<N>.json) is read back, so seeds can run in parallel processes
(--seeds=2 beside --seeds=0,1) and a last call collects them. Writes DIR/results.json and
DIR/results.md (per seed and the means).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

SCORES = ("trained", "ema", "averaged", "k4")
CORPORA = {  # --corpus: (configs module, the held-out split scored)
    "demo": ("demo", "test-clean"),
    "es": ("tiny_es", "test"),
}


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_string("out", None, "Results and the runs' workdirs.", flag_values=fv, required=True)
    flags.DEFINE_enum("corpus", "demo", list(CORPORA), "configs/demo.py or configs/tiny_es.py.", flag_values=fv)
    flags.DEFINE_string("manual_dir", "", "The corpus's folder ('' = the config's).", flag_values=fv)
    flags.DEFINE_integer("steps", 200, "Updates of each run.", flag_values=fv)
    flags.DEFINE_integer(
        "batch", 16, "The global batch (one device); k4 runs 4 micro-batches of a quarter.", flag_values=fv
    )
    flags.DEFINE_float("ema_decay", 0.99, "optimizer.ema_decay of the k1 runs.", flag_values=fv)
    flags.DEFINE_integer("keep", 5, "Checkpoints averaged (the last, every steps/10 updates).", flag_values=fv)
    flags.DEFINE_list("seeds", ["0", "1", "2"], "The runs' seeds.", flag_values=fv)
    flags.DEFINE_boolean(
        "k4", True, "Also the K=4 runs (--nok4: not on XLA:CPU, where a step that accumulates is slow).", flag_values=fv
    )


def step_time(workdir: str) -> float:
    """The median logged step_time_s of a run's intervals after its first (the compile's)."""
    from ds2_jax import layout

    with open(os.path.join(workdir, layout.METRICS)) as f:
        times = [r["step_time_s"] for r in map(json.loads, f) if "step_time_s" in r]
    return float(np.median(times[1:] if len(times) > 1 else times))


def means(rows: list[dict]) -> dict:
    keys = [k for k in rows[0] if k != "seed" and all(k in r for r in rows)]
    return {k: float(np.mean([r[k] for r in rows])) for k in keys}


def _cell(r: dict, key: str, fmt: str) -> str:
    return (
        format(r[key] * (100 if fmt.endswith("%") else 1), fmt.rstrip("%")) + ("%" if fmt.endswith("%") else "")
        if key in r
        else "-"
    )


def table(rows: list[dict]) -> str:
    head = (
        "| seed | CER trained | EMA | average of last N | K=4 at B/4 | WER trained | EMA | average | K=4 "
        "| step s K=1 | K=4 |"
    )
    lines = [head, "|---" + "|---:" * 10 + "|"]
    for r in rows + [{"seed": "mean", **means(rows)}]:
        cells = [_cell(r, f"{s}_{m}", ".1f%") for m in ("cer", "wer") for s in SCORES]
        cells += [_cell(r, k, ".3f") for k in ("k1_step_s", "k4_step_s")]
        lines.append(f"| {r['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import importlib

    from ds2_jax import average, cli, evaluation, files, settings, train

    args, _ = cli.parse_args(argv, define_flags, __doc__)
    if args.batch % 4:
        cli.usage_error(f"--batch={args.batch}: must be a multiple of 4 (k4 runs 4 micro-batches of a quarter)")
    os.makedirs(args.out, exist_ok=True)
    every = max(args.steps // 10, 1)

    module, split = CORPORA[args.corpus]
    base = importlib.import_module(f"configs.{module}")

    def config(seed: int, k: int):
        c = base.get_config()
        c.seed, c.num_devices = seed, 1
        c.num_train_steps, c.optimizer.decay_steps = args.steps, args.steps
        c.per_device_batch_size, c.optimizer.accumulate_steps = args.batch // k, k
        c.optimizer.ema_decay = args.ema_decay if k == 1 else 0.0
        c.eval_every_steps, c.checkpoint_every_steps, c.keep_checkpoints = 0, every, args.keep
        c.dataset.manual_dir = args.manual_dir or c.dataset.manual_dir
        c.dataset.data_dir = os.path.join(args.out, "tfds")
        return settings.from_config_dict(c)

    def score(c, workdir: str, ema: bool) -> dict:
        return evaluation.evaluate_checkpoint(settings.choosing_weights(c, ema), workdir, split=split)

    rows = []
    for seed in [int(s) for s in args.seeds]:
        done = os.path.join(args.out, f"row-seed{seed}.json")
        if os.path.exists(done):
            with open(done) as f:
                rows.append(json.load(f))
            continue
        runs = {k: os.path.join(args.out, f"run-k{k}-seed{seed}") for k in ((1, 4) if args.k4 else (1,))}
        for k, workdir in runs.items():
            train.train_and_evaluate(config(seed, k), workdir)
        averaged = os.path.join(args.out, f"avg{args.keep}-seed{seed}")
        if not os.path.isdir(averaged):
            average.average_workdir(runs[1], averaged, last=args.keep)
        c1 = config(seed, 1)
        results = {
            "trained": score(c1, runs[1], False),
            "ema": score(c1, runs[1], True),
            "averaged": score(c1, averaged, False),
        }
        if args.k4:
            results["k4"] = score(config(seed, 4), runs[4], False)
        row = {"seed": seed}
        for name, r in results.items():
            row[f"{name}_cer"], row[f"{name}_wer"] = r["cer"], r["wer"]
        row.update({f"k{k}_step_s": step_time(w) for k, w in runs.items()})
        rows.append(row)
        files.write_text(done, json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    result = {
        "config": f"configs/{module}.py, one device, scored on {split}",
        "steps": args.steps,
        "batch": args.batch,
        "ema_decay": args.ema_decay,
        "averaged_checkpoints": args.keep,
        "checkpoint_every_steps": every,
        "seeds": [int(s) for s in args.seeds],
        "rows": rows,
        "means": means(rows),
    }
    files.write_text(os.path.join(args.out, "results.json"), json.dumps(result, indent=1) + "\n")
    files.write_text(os.path.join(args.out, "results.md"), table(rows))
    return 0


if __name__ == "__main__":
    from ds2_jax import errors

    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
