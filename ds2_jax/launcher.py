"""The training command: flags -> config -> ds2_jax.train (launch.py, `ds2-train`, `ds2-eval`).

    ds2-train --config=configs/ds2_8gpu.py --workdir=DIR [--config.key=value ...]
    ds2-eval --config=configs/smoke.py --workdir=DIR [--eval_step=N|best]
    ds2-train --config=configs/demo.py --workdir=NEW --config.init_from=DIR[:STEP]   # fine-tune
    ds2-train --config=configs/smoke.py [--config.key=value ...] --print_config

(`python launch.py ...` is the same command.) A mistake in the command line is one line,
`error: <what to change>`, exit code 2 (ds2_jax/cli.py). Errors a user can fix end in one line
too, exit code 1; the traceback goes to DIR/error.log (and to stderr with --traceback or
DS2_TRACEBACK=1). A run that fails before it has written a result removes the workdir it created.
"""

import logging
import os

from absl import flags
from ml_collections import config_flags

from ds2_jax import cli

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config",
    None,
    "Config file (configs/*.py); override any key with --config.KEY=VALUE; --print_config lists them.",
    lock_config=True,
)
flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl and TensorBoard events go here.")
flags.DEFINE_enum("mode", "train", ["train", "eval"], "train (resumes if workdir has checkpoints) or eval.")
flags.DEFINE_string(
    "eval_step",
    None,
    "--mode=eval: checkpoint step to evaluate, or 'best' (the lowest "
    "in-training eval WER: keep_best_checkpoints); default: the latest.",
)
flags.DEFINE_bool(
    "distributed",
    False,
    "Start jax.distributed (several processes). Without the three flags "
    "below JAX reads them from the environment (SLURM, Open MPI, Kubernetes/JAX_COORDINATOR_ADDRESS).",
)
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (implies --distributed).")
flags.DEFINE_integer("num_processes", None, "Number of processes (with --coordinator_address).")
flags.DEFINE_integer("process_id", None, "This process's index (with --coordinator_address).")
flags.DEFINE_bool("traceback", False, "Print the traceback of an error too (also: DS2_TRACEBACK=1).")
flags.DEFINE_bool(
    "print_config",
    False,
    "Print every setting of --config (with the overrides) with its value, type "
    "and meaning, mark those that differ from the defaults, and exit.",
)
flags.mark_flags_as_required(["config"])


def start_distributed() -> None:
    """jax.distributed.initialize from flags or the environment (before any device use)."""
    import jax

    if jax.config.jax_platforms in ("cpu",) or os.environ.get("JAX_PLATFORMS") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives across processes
    # A peer that stops is the watchdog's (exit 3 after step_timeout_s, one line): the coordination
    # service's own heartbeat check, when it comes first, aborts with a C++ stack trace.
    timeout_s = FLAGS.config.step_timeout_s
    heartbeat = {"heartbeat_timeout_seconds": int(timeout_s) + 60} if timeout_s else {}
    jax.distributed.initialize(
        coordinator_address=FLAGS.coordinator_address,
        num_processes=FLAGS.num_processes,
        process_id=FLAGS.process_id,
        **heartbeat,
    )
    logging.getLogger("ds2_jax").info("jax.distributed: process %d of %d", jax.process_index(), jax.process_count())


def main(argv):
    if FLAGS.print_config:
        print(cli.config_listing(FLAGS.config, cli.config_source(FLAGS["config"])), flush=True)
        from ds2_jax import errors, settings

        # then the checks a run makes first: a bad value is an `error:` line naming it
        return errors.run_explained(lambda: settings.from_config_dict(FLAGS.config), None, errors.traceback_wanted())
    if not FLAGS.workdir:
        cli.usage_error(f"--workdir is required ({FLAGS['workdir'].help.rstrip('.')})")
    eval_step = cli.checkpoint_step(FLAGS.eval_step, "--eval_step")
    from ds2_jax import determinism

    determinism.apply(FLAGS.config)  # must reach XLA before jax starts
    if FLAGS.distributed or FLAGS.coordinator_address:
        start_distributed()
    cli.setup_logging(FLAGS.workdir)  # the full log in workdir/log.txt (one file per process: after distributed)
    from ds2_jax import errors, evaluation, train

    if FLAGS.mode == "train":
        run = lambda: train.train_and_evaluate(FLAGS.config, FLAGS.workdir)  # noqa: E731
    else:
        from ml_collections import config_flags

        overrides = set(config_flags.get_override_values(FLAGS["config"]))  # dataset.* not among them: config.json's
        run = lambda: evaluation.evaluate_checkpoint(  # noqa: E731
            FLAGS.config, FLAGS.workdir, step=eval_step, overrides=overrides
        )
    if not (FLAGS.distributed or FLAGS.coordinator_address):  # a shared workdir is left to its processes
        run = cli.removing_new_workdir_on_error(run, FLAGS.workdir)
    return errors.run_explained(run, FLAGS.workdir, FLAGS.traceback or errors.traceback_wanted())


def run() -> None:
    """The `ds2-train` command (and launch.py): train, or evaluate with --mode=eval."""
    cli.run(main)


def run_eval() -> None:
    """The `ds2-eval` command: launch.py with --mode=eval as the default."""
    FLAGS.set_default("mode", "eval")
    cli.run(main)
