"""Orbax checkpoints of the (unreplicated) train state: save, restore, resume."""

from __future__ import annotations

import json
import logging
import os

import orbax.checkpoint as ocp

log = logging.getLogger("ds2_jax")


def manager(workdir: str, keep: int = 3) -> ocp.CheckpointManager:
    """A CheckpointManager over `workdir/checkpoints` keeping the newest `keep`."""
    directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
    return ocp.CheckpointManager(directory, options=options)


def save(mgr: ocp.CheckpointManager, step: int, state, wait: bool = False) -> None:
    """Saves `state` (a host or single-device pytree) as checkpoint `step` (asynchronously)."""
    mgr.save(step, args=ocp.args.StandardSave(state))
    if wait:
        mgr.wait_until_finished()


def restore_latest(mgr: ocp.CheckpointManager, target):
    """(state, step) from the newest checkpoint that restores, shaped like `target`.

    A damaged newest checkpoint (truncated or missing files) is skipped with a warning
    naming what failed, and the previous one is used. (None, None) when there are no
    checkpoints; an error, never a silent fresh start, when none of them restores.
    """
    steps = sorted(mgr.all_steps(), reverse=True)
    if not steps:
        return None, None
    failures = []
    for step in steps:
        try:
            state = mgr.restore(step, args=ocp.args.StandardRestore(target))
        except Exception as e:  # orbax raises many types for damaged files
            failures.append(f"step {step}: {type(e).__name__}: {str(e)[:300]}")
            log.warning("checkpoint %d in %s is damaged, trying the previous one (%s)", step, mgr.directory, failures[-1])
            continue
        log.info("restored checkpoint at step %d from %s", step, mgr.directory)
        return state, step
    raise RuntimeError(
        f"none of the checkpoints in {mgr.directory} could be restored; move that directory away to start "
        "over. " + "; ".join(failures)
    )


def save_or_explain(mgr: ocp.CheckpointManager, step: int, state) -> None:
    """save(), turning an I/O failure (disk full, permissions) into a clear error."""
    try:
        save(mgr, step, state)
        mgr.check_for_errors()
    except OSError as e:
        raise OSError(
            f"writing checkpoint {step} to {mgr.directory} failed ({e}); earlier checkpoints are intact. "
            "Free disk space or choose another --workdir, then rerun the same command."
        ) from e


def save_config(config, workdir: str) -> None:
    """Writes workdir/config.json, so eval and transcription rebuild the same model."""
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json(indent=2))


def load_config(workdir: str):
    """The config a workdir was trained with (see save_config)."""
    import ml_collections

    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: is {workdir} a ds2_jax training workdir?")
    with open(path) as f:
        return ml_collections.ConfigDict(json.load(f))
