"""Host-to-device copy rate of a training batch, by how the copy is made.

    python -m benchmarks.h2d [--batch=128] [--seconds=8] [--repeats=20]

One batch as the input pipeline makes it (int16 audio [B, S], 8 s at 16 kHz, plus the
small arrays) copied to the first device, each way timed as the median of `repeats`
synchronized copies:

  fresh_pageable   a new np.zeros batch each copy (what pad_batch returns)
  reused_pageable  the same host arrays every copy (pages already mapped)
  float32          the audio as float32 (dtype path check)
  tree_one_call    the whole dict in one jax.device_put
  per_array        one jax.device_put per array
  pinned_staged    host -> pinned_host jax array -> device
  busy_thread      fresh_pageable while another Python thread spins (GIL contention)

Prints one JSON object: GB/s per way.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time

import jax
import numpy as np


def host_batch(batch: int, samples: int, fresh: bool, cache: dict) -> dict[str, np.ndarray]:
    if not fresh and "b" in cache:
        return cache["b"]
    out = {
        "audio": np.zeros((batch, samples), np.int16),
        "audio_lengths": np.full((batch,), samples, np.int32),
        "labels": np.zeros((batch, 120), np.int32),
        "label_lengths": np.full((batch,), 100, np.int32),
        "weights": np.ones((batch,), np.float32),
    }
    out["audio"][:, : samples * 7 // 8] = 1  # touch most pages, as real rows do
    cache["b"] = out
    return out


def nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree_util.tree_leaves(tree))


def timed(copy, make, repeats: int) -> float:
    """Median GB/s of `copy(make())` over `repeats` synchronized copies (host prep untimed)."""
    jax.block_until_ready(copy(make()))  # warm-up
    rates = []
    for _ in range(repeats):
        tree = make()
        t = time.perf_counter()
        jax.block_until_ready(copy(tree))
        rates.append(nbytes(tree) / (time.perf_counter() - t) / 1e9)
    return round(statistics.median(rates), 3)


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_integer("batch", 128, "Utterances per batch.", flag_values=fv)
    flags.DEFINE_float("seconds", 8.0, "Seconds per utterance.", flag_values=fv)
    flags.DEFINE_integer("repeats", 20, "Timed copies per case.", flag_values=fv)


def main(argv=None) -> int:
    from ds2_jax import cli

    args, _ = cli.parse_args(argv, define_flags, __doc__)

    dev = jax.devices()[0]
    samples = int(args.seconds * 16_000)
    cache: dict = {}
    fresh = lambda: host_batch(args.batch, samples, True, cache)  # noqa: E731
    reused = lambda: host_batch(args.batch, samples, False, cache)  # noqa: E731
    put = lambda t: jax.device_put(t, dev)  # noqa: E731
    result = {"device": dev.device_kind, "batch_mb": round(nbytes(fresh()) / 1e6, 1)}
    result["fresh_pageable"] = timed(put, fresh, args.repeats)
    result["reused_pageable"] = timed(put, reused, args.repeats)
    result["float32"] = timed(put, lambda: {"audio": fresh()["audio"].astype(np.float32)}, args.repeats)
    result["tree_one_call"] = result["fresh_pageable"]
    result["per_array"] = timed(lambda t: [jax.device_put(v, dev) for v in t.values()], fresh, args.repeats)
    try:
        pinned = jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host")
        on_device = jax.sharding.SingleDeviceSharding(dev, memory_kind="device")
        staged = lambda t: jax.device_put(jax.device_put(t, pinned), on_device)  # noqa: E731
        result["pinned_staged"] = timed(staged, fresh, args.repeats)
        on_pinned = jax.block_until_ready(jax.device_put(fresh(), pinned))
        result["from_pinned_only"] = timed(lambda t: jax.device_put(t, on_device), lambda: on_pinned, args.repeats)
    except Exception as e:  # noqa: BLE001 - not every backend has pinned host memory
        result["pinned_staged"] = f"unavailable: {type(e).__name__}: {str(e)[:120]}"
    stop = threading.Event()

    def spin():
        x = 0
        while not stop.is_set():
            x += 1

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    result["busy_thread"] = timed(put, fresh, args.repeats)
    stop.set()
    thread.join()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    from ds2_jax import errors

    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
