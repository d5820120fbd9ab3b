"""config.deterministic reaches XLA from every entry point, or the run is refused."""

import os
import subprocess
import sys

import ml_collections
import pytest

from ds2_jax import determinism
from tests.helpers import ROOT


def _config(deterministic: bool):
    return ml_collections.ConfigDict({"deterministic": deterministic})


def test_apply_before_jax_starts_adds_the_flag_once_and_only_when_asked():
    code = (
        "import os, ml_collections; from ds2_jax import determinism; "
        "determinism.apply(ml_collections.ConfigDict({'deterministic': False})); "
        "print(os.environ.get('XLA_FLAGS', ''));"
        "c = ml_collections.ConfigDict({'deterministic': True}); determinism.apply(c); determinism.apply(c); "
        "print(os.environ['XLA_FLAGS'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env=dict(env, PYTHONPATH=ROOT, XLA_FLAGS="--xla_dump_to=x"),
    ).stdout.split("\n")
    assert out[0] == "--xla_dump_to=x"  # not asked: untouched
    assert out[1] == "--xla_dump_to=x " + determinism.FLAG  # asked twice: added once, other flags kept


def test_apply_after_jax_started_is_refused_unless_the_flag_is_there(monkeypatch):
    import jax

    jax.devices()  # the backends have started (as in every test process)
    monkeypatch.setenv("XLA_FLAGS", "")
    determinism.apply(_config(False))  # nothing asked, nothing to refuse
    with pytest.raises(RuntimeError, match="before jax starts"):
        determinism.apply(_config(True))
    monkeypatch.setenv("XLA_FLAGS", determinism.FLAG)
    determinism.apply(_config(True))


def test_a_deterministic_config_is_refused_on_a_gpu_started_without_the_flag(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")
    determinism.check(_config(True), "cpu")  # XLA's CPU ops need no flag
    determinism.check(_config(False), "gpu")
    with pytest.raises(ValueError, match="deterministic=True"):
        determinism.check(_config(True), "gpu")
    monkeypatch.setenv("XLA_FLAGS", determinism.FLAG)
    determinism.check(_config(True), "gpu")
