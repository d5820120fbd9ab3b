"""Command line: flags -> config -> ds2_jax.train.

    python launch.py --config=configs/ds2_8gpu.py --workdir=DIR [--config.key=value ...]
    python launch.py --config=configs/smoke.py --workdir=DIR --mode=eval

Errors a user can fix end in one line, `error: <what to change>`; the traceback goes to
DIR/error.log (and to stderr with --traceback or DS2_TRACEBACK=1).
"""

import difflib
import importlib.util
import logging
import os
import sys

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
flags.DEFINE_bool("traceback", False, "Print the traceback of an error too (also: DS2_TRACEBACK=1).")
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


def _config_file(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            return a.split("=", 1)[1].split(":", 1)[0]
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1].split(":", 1)[0]
    return None


def _flat_keys(config, prefix: str = "") -> list[str]:
    keys = []
    for k, v in config.items():
        keys.append(prefix + k)
        if hasattr(v, "items"):
            keys += _flat_keys(v, prefix + k + ".")
    return keys


def unknown_key_message(argv: list[str]) -> str | None:
    """'unknown config key ...' with close matches, for the first --config.KEY the config lacks."""
    path = _config_file(argv)
    if not path or not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("_ds2_config_file", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    known = _flat_keys(module.get_config())
    for a in argv:
        if a.startswith("--config.") or a.startswith("--noconfig."):
            key = a.split("=", 1)[0].split("config.", 1)[1]
            if key not in known:
                close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
                hint = f"did you mean {', '.join(close)}?" if close else "no key is close (ds2_jax/settings.py lists and explains them all)"
                return f"unknown config key {key!r} ({a}) in {path}: {hint}"
    return None


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, but an unknown --config.KEY is one line naming it and close matches."""
    try:
        return FLAGS(argv)
    except flags.Error:
        raise  # absl prints these as one line itself
    except (AttributeError, KeyError) as e:  # ml_collections: a key the config does not have
        message = unknown_key_message(argv) or f"bad --config override: {e}"
        print(f"error: {message}", file=sys.stderr, flush=True)
        sys.exit(2)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    absl_logging.set_verbosity(absl_logging.WARNING)  # quiets orbax's per-save chatter
    logging.getLogger("ds2_jax").setLevel(logging.INFO)
    from ds2_jax import determinism

    determinism.apply(FLAGS.config)  # must reach XLA before jax starts
    if FLAGS.distributed or FLAGS.coordinator_address:
        start_distributed()
    from ds2_jax import errors, evaluation, train

    if FLAGS.mode == "train":
        run = lambda: train.train_and_evaluate(FLAGS.config, FLAGS.workdir)  # noqa: E731
    else:
        run = lambda: evaluation.evaluate_checkpoint(FLAGS.config, FLAGS.workdir, step=FLAGS.eval_step)  # noqa: E731
    return errors.run_explained(run, FLAGS.workdir, FLAGS.traceback or errors.traceback_wanted())


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
