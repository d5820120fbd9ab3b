"""Where XLA:CPU spends an accumulating demo step: one update of K micro-batches of ROWS rows (0.5 s
synthetic utterances) under jax.profiler, its trace's op times summed by name (the top 25).

    PYTHONPATH=. JAX_PLATFORMS=cpu python benchmarks/results/2026-12-06-cpu-recipe/profile_accumulation.py ROWS K
"""

import collections
import functools
import glob
import gzip
import json
import sys
import tempfile

import jax

from configs import demo
from ds2_jax import settings, train
from ds2_jax import state as state_lib
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import make_source


def main(rows: int, k: int) -> None:
    c = demo.get_config()
    c.dataset.name, c.dataset.manual_dir = "synthetic", ""
    c.dataset.synthetic_min_duration_s, c.dataset.synthetic_max_duration_s = 0.5, 0.52
    c.optimizer.accumulate_steps = k
    config = settings.from_config_dict(c)
    source = make_source(config, Sharding(rows * k))
    state = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
    step = jax.jit(functools.partial(train.train_step, **state_lib.step_kwargs(config), axis_name=None))
    batch = source.train_batch(0)
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
