"""Checkpoint averaging: one model whose weights are the arithmetic mean of N checkpoints of a run
(PaddleSpeech's avg_ckpts, ESPnet's and icefall's --avg), written as a workdir of its own that
eval, transcribe, export and init_from take like any other:

    ds2-average --workdir=W --last=5 --out=W_avg5      # the newest 5 checkpoints
    ds2-average --workdir=W --best=3 --out=W_best3     # the 3 of lowest in-training eval WER
    python -m ds2_jax.average ...                      # the same

The parameters, the batch-norm running statistics and, where the run kept one, the weight EMA are
each averaged; everything else (step, optimizer state, feature normalization, counters) is the
newest checkpoint's, so the output can even be trained on. The batch-norm statistics are averaged,
not recomputed: the checkpoints are of one run and close in weight space, each one's statistics are
already a moving average over hundreds of batches, and the toolkits average them too (they average
every tensor of the model's state); recomputing would need the training data and a pass over it.
W_out/averaged.json records the source and the steps.
"""

from __future__ import annotations

import json
import logging
import os
import sys

log = logging.getLogger("ds2_jax")


def mean_of(trees: list):
    """The leaf-wise arithmetic mean of pytrees of one structure (float32 sums, the leaves' dtype)."""
    import jax
    import jax.numpy as jnp

    return jax.tree_util.tree_map(
        lambda *xs: (sum(jnp.asarray(x, jnp.float32) for x in xs) / len(xs)).astype(jnp.asarray(xs[0]).dtype), *trees
    )


def average_states(states: list):
    """The newest of `states` (the last) with the mean of their params, batch_stats and ema_params."""
    newest = states[-1]
    return newest.replace(
        params=mean_of([s.params for s in states]),
        batch_stats=mean_of([s.batch_stats for s in states]),
        ema_params=None if newest.ema_params is None else mean_of([s.ema_params for s in states]),
    )


def choose_steps(mgr, workdir: str, last: int, best: int) -> list[int]:
    """The steps to average, oldest first: the newest `last`, or the `best` of lowest in-training eval
    WER (then CER); a ValueError naming what the workdir has when it has fewer."""
    from ds2_jax import checkpoint

    steps = sorted(mgr.all_steps())
    if last:
        if len(steps) < last:
            raise ValueError(
                f"--last={last}: {workdir} has {len(steps)} checkpoint(s) {steps}; train with "
                f"--config.keep_checkpoints={last} (and checkpoint_every_steps small enough), or average fewer"
            )
        return steps[-last:]
    ranked = checkpoint.ranked(mgr)
    if len(ranked) < best:
        raise ValueError(
            f"--best={best}: {workdir} has {len(ranked)} checkpoint(s) saved with an eval WER "
            f"({sorted(ranked)}); train with --config.keep_best_checkpoints={best} and eval_every_steps > 0, "
            "or average fewer"
        )
    return sorted(ranked[:best])


def average_workdir(workdir: str, out: str, last: int = 0, best: int = 0) -> tuple[list[int], int]:
    """Writes `out`: workdir's config.json and one checkpoint, the average of the chosen checkpoints
    (`choose_steps`), at the newest one's step. Returns (the steps averaged, the step written)."""
    from ds2_jax import checkpoint, files, layout, settings, workdir_config
    from ds2_jax.state import restore_state

    if bool(last) == bool(best):
        raise ValueError("give one of --last=N or --best=N (N >= 1): the checkpoints to average")
    if os.path.abspath(out) == os.path.abspath(workdir):
        raise ValueError(f"--out={out} is --workdir: write the average to a workdir of its own")
    if os.path.isdir(os.path.join(out, layout.CHECKPOINTS)) and os.listdir(os.path.join(out, layout.CHECKPOINTS)):
        raise FileExistsError(f"--out={out} already holds checkpoints: choose a new folder (or remove it)")
    config = workdir_config.load_config(workdir)
    raw = settings.choosing_weights(config, False)  # the trained weights and the EMA, each averaged
    steps = choose_steps(checkpoint.manager(workdir, config.keep_checkpoints), workdir, last, best)
    states = [restore_state(raw, workdir, s)[0] for s in steps]
    averaged = average_states(states)
    step = steps[-1]
    workdir_config.save_config(config, out)
    with checkpoint.managed(out, config.keep_checkpoints, 0) as mgr:
        checkpoint.save_or_explain(mgr, step, averaged)
        checkpoint.finish_or_explain(mgr)
    record = {"source": os.path.abspath(workdir), "steps": steps, "how": "last" if last else "best"}
    files.write_text(os.path.join(out, layout.AVERAGED), json.dumps(record, indent=2) + "\n")
    return steps, step


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_string(
        "workdir", None, "The training workdir whose checkpoints are averaged.", required=True, flag_values=fv
    )
    flags.DEFINE_integer("last", 0, "Average the newest N checkpoints.", lower_bound=0, flag_values=fv)
    flags.DEFINE_integer(
        "best",
        0,
        "Average the N checkpoints of lowest in-training eval WER (keep_best_checkpoints).",
        lower_bound=0,
        flag_values=fv,
    )
    flags.DEFINE_string(
        "out", None, "The new workdir to write (config.json and one checkpoint).", required=True, flag_values=fv
    )


def main(argv: list[str] | None = None) -> int:
    from ds2_jax import cli

    args, _ = cli.parse_args(argv, define_flags, __doc__)
    if bool(args.last) == bool(args.best):
        cli.usage_error("give one of --last=N or --best=N (N >= 1): the checkpoints to average")
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax's restore chatter
    steps, step = average_workdir(args.workdir, args.out, args.last, args.best)
    print(
        f"wrote {args.out}: the mean of checkpoints {steps} of {os.path.abspath(args.workdir)} at step {step}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    from ds2_jax import errors

    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
