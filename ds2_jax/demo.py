"""`make demo`: build the bundled tiny corpus, train configs/demo.py on the CPU, print
reference/hypothesis pairs and the CER on the held-out test speakers, and draw the run's
curves (ds2_jax.plot) to WORKDIR/curves.png. A rerun trains only the steps still missing.

    python -m ds2_jax.demo [--workdir=.demo/run] [--config.num_train_steps=...]
"""

import os
import time

from absl import flags

from ds2_jax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout: configs/, data/

FLAGS = flags.FLAGS
cli.define_config_file("config", os.path.join(ROOT, "configs", "demo.py"), "Demo config.")
flags.DEFINE_string("workdir", os.path.join(ROOT, ".demo", "run"), "Where the demo model goes.")


def main(argv):
    del argv
    cli.setup_logging(FLAGS.workdir)
    from ds2_jax import errors

    # An explained error is one `error: ...` line (traceback in WORKDIR/error.log), as in launch.py.
    return errors.run_explained(_demo, FLAGS.workdir, errors.traceback_wanted())


def _demo() -> None:
    from ds2_jax import checkpoint, evaluation, settings, train

    # The evals during training print one line each; the examples are printed once, below.
    config = settings.override(settings.from_config_dict(FLAGS.config), {"eval.num_examples_to_print": 0})
    os.chdir(ROOT)  # the config's corpus paths are relative to the repository
    start = time.time()
    mgr = checkpoint.manager(FLAGS.workdir, config.keep_checkpoints)
    first_step = mgr.latest_step() or 0
    mgr.close()
    train.train_and_evaluate(config, FLAGS.workdir)
    with cli.quiet_console():  # the result is printed below (and logged to WORKDIR/log.txt)
        result = evaluation.evaluate_checkpoint(config, FLAGS.workdir, split=config.dataset.eval_split)
    print(f"\n== held-out speakers ({result['split']}, {result['utterances']} utterances) ==")
    for ex in result["examples"][:8]:
        print(f"  REF: {ex['reference']}\n  HYP: {ex['hypothesis']}\n")
    trained = max(result["step"] - first_step, 0)
    print(
        f"CER {100 * result['cer']:.1f}%  WER {100 * result['wer']:.1f}%  at step {result['step']} "
        f"({trained} steps trained now, {time.time() - start:.0f} s)"
    )
    print(f"curves: {_curves(FLAGS.workdir)}")


def _curves(workdir: str) -> str:
    """The PNG of the run's curves, or why there is none."""
    from ds2_jax import plot

    try:
        return plot.plot_workdir(workdir)
    except ImportError as e:
        return f"not drawn ({e})"


if __name__ == "__main__":
    cli.run(main)
