"""Fault injection (config.faults): the hooks the training loop and the input workers call at
the points where the tests kill or hang a run, to prove that it resumes, stops and reports.

`Hooks(config.faults)`'s methods do nothing unless config.faults names their point; the
loop and the input workers call them unconditionally, so each point shows where it is.
A non-finite step (faults.nan_at_steps) wraps the train step instead (`with_nan_features`,
applied by train.compile_train_step): the pure loss knows nothing of it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

log = logging.getLogger("ds2_jax")


class Hooks:
    """The fault points of a run, given config.faults (settings.Faults)."""

    def __init__(self, faults):
        self.faults = faults

    def step_start(self, step: int) -> None:
        """Before step `step` (counted from 0) reads its batch: faults.hang_at_step hangs here."""
        if self.faults.hang_at_step == step:
            log.warning("fault injection: hanging at step %d", step)
            threading.Event().wait()

    def step_dispatched(self, done: int) -> None:
        """The step that makes `done` steps was dispatched: faults.kill_at='step:<done>'."""
        self._kill("step", done)

    def eval_start(self, done: int) -> None:
        """Before the evaluation at step `done`: faults.kill_at='eval:<done>'."""
        self._kill("eval", done)

    def checkpoint_started(self, done: int) -> None:
        """Checkpoint `done` was handed to the (asynchronous) writer: faults.kill_at='checkpoint:<done>'."""
        self._kill("checkpoint", done)

    def input_batch(self, step: int) -> None:
        """An input worker process is about to make step `step`'s batch: it dies at
        faults.kill_input_worker_at_step."""
        if step == self.faults.kill_input_worker_at_step:
            os.kill(os.getpid(), signal.SIGKILL)

    def _kill(self, point: str, step: int) -> None:
        if self.faults.kill_at == f"{point}:{step}":
            log.warning("fault injection: SIGKILL at %s of step %d", point, step)
            os.kill(os.getpid(), signal.SIGKILL)


def parse_steps(spec: str) -> tuple[int, ...]:
    """'3,5-7' -> (3, 5, 6, 7)."""
    steps: list[int] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if last < first:
            raise ValueError(f"empty step range {part!r}")
        steps.extend(range(first, last + 1))
    return tuple(steps)


def with_nan_features(step_fn, steps: tuple[int, ...]):
    """step_fn(state, batch, ...) whose features are NaN at `steps` (config.faults.nan_at_steps): the
    loss, gradients and batch-norm statistics turn NaN through the real model, so what the drill tests
    is the step's own refusal of a non-finite update. The state it returns keeps the real per-bin
    feature mean (the one input poisoned)."""
    import jax.numpy as jnp

    def step(state, batch, *rest, **kwargs):
        poisoned = jnp.where(jnp.isin(state.step, jnp.asarray(steps)), jnp.nan, state.feature_mean)
        new_state, metrics = step_fn(state.replace(feature_mean=poisoned), batch, *rest, **kwargs)
        return new_state.replace(feature_mean=state.feature_mean), metrics

    return step
