"""The train loop's progress bar: it counts finished steps, not dispatched ones.

jax dispatches steps asynchronously, so the loop runs ahead of the device. The loop
hands each dispatched step's metrics (device arrays) to `StepProgress.dispatched`; the
bar moves past a step once its metrics are ready (`jax.Array.is_ready`, no wait) or
when `wait_all` waits for them in order, and shows the latest finished step's loss and
the utterances per second of the finished steps. While the bar is open, log records
clear it, print, and redraw it, so a log line never lands inside the bar.
"""

from __future__ import annotations

import collections
import logging
import time
import weakref

import jax
import numpy as np

RATE_WINDOW = 20  # finished steps that the utt/s figure spans


def _scalar(x) -> float:
    """One device's copy of a replicated metric (one transfer, not one per device)."""
    shards = getattr(x, "addressable_shards", None)
    return float(np.asarray(shards[0].data if shards else x).reshape(-1)[0])


def _is_ready(step_metrics) -> bool:
    leaf = step_metrics["steps"]
    return leaf.is_ready() if hasattr(leaf, "is_ready") else True


class StepProgress:
    """tqdm bar over [start, total) steps, advanced as steps finish."""

    def __init__(self, start: int, total: int, enabled: bool, loggers: tuple[str, ...] = ("", "ds2_jax")):
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=start, disable=not enabled, unit="step", dynamic_ncols=True,
                        mininterval=1.0)
        self.finished = start
        self._pending: collections.deque = collections.deque()
        self._times: collections.deque = collections.deque(maxlen=RATE_WINDOW + 1)  # (time, utterances)
        # handle, not emit: absl's handler forwards handle() to an inner handler.
        handlers = [h for name in loggers for h in logging.getLogger(name).handlers] if enabled else []
        self._handlers = [(h, h.__dict__.get("handle")) for h in handlers]  # a handle set on the instance, if any
        for h in handlers:
            h.handle = self._clearing(h.handle)

    def _clearing(self, handle):
        bar_ref = weakref.ref(self.bar)  # a loop that raised leaves no live bar behind

        def handle_around_bar(record):
            bar = bar_ref()
            if bar is None or bar.disable:  # closed
                return handle(record)
            with bar.external_write_mode():
                return handle(record)

        return handle_around_bar

    def dispatched(self, step_metrics) -> None:
        """A step was dispatched; advances past every step (in order) that has finished."""
        self._pending.append(step_metrics)
        while self._pending and _is_ready(self._pending[0]):
            self._finish(self._pending.popleft())

    def wait_all(self) -> None:
        """Waits for the dispatched steps in order, advancing as each one finishes."""
        while self._pending:
            m = self._pending.popleft()
            jax.block_until_ready(m["steps"])
            self._finish(m)

    def _finish(self, m) -> None:
        self.finished += 1
        self._times.append((time.perf_counter(), _scalar(m["utterances"])))
        postfix = {"loss": f"{_scalar(m['loss_sum']) / max(_scalar(m['loss_count']), 1.0):.3f}"}
        if len(self._times) > 1:
            seconds = self._times[-1][0] - self._times[0][0]
            utterances = sum(u for _, u in list(self._times)[1:])
            postfix["utt/s"] = f"{utterances / max(seconds, 1e-9):.1f}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        for h, own_handle in self._handlers:
            if own_handle is None:
                del h.handle  # back to the class's handle
            else:
                h.handle = own_handle
        self._handlers = []
        self.bar.close()
