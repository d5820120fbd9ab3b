"""What a training run shows and watches, in one object: the progress bar, metrics.jsonl (and
TensorBoard), the log line of each interval and evaluation, the devices' wait for input, and
the watchdog's idea of progress.

The loop (train._train) tells its `Reporter` what happened: a batch was waited for, a step
dispatched, a log interval ended, an evaluation scored, a checkpoint is being written. The
reporter keeps the dispatched steps' metrics (device arrays) until the interval's line,
and pings the watchdog at each sign of progress; work that cannot ping (the first step's
compile, the eval step's compile, a checkpoint save) runs with the watchdog suspended.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import sys
import time

import jax
import numpy as np

from ds2_jax import metrics, progress, resilience, settings
from ds2_jax.pipeline import loader

log = logging.getLogger("ds2_jax")


class Reporter:
    """The bar, the metric writer, input-wait and watchdog bookkeeping of steps [start, num_train_steps).

    A context manager: the watchdog and the writer are closed on the way out, of an error too
    (a watchdog left running would end the caller's process step_timeout_s later).
    """

    def __init__(self, config: settings.Settings, workdir: str, start: int, is_chief: bool):
        self.config = config
        self.start = start
        self.input_wait = loader.InputWait(config.input_wait_warn_fraction, loader.resolve_num_workers(config.dataset))
        self.writer = metrics.MetricWriter(workdir, enabled=is_chief, resume_step=start)
        self.bar = progress.StepProgress(start, config.num_train_steps, is_chief and progress.on_a_terminal(sys.stderr))
        self.watchdog = resilience.Watchdog(config.step_timeout_s)
        self.pending: list = []  # metrics of the steps dispatched since the last log line
        self.done = start  # steps dispatched
        self.evals = 0
        self._last_time, self._last_step = time.perf_counter(), start  # the interval's start
        self._waited_from = self._last_time

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.watchdog.close()
        if exc_type is None:
            self.writer.close()
        else:  # a failing close (a full disk) does not replace the error that ended the run
            with contextlib.suppress(Exception):
                self.writer.close()
        return False

    def showing_bar(self):
        """The bar, closed on the way out (it holds the log handlers while it is open)."""
        return contextlib.closing(self.bar)

    def suspended(self, what: str):
        """No watchdog timeout while the block runs (see resilience.Watchdog.suspended)."""
        return self.watchdog.suspended(what)

    def resume_changes(self, step: int, changes: list[tuple[str, object, object]]) -> None:
        """A marker in metrics.jsonl where a resume changed a (numeric) setting; all of them are
        in config_changes.jsonl (workdir_config.record_resume_changes)."""
        if changes:
            self.writer.write(
                step, {k: v for k, _, v in changes if isinstance(v, (int, float))}, prefix="config_change/"
            )

    def next_batch(self, batches) -> dict:
        """The next staged batch; the time the devices sat idle waiting for it is input wait."""
        self._waited_from = time.perf_counter()
        batch, idle_s = next_batch(batches, self.pending[-1] if self.pending else None)
        self.input_wait.add(idle_s)
        return batch

    def running(self, step: int):
        """Around a step's dispatch: the first one compiles, with the watchdog suspended."""
        return self.suspended("compiling the first step") if step == self.start else contextlib.nullcontext()

    def dispatched(self, step: int, step_metrics: dict) -> None:
        """Step `step` (from 0) was dispatched; its metrics are device arrays, maybe not ready."""
        self.pending.append(step_metrics)
        self.done = step + 1
        if step == self.start:
            log.info("first step (compile + run) took %.1f s", time.perf_counter() - self._waited_from)
            self.input_wait.take(0.0)  # the first batch waits for worker start-up; not an interval
            self._last_time, self._last_step = time.perf_counter(), step + 1
            self.watchdog.ping(f"step {step + 1}")
        self.bar.dispatched(step_metrics)

    def wait_in_flight(self, most: int) -> None:
        """Waits until at most `most` dispatched steps are unfinished (polled: see resilience.wait_ready)."""
        if len(self.pending) > most:
            resilience.wait_ready(self.pending[-1 - most])
            self.watchdog.ping(f"step {self.done - most}")

    def interval_end(self, state) -> None:
        """The log line and metrics.jsonl record of the steps since the last one: means of their
        metrics, step time, input wait, skipped steps so far. Waits for the steps to finish."""
        done = self.done
        self.bar.wait_all()
        fetched = jax.device_get(self.pending)  # waits for the interval's steps to finish
        interval_s = time.perf_counter() - self._last_time
        summary = summarize(fetched, interval_s, done - self._last_step)
        summary["input_wait_s"] = self.input_wait.take(interval_s)
        summary["skipped_steps"] = float(first(state.skipped_steps))
        self.writer.write(done, summary)
        untrainable = int(sum(first(m["untrainable"]) for m in fetched if "untrainable" in m))
        skipped = (
            ""
            if summary["loss"] is not None
            else f" (no utterance of steps {done - len(fetched) + 1}-{done} was trainable)"
            if summary["infeasible_utterances"] > 0 and untrainable
            else f" (every step of steps {done - len(fetched) + 1}-{done} "
            "was skipped: a non-finite loss, gradient or update)"
        )
        if untrainable:
            log.warning(
                "%d of steps %d-%d had no trainable utterance: every one of their batches was CTC-infeasible "
                "(more labels than the model emits frames), so they have no loss (not 0) and taught nothing. "
                "Look at what shortens the audio or lengthens the labels: waveform.speed_max (speed factors "
                "above ~1.5), dataset.min_duration_s, the model's frame rate (features.hop, conv strides)",
                untrainable,
                done - len(fetched) + 1,
                done,
            )
        log.info(
            "step %d: means of steps %d-%d: %s%s%s",
            done,
            done - len(fetched) + 1,
            done,
            " ".join(f"{k}={'-' if v is None else format(v, '.4g')}" for k, v in summary.items()),
            skipped,
            time_left(summary["step_time_s"], self.config.num_train_steps - done),
        )
        self.pending, self._last_time, self._last_step = [], time.perf_counter(), done
        self.watchdog.ping(f"step {done}")

    @contextlib.contextmanager
    def evaluating(self, step: int):
        """Around an evaluation at `step`; yields the callback for each eval batch (progress for
        the watchdog). The first evaluation compiles its step first, with the watchdog suspended."""
        first_eval = (
            contextlib.nullcontext() if self.evals else self.suspended(f"compiling the eval step at step {step}")
        )
        with first_eval:
            yield lambda: self.watchdog.ping(f"eval at step {step}")
        self.evals += 1

    def evaluated(self, step: int, result: dict) -> None:
        """An evaluation's figures into metrics.jsonl (eval_*) and the log, with its first examples."""
        self.writer.write(step, {"wer": result["wer"], "cer": result["cer"], "loss": result["loss"]}, prefix="eval_")
        log.info(
            "eval at step %d: WER %.4f CER %.4f loss %.4f (%d utterances)",
            step,
            result["wer"],
            result["cer"],
            result["loss"],
            result["utterances"],
        )
        for ex in result["examples"][: self.config.eval.num_examples_to_print]:
            log.info("  REF: %s", ex["reference"])
            log.info("  HYP: %s", ex["hypothesis"])
        self.watchdog.ping(f"eval at step {step}")


def first(x) -> float:
    """A replicated (or plain) scalar's value on the host."""
    return np.asarray(jax.device_get(x)).reshape(-1)[0]


def next_batch(batches, last_metrics) -> tuple[dict, float]:
    """The next staged batch, and the seconds the devices sat idle waiting for it.

    Waiting while the last dispatched step still runs costs nothing; only the time
    after it finished (polled each millisecond) is input-bound.
    """
    start = time.perf_counter()
    idle_since = start if last_metrics is None else None
    while True:
        batch = batches.next_within(0.001)
        now = time.perf_counter()
        if batch is not None:
            return batch, (now - idle_since if idle_since is not None else 0.0)
        if idle_since is None and all(x.is_ready() for x in jax.tree_util.tree_leaves(last_metrics)):
            idle_since = now


def time_left(step_time_s: float, steps_left: int) -> str:
    """' eta=H:MM:SS' of the steps left at this step time ('' when none are left): without a bar
    (not on a terminal) the log lines say how long the run has to go."""
    if steps_left <= 0:
        return ""
    return f" eta={datetime.timedelta(seconds=round(step_time_s * steps_left))}"


def summarize(pending: list, seconds: float, steps: int) -> dict[str, float | None]:
    """Means of an interval's step metrics (train.train_step's sums), step time and throughput. Loss
    and gradient norm are means over the finite (not skipped) steps: None when every step was skipped
    (no value, never a 0 that reads as a perfect loss)."""
    s = metrics.reduce_sums(pending)
    n = max(s["steps"], 1.0)
    none_finite = s["finite_steps"] == 0
    return {
        "loss": None if none_finite or s["loss_count"] == 0 else s["loss_sum"] / s["loss_count"],
        "grad_norm": None if none_finite else s["grad_norm_sum"] / s["finite_steps"],
        "learning_rate": s["learning_rate_sum"] / n,
        "infeasible_utterances": s["infeasible"],
        "step_time_s": seconds / max(steps, 1),
        "utterances_per_s": s["utterances"] * (steps / n) / max(seconds, 1e-9),
    }
