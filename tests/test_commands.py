"""The installed commands (setup.py's console_scripts, ds2_jax/commands.py) are the `python -m` ones."""

import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

SCRIPTS = sorted(
    (e.name, e.value)
    for e in importlib.metadata.entry_points(group="console_scripts")
    if e.value.startswith("ds2_jax.")
)
BIN = os.path.dirname(sys.executable)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"}
    )


def test_every_command_is_installed_and_documented():
    from ds2_jax import commands

    assert SCRIPTS, "pip install -e . makes the ds2-* commands"
    documented = set(re.findall(r"\b(ds2-[a-z-]+)\b", commands.__doc__))
    assert {name for name, _ in SCRIPTS} == documented
    for name, value in SCRIPTS:
        assert callable(importlib.metadata.EntryPoint(name, value, "console_scripts").load()), name


@pytest.mark.e2e
@pytest.mark.parametrize("name", [n for n, _ in SCRIPTS])
def test_each_command_parses_its_own_flags(name):
    """An unknown flag is the project's one-line usage error (exit 2), not a traceback."""
    proc = run(os.path.join(BIN, name), "--no_such_flag=1")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: "), proc.stderr[-2000:]


@pytest.mark.e2e
def test_ds2_train_is_launch_py():
    args = ("--config=configs/smoke.py", "--config.num_train_steps=7", "--print_config")
    installed = run(os.path.join(BIN, "ds2-train"), *args)
    script = run(sys.executable, "launch.py", *args)
    assert installed.returncode == script.returncode == 0, installed.stderr[-2000:]
    assert installed.stdout == script.stdout and "num_train_steps" in installed.stdout
