"""Command line: flags -> config -> ds2_jax.train.

    python launch.py --config=configs/ds2_8gpu.py --workdir=DIR [--config.key=value ...]
    python launch.py --config=configs/smoke.py --workdir=DIR --mode=eval [--eval_step=N|best]
    python launch.py --config=configs/demo.py --workdir=NEW --config.init_from=DIR[:STEP]   # fine-tune
    python launch.py --config=configs/smoke.py [--config.key=value ...] --print_config

A mistake in the command line is one line, `error: <what to change>`, exit code 2
(ds2_jax/cli.py). Errors a user can fix end in one line too, exit code 1; the traceback
goes to DIR/error.log (and to stderr with --traceback or DS2_TRACEBACK=1). A run that
fails before it has written a result removes the workdir it created.
"""

from ds2_jax import launcher

if __name__ == "__main__":
    launcher.run()
