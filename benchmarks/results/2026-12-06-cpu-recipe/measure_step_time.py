"""The demo's train step on one CPU device (synthetic 2-2.5 s utterances), compiled with jax.jit:
one batch of 16, K=4 micro-batches of 4 (optimizer.accumulate_steps), one batch of 4; the first
call (compile) and the mean of the next 3 updates.

    PYTHONPATH=. JAX_PLATFORMS=cpu python benchmarks/results/2026-12-06-cpu-recipe/measure_step_time.py
"""

import functools
import time

import jax

from configs import demo
from ds2_jax import settings, train
from ds2_jax import state as state_lib
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import make_source


def demo_step(rows: int, k: int, seconds: tuple[float, float] = (2.0, 2.5)):
    """(the demo's jitted train step, its first state, a batch) for k micro-batches of `rows`
    synthetic utterances of `seconds` (min, max)."""
    c = demo.get_config()
    c.dataset.name, c.dataset.manual_dir = "synthetic", ""
    c.dataset.synthetic_min_duration_s, c.dataset.synthetic_max_duration_s = seconds
    c.optimizer.accumulate_steps = k
    config = settings.from_config_dict(c)
    source = make_source(config, Sharding(rows * k))
    state = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
    step = jax.jit(functools.partial(train.train_step, **state_lib.step_kwargs(config), axis_name=None))
    return step, state, source.train_batch(0)


def run(rows: int, k: int) -> None:
    step, state, batch = demo_step(rows, k)
    t = time.perf_counter()
    state, m = step(state, batch, jax.random.PRNGKey(0))
    jax.block_until_ready(m)
    first = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(3):
        state, m = step(state, batch, jax.random.PRNGKey(0))
        jax.block_until_ready(m)
    print(f"rows {rows} x K={k}: compile+first {first:.1f} s, step {(time.perf_counter() - t) / 3:.3f} s", flush=True)


if __name__ == "__main__":
    for rows, k in ((16, 1), (4, 4), (4, 1)):
        run(rows, k)
