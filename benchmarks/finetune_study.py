"""Fine-tuning from another language against training from scratch (issue 51, item 4): per seed, the
English demo model (configs/demo.py, --source_steps updates, trained once per seed with that seed)
fine-tuned --steps updates on the bundled Spanish corpus (configs/tiny_es.py, Common Voice layout,
48 kHz MP3; --corpus=nemo: the same utterances as NeMo manifests, 8 kHz WAV), each variant a change
of the fine-tune, scored greedily on the corpus's held-out test speakers (CER, WER):

  scratch               the same --steps from a random start (no init_from)
  scratch_warmup        the same with --warmup steps of linear warm-up
  tuned                 init_from the source as main does it: its parameters, batch-norm and feature
                        statistics; the output layer as init_output's default says (another
                        alphabet: initialized afresh)
  by_symbol             tuned with init_output='by_symbol': the output layer mapped by symbol
                        (finetune.output_columns), main's way before 2026-12-06
  fresh_output          tuned with init_output='fresh': the whole output layer initialized afresh
  <output>_target_stats by_symbol or fresh_output with the Spanish corpus's feature statistics
                        instead of the source's
  <output>_warmup       by_symbol or fresh_output with --warmup steps of linear warm-up
  by_symbol_freeze_conv by_symbol with freeze=ConvBlock (the conv front end kept as the source's)
  by_symbol_head_first  --head_steps updates training only the output layer (freeze of everything
                        else), then init_from that for the remaining updates with nothing frozen

Every run: one device, the corpus config's rate (2e-3), cosine to 0 at the run's last update,
--base_warmup steps of warm-up unless the variant says otherwise. target_stats has no setting (a
fine-tune keeps the source's statistics): it is made here by wrapping finetune.merge for that run.

    python -m benchmarks.finetune_study --out=DIR --prepare          # builds both corpora once
    python -m benchmarks.finetune_study --out=DIR --seeds=1          # and --seeds=0, 2 beside it
    python -m benchmarks.finetune_study --out=DIR --seeds=0,1,2 --collect  # results.json/.md

Each run has its own workdir (DIR/<variant>-seed<N>, the source DIR/source-seed<N>); a run already
trained is only scored, and a run already scored (DIR/score-<variant>-seed<N>.json) is read back,
so seeds can run in parallel processes (after one --prepare) and a last call collects them. Writes
DIR/results.json and DIR/results.md (per variant: each seed, the mean, the change from scratch and
on how many seeds it beats scratch on both CER and WER).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import numpy as np

VARIANTS = (
    "scratch",
    "scratch_warmup",
    "tuned",
    "by_symbol",
    "by_symbol_target_stats",
    "by_symbol_warmup",
    "by_symbol_freeze_conv",
    "by_symbol_head_first",
    "fresh_output",
    "fresh_output_target_stats",
    "fresh_output_warmup",
)
CORPORA = {  # --corpus: the bundled Spanish corpus's two layouts (configs/tiny_es.py's docstring)
    "common_voice": "corpora/tiny_es/common_voice",
    "nemo": "corpora/tiny_es/nemo",
}
METRICS = ("cer", "wer")
TEST_SPLIT = "test"  # configs/tiny_es.py's held-out speakers


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_string(
        "out", None, "Results, the corpora's builds and the runs' workdirs.", flag_values=fv, required=True
    )
    flags.DEFINE_integer("steps", 150, "Updates of each Spanish run (fine-tune or scratch).", flag_values=fv)
    flags.DEFINE_integer("source_steps", 160, "Updates of the English source model (one per seed).", flag_values=fv)
    flags.DEFINE_list("seeds", ["0", "1", "2"], "The runs' seeds (the source's too).", flag_values=fv)
    flags.DEFINE_list("variants", list(VARIANTS), f"Runs per seed, of {', '.join(VARIANTS)}.", flag_values=fv)
    flags.DEFINE_enum("corpus", "common_voice", list(CORPORA), "The Spanish corpus's layout.", flag_values=fv)
    flags.DEFINE_integer("base_warmup", 0, "optimizer.warmup_steps of every run but the *_warmup ones.", flag_values=fv)
    flags.DEFINE_integer("warmup", 15, "optimizer.warmup_steps of the *_warmup variants.", flag_values=fv)
    flags.DEFINE_integer("head_steps", 15, "by_symbol_head_first: updates of the output layer alone.", flag_values=fv)
    flags.DEFINE_boolean("prepare", False, "Only build both corpora (before seeds run in parallel).", flag_values=fv)
    flags.DEFINE_boolean("collect", False, "Train nothing: tabulate the runs already scored.", flag_values=fv)


def means(rows: list[dict]) -> dict:
    """The mean over rows of every key all rows have (but 'seed')."""
    keys = [k for k in rows[0] if k != "seed" and all(k in r for r in rows)] if rows else []
    return {k: float(np.mean([r[k] for r in rows])) for k in keys}


def beats_scratch(rows: list[dict], variant: str) -> int:
    """On how many seeds (rows with both) `variant` has lower CER and lower WER than 'scratch'."""
    both = [r for r in rows if all(f"{v}_{m}" in r for v in (variant, "scratch") for m in METRICS)]
    return sum(all(r[f"{variant}_{m}"] < r[f"scratch_{m}"] for m in METRICS) for r in both)


def _pct(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else format(100 * value, "+.1f" if signed else ".1f") + ("" if signed else "%")


def table(rows: list[dict], variants: list[str]) -> str:
    """Markdown: one line per variant, each seed's CER, their mean, the same for WER, the means'
    change from scratch, and on how many seeds the variant beats scratch on both."""
    seeds = [r["seed"] for r in rows]
    mean = means(rows)
    cols = [f"CER s{s}" for s in seeds] + ["CER mean"] + [f"WER s{s}" for s in seeds] + ["WER mean"]
    head = "| variant | " + " | ".join(cols) + " | CER vs scratch | WER vs scratch | beats scratch |"
    lines = [head, "|---" + "|---:" * (len(cols) + 3) + "|"]
    for v in variants:
        cells = []
        for m in METRICS:
            cells += [_pct(r.get(f"{v}_{m}")) for r in rows] + [_pct(mean.get(f"{v}_{m}"))]
        for m in METRICS:
            a, b = mean.get(f"{v}_{m}"), mean.get(f"scratch_{m}")
            cells.append("-" if v == "scratch" or a is None or b is None else _pct(a - b, signed=True))
        n = sum(all(f"{v}_{m}" in r and f"scratch_{m}" in r for m in METRICS) for r in rows)
        cells.append("-" if v == "scratch" or not n else f"{beats_scratch(rows, v)}/{n}")
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def collect(out: str, seeds: list[int], variants: list[str]) -> list[dict]:
    """Per seed, a row {seed, <variant>_cer, <variant>_wer, <variant>_s} of the scores found in out."""
    rows = []
    for seed in seeds:
        row = {"seed": seed}
        for v in variants:
            path = score_path(out, v, seed)
            if os.path.exists(path):
                with open(path) as f:
                    r = json.load(f)
                row.update({f"{v}_{m}": r[m] for m in METRICS} | {f"{v}_s": r["seconds"]})
        rows.append(row)
    return rows


def score_path(out: str, variant: str, seed: int) -> str:
    return os.path.join(out, f"score-{variant}-seed{seed}.json")


@contextlib.contextmanager
def merging(change):
    """finetune.merge followed by change(state, fresh) -> state, for the runs inside the block."""
    from ds2_jax import finetune

    real = finetune.merge

    def merge(source, fresh, *rest, **kw):
        state, reinit = real(source, fresh, *rest, **kw)
        return change(state, fresh), reinit

    finetune.merge = merge
    try:
        yield
    finally:
        finetune.merge = real


def target_stats(state, fresh):
    """The fine-tune's state with the target corpus's feature statistics (the fresh state's)."""
    return state.replace(feature_mean=fresh.feature_mean, feature_std=fresh.feature_std)


def init_output(variant: str) -> str:
    """config.init_output of a fine-tune variant."""
    return next(
        (o for p, o in (("by_symbol", "by_symbol"), ("fresh_output", "fresh")) if variant.startswith(p)), "auto"
    )


def body_freeze(config) -> str:
    """config.freeze naming every top-level module of config's model but the output layer."""
    import jax
    import jax.numpy as jnp

    from ds2_jax import finetune, model
    from ds2_jax.kernels import dispatch
    from ds2_jax.state import INIT_FRAMES

    net = model.DeepSpeech2(model.ModelConfig.of(config.model))
    x, n = jnp.zeros((1, INIT_FRAMES, 161)), jnp.array([INIT_FRAMES])
    with dispatch.unlogged():
        shapes = jax.eval_shape(lambda: net.init(jax.random.key(0), x, n, train=False))
    return ",".join(sorted(k for k in shapes["params"] if k != finetune.OUTPUT_LAYER))


def main(argv=None) -> int:
    from configs import demo, tiny_es
    from ds2_jax import cli, evaluation, files, settings, train
    from ds2_jax.datasets import build

    args, _ = cli.parse_args(argv, define_flags, __doc__)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        cli.usage_error(f"--variants: {', '.join(unknown)} unknown; of {', '.join(VARIANTS)}")
    if not 0 < args.head_steps < args.steps and "by_symbol_head_first" in args.variants:
        cli.usage_error(f"--head_steps={args.head_steps}: must be in 1..{args.steps - 1} (--steps={args.steps})")
    os.makedirs(args.out, exist_ok=True)
    seeds = [int(s) for s in args.seeds]

    def common(c, seed: int, steps: int, warmup: int):
        c.seed, c.num_devices = seed, 1
        c.num_train_steps, c.optimizer.warmup_steps, c.optimizer.decay_steps = steps, warmup, 0  # cosine to the end
        c.eval_every_steps, c.checkpoint_every_steps = 0, steps
        c.dataset.num_workers = 0
        return c

    def english(seed: int = 0):
        c = common(demo.get_config(), seed, args.source_steps, demo.get_config().optimizer.warmup_steps)
        c.dataset.data_dir = os.path.join(args.out, "tfds-en")
        return settings.from_config_dict(c)

    def spanish(seed: int = 0, steps: int | None = None, warmup: int | None = None, **extra):
        c = common(tiny_es.get_config(), seed, steps or args.steps, args.base_warmup if warmup is None else warmup)
        c.dataset.manual_dir = CORPORA[args.corpus]
        c.dataset.data_dir = os.path.join(args.out, f"tfds-es-{args.corpus}")
        c.dataset.build_workers = 0
        for k, v in extra.items():
            setattr(c, k, v)
        return settings.from_config_dict(c)

    if args.prepare:
        for c in (english(), spanish()):
            d = c.dataset
            build.build(d.manual_dir, d.data_dir, d.name, build.options_of(c))
        return 0

    def run(variant: str, seed: int, source: str) -> dict:
        workdir = os.path.join(args.out, f"{variant}-seed{seed}")
        start = time.perf_counter()
        if variant.startswith("scratch"):
            c = spanish(seed, warmup=args.warmup if variant.endswith("warmup") else None)
        elif variant.endswith("head_first"):
            head = os.path.join(args.out, f"{variant}-head-seed{seed}")
            body = body_freeze(spanish(seed))
            c_head = spanish(
                seed, steps=args.head_steps, init_from=source, init_output=init_output(variant), freeze=body
            )
            train.train_and_evaluate(c_head, head)
            c = spanish(seed, steps=args.steps - args.head_steps, init_from=head)  # the same alphabet: kept whole
        else:
            extra = {"freeze": "ConvBlock"} if variant.endswith("freeze_conv") else {}
            warmup = args.warmup if variant.endswith("_warmup") else None
            c = spanish(seed, warmup=warmup, init_from=source, init_output=init_output(variant), **extra)
        change = target_stats if variant.endswith("target_stats") else None
        with merging(change) if change else contextlib.nullcontext():
            train.train_and_evaluate(c, workdir)
        r = evaluation.evaluate_checkpoint(c, workdir, split=TEST_SPLIT)
        seconds = time.perf_counter() - start
        return {"variant": variant, "seed": seed, "cer": r["cer"], "wer": r["wer"], "seconds": seconds}

    for seed in [] if args.collect else seeds:
        todo = [v for v in args.variants if not os.path.exists(score_path(args.out, v, seed))]
        if not todo:
            continue
        source = os.path.join(args.out, f"source-seed{seed}")
        if any(not v.startswith("scratch") for v in todo):
            train.train_and_evaluate(english(seed), source)
        for v in todo:
            r = run(v, seed, source)
            files.write_text(score_path(args.out, v, seed), json.dumps(r) + "\n")
            print(json.dumps(r), flush=True)

    rows = collect(args.out, seeds, list(args.variants))
    result = {
        "source": f"configs/demo.py, {args.source_steps} updates, one per seed (that seed)",
        "target": f"configs/tiny_es.py, {CORPORA[args.corpus]}, scored on {TEST_SPLIT}",
        "steps": args.steps,
        "base_warmup": args.base_warmup,
        "warmup": args.warmup,
        "head_steps": args.head_steps,
        "seeds": seeds,
        "variants": list(args.variants),
        "rows": rows,
        "means": means(rows),
        "beats_scratch": {v: beats_scratch(rows, v) for v in args.variants if v != "scratch"},
    }
    files.write_text(os.path.join(args.out, "results.json"), json.dumps(result, indent=1) + "\n")
    files.write_text(os.path.join(args.out, "results.md"), table(rows, list(args.variants)))
    print(table(rows, list(args.variants)), end="")
    return 0


if __name__ == "__main__":
    from ds2_jax import errors

    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
