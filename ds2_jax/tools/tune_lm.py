"""Grid search of the LM weights (decoding.alpha, decoding.beta) on a dev split.

    python -m ds2_jax.tools.tune_lm --workdir=W --lm=lm.arpa [--split=dev-clean] \\
        [--alphas=0,0.25,0.5,1,1.5,2 --betas=0,0.5,1,2,3 --beam_width=32] [--step=N|best]

The model runs once over the split (log-probabilities kept on the host); then every
(alpha, beta) pair re-runs only the beam search, with the LM loaded once. Picks the pair
with the lowest WER (then CER), prints the flags that use it and writes
W/tune_lm-<split>-<step>.json. The dataset and model come from W/config.json unless
--config is given (then --config.key=value overrides work as in launch.py).
"""

from __future__ import annotations

import json
import logging
import os

from absl import flags
from ml_collections import config_flags

from ds2_jax import layout, settings

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command line; defined only when run, so that tests can import this module."""
    config_flags.DEFINE_config_file(
        "config", None, "Config file; default: the workdir's config.json.", lock_config=True
    )
    flags.DEFINE_string("workdir", None, "Training workdir (checkpoints/).")
    flags.DEFINE_string("lm", None, "ARPA or KenLM binary word LM (ds2_jax.tools.build_lm).")
    flags.DEFINE_string("split", "", "Split to tune on (default: eval.split or dataset.eval_split).")
    flags.DEFINE_list("alphas", ["0", "0.25", "0.5", "1", "1.5", "2"], "LM weights to try.")
    flags.DEFINE_list("betas", ["0", "0.5", "1", "2", "3"], "Word bonuses to try.")
    flags.DEFINE_integer("beam_width", settings.LM_BEAM_WIDTH, "Beam width during the search (decoding.beam_width).")
    flags.DEFINE_integer("max_utterances", 0, "Utterances of the split used; 0 = all.")
    flags.DEFINE_string(
        "step",
        None,
        "Checkpoint step, or 'best' (the lowest in-training eval WER; keep_best_checkpoints); default: the latest.",
    )
    flags.mark_flags_as_required(["workdir", "lm"])


log = logging.getLogger("ds2_jax")


def grid_search(outputs, beam, alphas: list[float], betas: list[float]) -> list[dict]:
    """WER/CER of beam search for every (alpha, beta); `outputs` is an evaluation.SplitOutputs."""
    from ds2_jax import metrics

    rows = []
    for alpha in alphas:
        for beta in betas:
            beam.set_weights(alpha, beta)
            hyps = beam.decode_all(outputs.log_probs)
            rows.append({"alpha": alpha, "beta": beta, **metrics.error_rates(outputs.references, hyps)})
            log.info("alpha %.3g beta %.3g: WER %.4f CER %.4f", alpha, beta, rows[-1]["wer"], rows[-1]["cer"])
    return rows


def tune(
    config: settings.Settings,
    workdir: str,
    lm: str,
    split: str,
    alphas,
    betas,
    beam_width: int,
    max_utterances: int = 0,
    step: int | str | None = None,
) -> dict:
    """Runs the grid on checkpoint `step` (None: the latest; 'best': the lowest in-training eval WER);
    returns {'best': {...}, 'greedy': {...}, 'grid': [...], 'step': the step tuned, ...} and writes the json."""
    from ds2_jax import decoding, evaluation, files, metrics, text

    beam = decoding.BeamSearchDecoder(
        settings.Decoding(beam_width=beam_width, lm_path=lm), text.Alphabet.of_setting(config.model.alphabet)
    )
    run = evaluation.prepare(config, workdir, step, log_probs=True)
    step = run.step
    split = split or config.eval.split or config.dataset.eval_split
    out = evaluation.run_split(run.p_eval, run.state, run.source, split, max_utterances, run.par)
    grid = grid_search(out, beam, [float(a) for a in alphas], [float(b) for b in betas])
    best = min(grid, key=lambda r: (r["wer"], r["cer"]))
    result = {
        "split": split,
        "step": step,
        "lm": lm,
        "beam_width": beam_width,
        "utterances": len(out.references),
        "greedy": metrics.error_rates(out.references, out.greedy),
        "best": best,
        "grid": grid,
    }
    # One file per (split, step, beam, LM, subset): tuning against another LM, or on a subset, never replaces this one.
    path = os.path.join(workdir, layout.tune_lm_result(split, step, beam_width, evaluation.lm_name(lm), max_utterances))
    files.write_text(path, json.dumps(result, indent=2))
    result["path"] = path
    log.info(
        "greedy WER %.4f CER %.4f; best alpha %.3g beta %.3g: WER %.4f CER %.4f -> %s",
        result["greedy"]["wer"],
        result["greedy"]["cer"],
        best["alpha"],
        best["beta"],
        best["wer"],
        best["cer"],
        path,
    )
    return result


def check_flags() -> int | str | None:
    """A usage error (exit 2) for a flag or grid value the search cannot use, before the model pass
    (and before anything is written in the workdir); returns the checkpoint to tune (cli.checkpoint_step)."""
    from ds2_jax import cli

    for name, key in (("alphas", "decoding.alpha"), ("betas", "decoding.beta")):
        values = getattr(FLAGS, name)
        if not values:
            cli.usage_error(f"--{name} is empty: give the values to try, e.g. --{name}=0,0.5,1")
        for text in values:
            try:
                value = float(text)
            except ValueError:
                cli.usage_error(f"--{name}={','.join(values)}: {text!r} is not a number")
            if not settings.RANGES[key].holds(value):
                cli.usage_error(f"--{name}={','.join(values)}: {text} must be {settings.RANGES[key].text()}")
    if FLAGS.beam_width < 1:
        cli.usage_error(f"--beam_width={FLAGS.beam_width}: must be >= 1 (the LM weights act in beam search only)")
    if FLAGS.max_utterances < 0:
        cli.usage_error(f"--max_utterances={FLAGS.max_utterances}: must be >= 0 (0 = the whole split)")
    step = cli.checkpoint_step(FLAGS.step, "--step")
    if not os.path.isfile(FLAGS.lm):
        cli.usage_error(f"--lm={FLAGS.lm}: no such file (build one with python -m ds2_jax.tools.build_lm)")
    return step


def main(argv):
    from ds2_jax import cli, errors

    step = check_flags()
    cli.setup_logging(FLAGS.workdir)
    # An explained error is one `error: ...` line (traceback in WORKDIR/error.log), as in launch.py.
    return errors.run_explained(lambda: _tune_and_print(step), FLAGS.workdir, errors.traceback_wanted())


def _tune_and_print(step: int | str | None) -> None:
    from ds2_jax import cli, workdir_config

    config = (
        settings.from_config_dict(FLAGS.config)
        if FLAGS.config is not None
        else workdir_config.load_config(FLAGS.workdir)
    )
    try:
        with cli.quiet_console():  # each grid point's line goes to WORKDIR/log.txt; the table below is printed once
            result = tune(
                config,
                FLAGS.workdir,
                FLAGS.lm,
                FLAGS.split,
                FLAGS.alphas,
                FLAGS.betas,
                FLAGS.beam_width,
                FLAGS.max_utterances,
                step,
            )
    except ValueError as e:  # names decoding.* settings: say which flag
        raise ValueError(
            cli.in_flag_names(str(e), {"decoding.lm_path": "--lm", "decoding.beam_width": "--beam_width"})
        ) from e
    best = result["best"]
    print(f"{'alpha':>6} {'beta':>6} {'WER':>7} {'CER':>7}")
    for r in result["grid"]:
        print(f"{r['alpha']:6.3g} {r['beta']:6.3g} {r['wer']:7.4f} {r['cer']:7.4f}")
    print(f"greedy: WER {result['greedy']['wer']:.4f} CER {result['greedy']['cer']:.4f}")
    print(
        f"best: --config.decoding.alpha={best['alpha']:g} --config.decoding.beta={best['beta']:g} "
        f"(WER {best['wer']:.4f} CER {best['cer']:.4f} on {result['split']}, beam {result['beam_width']}; "
        f"all in {result['path']})"
    )


if __name__ == "__main__":
    define_flags()
    from ds2_jax import cli

    cli.run(main)
