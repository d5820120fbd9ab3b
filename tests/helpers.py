"""Small configs and the launch.py runner shared by the tests."""

import os
import subprocess
import sys

from configs import smoke

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "corpora", "tiny_librispeech")  # the bundled tiny LibriSpeech layout
TRAIN_STEPS = 160  # steps of conftest's `trained` demo model (its eval files are named by them)


def repo_env(**extra) -> dict:
    """This environment for a subprocess that imports the repository, with the repository first on
    PYTHONPATH and what was there kept (the GPU machine's packages live on it)."""
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH", "")]))
    return dict(os.environ, PYTHONPATH=path, **extra)


# XLA's CPU compiler at its quickest: no LLVM optimization, the loop emitters. A benchmark command's
# test runs each program it compiles a step or two, so compiling is most of its time (a tiny train
# step: ~4 CPU s at XLA's defaults, ~0.8 s so; each step runs ~2x slower, the same numbers to float32
# rounding). What such a test asks (every run, part and report written) does not depend on it.
QUICK_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
# The same for one program compiled in a test's own process (quick_compiled).
QUICK_COMPILE_OPTIONS = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def quick_compiled(jitted, *args):
    """jitted compiled for args, by XLA's CPU compiler at its quickest (QUICK_COMPILE_OPTIONS) on the
    CPU and at its defaults elsewhere (the options are XLA:CPU's): the same program, to float32 rounding,
    for a test that runs it a step or two."""
    import jax

    options = QUICK_COMPILE_OPTIONS if jax.default_backend() == "cpu" else None
    return jitted.lower(*args).compile(compiler_options=options)


def quick_compile_env(**extra) -> dict:
    """repo_env for a command that compiles much and runs little: XLA_FLAGS with QUICK_COMPILE added."""
    return repo_env(XLA_FLAGS=" ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), QUICK_COMPILE])), **extra)


def tiny_config(**overrides):
    """configs/smoke.py with dotted-key overrides, e.g. tiny_config(**{'model.rnn_size': 16})."""
    config = smoke.get_config()
    for key, value in overrides.items():
        node = config
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return config


def tiny_settings(**overrides):
    """The checked settings.Settings of tiny_config(**overrides): what the library below the
    entry points takes."""
    from ds2_jax import settings

    return settings.from_config_dict(tiny_config(**overrides))


def launch(*args, devices: int = 8, wait: bool = True, timeout: int = 600, quick_compile: bool = False):
    """`python launch.py --config=configs/smoke.py *args` on `devices` fake CPU devices (with
    quick_compile: XLA's CPU compiler at its quickest, QUICK_COMPILE, for a run that compiles much
    and trains little).

    Returns the finished subprocess.CompletedProcess (text stdout/stderr), or with
    wait=False the running subprocess.Popen. A --config= in args replaces the smoke config.
    """
    flags = f"--xla_force_host_platform_device_count={devices}" + (f" {QUICK_COMPILE}" if quick_compile else "")
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    config = [] if any(a.startswith("--config=") for a in args) else ["--config=configs/smoke.py"]
    cmd = [sys.executable, "launch.py", *config, *args]
    if wait:
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def write_noise(folder, seconds=(0.7, 3.0), rate=16_000) -> str:
    """A folder of noise recordings for config.waveform.noise_dir (pink-ish, reproducible; the
    second at 8 kHz, resampled when read): its path."""
    import numpy as np
    import soundfile

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    for i, s in enumerate(seconds):
        x = np.cumsum(rng.standard_normal(int(s * rate))).astype(np.float32)
        x = 0.3 * (x - x.mean()) / np.abs(x - x.mean()).max()
        soundfile.write(str(folder / f"n{i}.wav"), x, rate if i == 0 else 8000)
    return str(folder)


def random_state(config, key: int = 0, rng=None):
    """A random-init state of `config` (jax.random.PRNGKey(key)) whose feature statistics are not the
    identity (mean ~ N(-10, 1), std in [1, 3), drawn from `rng`, default np.random.default_rng(0))."""
    import jax
    import numpy as np

    from ds2_jax import state as state_lib

    rng = np.random.default_rng(0) if rng is None else rng
    bins = config.features.num_bins
    return state_lib.create_state(
        config,
        jax.random.PRNGKey(key),
        rng.normal(-10, 1, bins).astype(np.float32),
        rng.uniform(1, 3, bins).astype(np.float32),
    )


def random_model_workdir(path: str, key: int = 1, **overrides) -> str:
    """A workdir of a random-init smoke model (tiny_settings(**overrides); random_state) saved as checkpoint 0."""
    import jax

    from ds2_jax import checkpoint, workdir_config

    config = tiny_settings(**overrides)
    with checkpoint.managed(path) as mgr:
        checkpoint.save(mgr, 0, jax.device_get(random_state(config, key)), wait=True)
    workdir_config.save_config(config, path)
    return path
