"""The train loop's progress bar: it counts finished steps, not dispatched ones.

jax dispatches steps asynchronously, so the loop runs ahead of the device. The loop
hands each dispatched step's metrics (device arrays) to `StepProgress.dispatched`; the
bar moves past a step once its metrics are ready (`jax.Array.is_ready`, no wait) or
when `wait_all` waits for them in order, and shows the latest finished step's loss and
the steps and utterances per second of the finished steps with the time left. The rates
span the last RATE_SECONDS of finished steps after the run's first (which compiles), so a
compile never enters them (tqdm's own rate, an average since the start, would). While the
bar is open, log records clear it, print, and redraw it, so a log line never lands inside
the bar. The training loop shows it only on a terminal (`on_a_terminal`).
"""

from __future__ import annotations

import collections
import logging
import time
import weakref

import jax
import numpy as np

RATE_SECONDS = 10.0  # the step/s and utt/s figures span the finished steps of this long
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"  # tqdm's rate left out: ours is in the postfix


def on_a_terminal(stream) -> bool:
    """Whether a bar can redraw itself on `stream`. In a file or a pipe (a batch job's log, CI)
    each redraw would stay behind, and log lines would land after the bar's remains."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


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

        self.bar = tqdm(
            total=total,
            initial=start,
            disable=not enabled,
            unit="step",
            dynamic_ncols=True,
            mininterval=1.0,
            bar_format=BAR_FORMAT,
        )
        self.finished = start
        self._pending: collections.deque = collections.deque()
        self._times: collections.deque = collections.deque()  # (time, steps, utterances) of finished steps
        self._utterances = 0.0
        # handle, not emit: absl's handler forwards handle() to an inner handler.
        # Handlers that write to files (`terminal = False`, the workdir's log) are left alone.
        handlers = (
            [h for name in loggers for h in logging.getLogger(name).handlers if getattr(h, "terminal", True)]
            if enabled
            else []
        )
        self._handlers = [(h, h.__dict__.get("handle")) for h in handlers]  # a handle set on the instance, if any
        for h in handlers:
            h.handle = self._clearing(h.handle, h.filter)

    def _clearing(self, handle, passes):
        bar_ref = weakref.ref(self.bar)  # a loop that raised leaves no live bar behind

        def handle_around_bar(record):
            bar = bar_ref()
            if bar is None or bar.disable or not passes(record):  # closed, or a record this handler drops
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
        now = time.perf_counter()
        self._utterances += _scalar(m["utterances"])
        self._times.append((now, self.finished, self._utterances))  # the first: after the compile
        while len(self._times) > 2 and now - self._times[1][0] >= RATE_SECONDS:
            self._times.popleft()
        # "last step loss": this step's alone (the log's loss is the mean of its interval)
        postfix = {"last step loss": f"{_scalar(m['loss_sum']) / max(_scalar(m['loss_count']), 1.0):.3f}"}
        if len(self._times) > 1:
            (t0, n0, u0), (t1, n1, u1) = self._times[0], self._times[-1]
            seconds = max(t1 - t0, 1e-9)
            steps_per_s = (n1 - n0) / seconds
            postfix["step/s"] = f"{steps_per_s:.3g}"
            postfix["utt/s"] = f"{(u1 - u0) / seconds:.1f}"
            if self.bar.total:
                postfix["eta"] = self.bar.format_interval((self.bar.total - self.finished) / steps_per_s)
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
