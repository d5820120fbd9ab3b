"""Training batches made off the step's critical path, in grain worker processes.

`train_batches(config, sharding, source, start, stop)` yields `source.train_batch(step)`
for step in [start, stop), in order. With dataset.num_workers > 0 the batches are made
by grain worker processes (`grain.MapDataset.range(...).map(...).mp_prefetch(...)`):
each worker opens its own copy of the source and produces every num_workers-th step;
grain hands the arrays back through shared memory and restores step order. Batches are
a pure function of (seed, step), so workers give exactly the inline batches and a
resumed run continues exactly.

Why worker processes: reading, decoding and padding in threads of the training process
hold the GIL, and a `jax.device_put` waiting for the GIL behind a busy Python thread
runs many times slower (BUILD_NOTES.md, Tried and rejected: input readers as threads). Out of the process, the
main thread only stages finished batches on the devices.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import Iterator

import numpy as np

from ds2_jax import errors, faults, settings, workers
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import DataSettings, open_source

log = logging.getLogger("ds2_jax")
MAX_AUTO_WORKERS = 16


def resolve_num_workers(dataset: settings.Dataset) -> int:
    """dataset.num_workers, with -1 resolved from the cores present (0 for synthetic data)."""
    n = dataset.num_workers  # -1, 0 or a count
    if n >= 0:
        return n
    if dataset.name == "synthetic":  # a pooled copy per batch: cheaper inline
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(0, min(cores - 2, MAX_AUTO_WORKERS))


class StepBatch:
    """step -> this process's rows of global batch `step`; opens its source on first use.

    Picklable (settings and sharding only), so each grain worker builds its own source.
    """

    def __init__(self, data: DataSettings, sharding: Sharding, source=None):
        self.data = data
        self.sharding = sharding
        self._source = source

    def __getstate__(self):
        """A worker's copy: settings and sharding; where this process has opened the source (and so
        checked it against dataset.manual_dir), the copy opens it without checking again."""
        checked = self._source is not None or self.data.source_checked
        return {
            "data": dataclasses.replace(self.data, source_checked=checked),
            "sharding": self.sharding,
            "_source": None,
        }

    def __call__(self, step) -> dict[str, np.ndarray]:
        step = int(step)
        in_worker = _in_worker()
        if in_worker:
            workers.die_with_parent()  # a trainer killed with -9 takes its workers along
            faults.Hooks(self.data.faults).input_batch(step)
        if self._source is None:
            with _quiet():
                self._source = open_source(self.data, self.sharding)
        if not in_worker:
            return self._source.train_batch(step)
        from grain.python import SharedMemoryArray

        # Padded straight into shared memory: grain then hands it over without a copy.
        return self._source.train_batch(step, audio_zeros=SharedMemoryArray)


def _in_worker() -> bool:
    import multiprocessing

    return multiprocessing.parent_process() is not None


@contextlib.contextmanager
def _quiet():
    """Workers open their source without repeating the main process's info lines."""
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def train_batches(
    config: settings.Settings, sharding: Sharding, source, start: int, stop: int
) -> Iterator[dict[str, np.ndarray]]:
    """Host batches of steps [start, stop) of a run's Settings in order, inline or from grain workers."""
    data = DataSettings.of(config)
    workers = resolve_num_workers(data.dataset)
    make = StepBatch(data, sharding, source)
    if workers == 0 or stop <= start:
        yield from (make(s) for s in range(start, stop))
        return
    import grain
    from absl import flags

    if not flags.FLAGS.is_parsed():  # grain's workers read absl flags; library callers parse none
        flags.FLAGS.mark_as_parsed()
    log.info("input: %d worker processes, %d batches buffered each", workers, data.dataset.worker_buffer_size)
    dataset = (
        grain.MapDataset.range(start, stop)
        .map(make)
        .to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
        .mp_prefetch(
            grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=data.dataset.worker_buffer_size)
        )
    )
    iterator = iter(dataset)
    try:
        for _ in range(start, stop):
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except Exception as e:  # noqa: BLE001 - grain re-raises a worker's failure as is
                raise errors.InputWorkerError(
                    f"an input worker failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                    "the training state is intact. Rerun to resume; if it repeats, set "
                    "--config.dataset.num_workers=0 to read inline and see the error in this process"
                ) from e
            yield {k: _unlinked_view(v) for k, v in batch.items()}
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
        del iterator


def _unlinked_view(array) -> np.ndarray:
    """A plain ndarray view of one of grain's shared-memory arrays, its segment's name
    unlinked at once: the mapping stays valid while a view holds it (POSIX), and no segment
    is left behind however the process ends (grain unlinks when the array is collected,
    which the interpreter's exit or a batch still on a device can outlast: resource_tracker's
    'leaked shared_memory objects' warning)."""
    shm = getattr(array, "shm", None)
    if shm is not None and getattr(array, "_unlink_on_del", False):
        shm.unlink()
        array._unlink_on_del = False  # grain's flag: __del__ then only closes the mapping
    return np.asarray(array)


class InputWait:
    """Seconds per log interval the devices sat idle waiting for a batch (reporting.next_batch).

    Warns once when the wait exceeds `warn_fraction` of two intervals in a row (one
    alone may hold a new bucket shape's compile, or a checkpoint).
    """

    def __init__(self, warn_fraction: float, num_workers: int):
        self.warn_fraction = warn_fraction
        self.num_workers = num_workers
        self.seconds = 0.0
        self.warned = False
        self._over = 0

    def add(self, seconds: float) -> None:
        self.seconds += seconds

    def take(self, interval_s: float) -> float:
        """This interval's wait (and resets it); logs one warning the first time it is large."""
        wait, self.seconds = self.seconds, 0.0
        self._over = self._over + 1 if interval_s > 0 and wait > self.warn_fraction * interval_s else 0
        if self._over >= 2 and not self.warned:
            self.warned = True
            log.warning(
                "input is the bottleneck: the devices sat idle waiting for batches %.0f%% of the last log interval; "
                "raise dataset.num_workers (now %d) or prefetch_batches",
                100 * wait / interval_s,
                self.num_workers,
            )
        return wait
