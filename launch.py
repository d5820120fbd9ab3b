"""Command line: flags -> config -> ds2_jax.train.

    python launch.py --config=configs/ds2_8gpu.py --workdir=DIR [--config.key=value ...]
    python launch.py --config=configs/smoke.py --workdir=DIR --mode=eval
"""

import logging

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).", lock_config=True)
flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl and TensorBoard events go here.")
flags.DEFINE_enum("mode", "train", ["train", "eval"], "train (resumes if workdir has checkpoints) or eval.")
flags.DEFINE_integer("eval_step", None, "--mode=eval: checkpoint step to evaluate (default: latest).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    absl_logging.set_verbosity(absl_logging.WARNING)  # quiets orbax's per-save chatter
    logging.getLogger("ds2_jax").setLevel(logging.INFO)
    from ds2_jax import evaluation, train

    if FLAGS.mode == "train":
        train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
    else:
        evaluation.evaluate_checkpoint(FLAGS.config, FLAGS.workdir, step=FLAGS.eval_step)


if __name__ == "__main__":
    app.run(main)
