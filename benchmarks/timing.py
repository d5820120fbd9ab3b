"""Step timing shared by the JAX and PyTorch runners, and the seed's epoch arithmetic."""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np

SEED_EPOCH_UTTERANCES = 15_552  # the seed's 972 minibatches x 16 utterances
# Paddle DS2 on 1080 Ti, seed table: seconds per epoch of 15,552 utterances, 1..8 GPUs.
SEED_PADDLE_1080TI_EPOCH_S = {1: 771.4, 2: 533.2, 3: 402.2, 4: 363.5, 5: 330.0, 6: 308.3, 7: 307.2, 8: 288.7}


def measure(step: Callable[[int], None], warmup: int, steps: int) -> dict:
    """Runs step(i) (which must block until the device is done) max(warmup, 1) + steps times.

    The first call (compile + run) is timed apart and counts as a warm-up step; the
    other warm-up calls are not timed; then `steps` calls are timed one by one.
    """
    t0 = time.perf_counter()
    step(0)
    first = time.perf_counter() - t0
    for i in range(1, max(warmup, 1)):
        step(i)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(max(warmup, 1) + i)
        times.append(time.perf_counter() - t0)
    return {"first_step_s": first, "step_times_s": times}


def call_ms(call: Callable[[], None], steps: int, warmup: int = 3) -> tuple[float, float]:
    """(first call s, median ms) of call(), which must block until the device is done."""
    out = measure(lambda _: call(), warmup=warmup, steps=steps)
    return out["first_step_s"], float(np.median(out["step_times_s"]) * 1e3)


def pipelined_ms(dispatch: Callable[[int], None], drain: Callable[[], None], steps: int) -> float:
    """Mean ms per step of `steps` steps queued back to back and waited for once at the end.

    That is the rate of a training loop that does not wait for every step (ds2_jax.train
    waits every log_every_steps): the host queues step i+1 while the device runs step i,
    so per-step dispatch latency no longer leaves the device idle.
    """
    drain()
    t0 = time.perf_counter()
    for i in range(steps):
        dispatch(i)
    drain()
    return (time.perf_counter() - t0) * 1e3 / steps


def step_stats(times_s: list[float], global_batch: int) -> dict:
    """Median and spread of step time, throughput and the seed's per-epoch columns."""
    ms = np.asarray(times_s) * 1e3
    median = float(np.median(ms))
    minibatches = math.ceil(SEED_EPOCH_UTTERANCES / global_batch)
    return {
        "steps_timed": len(ms),
        "step_ms_median": median,
        "step_ms_p10": float(np.percentile(ms, 10)),
        "step_ms_p25": float(np.percentile(ms, 25)),
        "step_ms_p75": float(np.percentile(ms, 75)),
        "step_ms_p90": float(np.percentile(ms, 90)),
        "step_ms_min": float(ms.min()),
        "utterances_per_s": global_batch / (median / 1e3),
        "minibatches_per_epoch": minibatches,
        "time_per_minibatch_s": median / 1e3,
        "epoch_time_s": minibatches * median / 1e3,
    }
