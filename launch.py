"""Command line: flags -> config -> ds2_jax.train.

    python launch.py --config=configs/ds2_8gpu.py --workdir=DIR [--config.key=value ...]
    python launch.py --config=configs/smoke.py --workdir=DIR --mode=eval
"""

import logging
import os

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).", lock_config=True)
flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl and TensorBoard events go here.")
flags.DEFINE_enum("mode", "train", ["train", "eval"], "train (resumes if workdir has checkpoints) or eval.")
flags.DEFINE_integer("eval_step", None, "--mode=eval: checkpoint step to evaluate (default: latest).")
flags.DEFINE_bool("distributed", False, "Start jax.distributed (several processes). Without the three flags "
                  "below JAX reads them from the environment (SLURM, Open MPI, Kubernetes/JAX_COORDINATOR_ADDRESS).")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (implies --distributed).")
flags.DEFINE_integer("num_processes", None, "Number of processes (with --coordinator_address).")
flags.DEFINE_integer("process_id", None, "This process's index (with --coordinator_address).")
flags.mark_flags_as_required(["config", "workdir"])


def start_distributed() -> None:
    """jax.distributed.initialize from flags or the environment (before any device use)."""
    import jax

    if jax.config.jax_platforms in ("cpu",) or os.environ.get("JAX_PLATFORMS") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives across processes
    jax.distributed.initialize(
        coordinator_address=FLAGS.coordinator_address,
        num_processes=FLAGS.num_processes,
        process_id=FLAGS.process_id,
    )
    logging.getLogger("ds2_jax").info("jax.distributed: process %d of %d", jax.process_index(), jax.process_count())


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    absl_logging.set_verbosity(absl_logging.WARNING)  # quiets orbax's per-save chatter
    logging.getLogger("ds2_jax").setLevel(logging.INFO)
    if FLAGS.config.deterministic:  # must reach XLA before jax starts
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_deterministic_ops=true").strip()
    if FLAGS.distributed or FLAGS.coordinator_address:
        start_distributed()
    from ds2_jax import evaluation, train

    if FLAGS.mode == "train":
        train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
    else:
        evaluation.evaluate_checkpoint(FLAGS.config, FLAGS.workdir, step=FLAGS.eval_step)


if __name__ == "__main__":
    app.run(main)
