"""XLA's memory analysis of the demo's compiled train step (one CPU device, 8 s utterances): the
temporaries at a batch of B, of 4 x B, and of K=4 micro-batches of B (optimizer.accumulate_steps).

    PYTHONPATH=. JAX_PLATFORMS=cpu python benchmarks/results/2026-12-06-cpu-recipe/measure_memory.py
"""

import functools
import json

import jax

from configs import demo
from ds2_jax import memory, settings, train
from ds2_jax import state as state_lib
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import make_source

SAMPLES, LABELS = 8 * 16_000, 120


def analysis(rows: int, k: int) -> dict:
    c = demo.get_config()
    c.dataset.name, c.dataset.manual_dir = "synthetic", ""
    c.optimizer.accumulate_steps = k
    config = settings.from_config_dict(c)
    source = make_source(config, Sharding(rows))
    state = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
    step = jax.jit(functools.partial(train.train_step, **state_lib.step_kwargs(config), axis_name=None))
    m = step.lower(state, memory.batch_spec(rows * k, SAMPLES, LABELS), jax.random.PRNGKey(0)).compile()
    m = m.memory_analysis()
    return {"rows": rows, "k": k, "temp_bytes": m.temp_size_in_bytes, "argument_bytes": m.argument_size_in_bytes}


if __name__ == "__main__":
    for rows, k in ((4, 1), (16, 1), (4, 4)):
        print(json.dumps(analysis(rows, k)), flush=True)
