"""Orbax checkpoints of the (unreplicated) train state: save, restore, resume."""

from __future__ import annotations

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
    """(state, step) from the newest checkpoint, shaped like `target`; (None, None) if none."""
    step = mgr.latest_step()
    if step is None:
        return None, None
    state = mgr.restore(step, args=ocp.args.StandardRestore(target))
    log.info("restored checkpoint at step %d from %s", step, mgr.directory)
    return state, step
