"""The installed commands (setup.py's console_scripts), each the same as its `python -m` form.

ds2-train, ds2-eval      launch.py (ds2_jax.launcher): train, or --mode=eval by default
ds2-build                python -m ds2_jax.datasets.build: prepare a dataset ahead of time
ds2-transcribe           python -m ds2_jax.transcribe: audio files -> text
ds2-export               python -m ds2_jax.export: a checkpoint -> an ONNX model
ds2-build-lm             python -m ds2_jax.tools.build_lm: an n-gram ARPA LM from transcripts
ds2-tune-lm              python -m ds2_jax.tools.tune_lm: alpha/beta grid on a split
ds2-plot                 python -m ds2_jax.plot: a workdir's curves
ds2-average              python -m ds2_jax.average: the mean of a run's last or best N checkpoints
ds2-serve                python -m ds2_jax.serve: a model behind HTTP, a WebSocket and a page
"""

from __future__ import annotations

import importlib
import sys


def _explained(module: str) -> None:
    """Runs `module.main` as its `python -m` form does: an explained error is one line."""
    from ds2_jax import errors

    main = importlib.import_module(module).main
    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))


def train() -> None:
    from ds2_jax import launcher

    launcher.run()


def evaluate() -> None:
    from ds2_jax import launcher

    launcher.run_eval()


def build() -> None:
    _explained("ds2_jax.datasets.build")


def transcribe() -> None:
    _explained("ds2_jax.transcribe")


def export() -> None:
    _explained("ds2_jax.export")


def build_lm() -> None:
    _explained("ds2_jax.tools.build_lm")


def tune_lm() -> None:
    from ds2_jax import cli
    from ds2_jax.tools import tune_lm as command

    command.define_flags()
    cli.run(command.main)


def plot() -> None:
    _explained("ds2_jax.plot")


def average() -> None:
    _explained("ds2_jax.average")


def serve() -> None:
    _explained("ds2_jax.serve.server")
