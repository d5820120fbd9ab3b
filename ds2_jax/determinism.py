"""config.deterministic: XLA's deterministic GPU ops (no atomics, no autotuning), so that two
runs of a seed give the same losses. XLA reads its flags once, when jax starts its backends:
every entry point calls `apply` first, and the library refuses to run a deterministic config
on a GPU without them (`check`) instead of silently running nondeterministic ops."""

from __future__ import annotations

import os
import sys

FLAG = "--xla_gpu_deterministic_ops=true"


def flag_set() -> bool:
    return FLAG in os.environ.get("XLA_FLAGS", "").split()


def _backends_started() -> bool:
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def apply(config) -> None:
    """Adds FLAG to XLA_FLAGS when config.deterministic. Call before anything touches a device."""
    if not config.deterministic or flag_set():
        return
    if _backends_started():
        raise RuntimeError(
            "config.deterministic=True must be applied before jax starts (call "
            "ds2_jax.determinism.apply(config) first, or set XLA_FLAGS=" + FLAG + ")"
        )
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FLAG).strip()


def check(config, backend: str) -> None:
    """Raises when a deterministic config would run on a GPU without the flag (it cannot be
    added once jax has started)."""
    if config.deterministic and backend == "gpu" and not flag_set():
        raise ValueError(
            "deterministic=True: XLA was started without " + FLAG + "; run through launch.py or "
            "a benchmark command, or set XLA_FLAGS=" + FLAG + " before starting Python"
        )
