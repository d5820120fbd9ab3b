"""Compute time per chunk of ds2_jax.infer.streaming on this machine's CPU, for a unidirectional model of
the demo's size (configs/demo.py with model.bidirectional=False, random weights: the time does not
depend on them), and its lookahead delay (onnx_model.lookahead_seconds).

    python -m benchmarks.stream_latency FILE [--chunk_ms=160,320,640]

Prints one JSON line per chunk size: median and 90th-percentile milliseconds per chunk (after a
warm-up pass that compiles each shape), the real-time factor, and the lookahead.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    import jax
    import numpy as np

    from configs import demo
    from ds2_jax import audio as audio_lib
    from ds2_jax import settings
    from ds2_jax import state as state_lib
    from ds2_jax.infer import onnx_model, streaming

    args = sys.argv[1:] if argv is None else argv
    chunks = [
        int(c)
        for c in next((a.split("=", 1)[1] for a in args if a.startswith("--chunk_ms=")), "160,320,640").split(",")
    ]
    path = next(a for a in args if not a.startswith("--"))
    config = demo.get_config()
    config.model.bidirectional = False
    config = settings.from_config_dict(config)
    bins = config.features.num_bins
    state = state_lib.create_state(config, jax.random.PRNGKey(0), np.zeros(bins, np.float32), np.ones(bins, np.float32))
    audio = audio_lib.read(path, 16_000)
    for chunk_ms in chunks:
        size = chunk_ms * 16
        times = []
        for timed in (False, True):  # the first pass compiles
            stream = streaming.Stream(config, state)
            for i in range(0, len(audio), size):
                start = time.perf_counter()
                stream.feed(audio[i : i + size])
                if timed:
                    times.append(1000 * (time.perf_counter() - start))
            stream.finish()
        print(
            json.dumps(
                {
                    "chunk_ms": chunk_ms,
                    "chunks": len(times),
                    "median_ms": round(float(np.median(times)), 2),
                    "p90_ms": round(float(np.percentile(times, 90)), 2),
                    "rtf": round(float(np.median(times)) / chunk_ms, 4),
                    "lookahead_s": round(onnx_model.lookahead_seconds(config), 3),
                    "load_average": round(os.getloadavg()[0], 2),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
