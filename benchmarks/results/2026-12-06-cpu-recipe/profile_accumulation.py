"""Where XLA:CPU spends an accumulating demo step: one update of K micro-batches of ROWS rows (0.5 s
synthetic utterances) under jax.profiler, its trace's op times summed by name (the top 25).

    PYTHONPATH=. JAX_PLATFORMS=cpu python benchmarks/results/2026-12-06-cpu-recipe/profile_accumulation.py ROWS K
"""

import collections
import glob
import gzip
import json
import os
import sys
import tempfile

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure_step_time import demo_step  # noqa: E402


def main(rows: int, k: int) -> None:
    step, state, batch = demo_step(rows, k, (0.5, 0.52))
    state, metrics = step(state, batch, jax.random.PRNGKey(0))
    jax.block_until_ready(metrics)  # the compile, outside the trace
    trace_dir = tempfile.mkdtemp()
    with jax.profiler.trace(trace_dir):
        jax.block_until_ready(step(state, batch, jax.random.PRNGKey(0)))
    path = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)[0]
    total, calls = collections.Counter(), collections.Counter()
    for event in json.load(gzip.open(path))["traceEvents"]:
        if event.get("ph") == "X":
            total[event["name"]] += event["dur"]
            calls[event["name"]] += 1
    for name, us in total.most_common(25):
        print(f"{us / 1e3:9.1f} ms {calls[name]:6d}  {name[:110]}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
