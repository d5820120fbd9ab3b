"""The JAX variants: 'jax' (the project's pmap'd step), 'jax_jit' (the same step under
parallelism='jit': one program over a device mesh) and 'jax_eager' (config.compile=False)."""

from __future__ import annotations

import os
import tempfile

import jax

from benchmarks import profile, timing
from ds2_jax import features, model, parallel, settings, train
from ds2_jax import state as state_lib
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import DataSettings
from ds2_jax.pipeline.synthetic import SyntheticSource

VARIANTS = ("jax", "jax_jit", "jax_eager")
PARALLELISM = {"jax": "pmap", "jax_jit": "jit", "jax_eager": "pmap"}  # jax_eager: compile=False


def device_description() -> str:
    d = jax.local_devices()[0]
    return f"{jax.local_device_count()} x {d.platform}:{getattr(d, 'device_kind', '?')} (jax {jax.__version__})"


def run(config, variant: str, n_devices: int, steps: int, warmup: int, profile_steps: int, num_batches: int) -> dict:
    """Times the train step of ds2_jax.train on n_devices; returns a result row's fields.

    Every variant compiles and stages through ds2_jax.parallel, as the training loop does.
    """
    config = settings.override(
        settings.from_config_dict(config),
        {"compile": variant != "jax_eager", "parallelism": PARALLELISM[variant], "num_devices": n_devices},
    )
    par = parallel.make(config)
    devices = par.devices
    global_batch = config.per_device_batch_size * n_devices
    source = SyntheticSource(DataSettings.of(config), Sharding(global_batch))
    host_batches = [source.train_batch(i) for i in range(num_batches)]
    mean, std = source.feature_stats(features.spectrogram_stats)
    state = state_lib.create_state(config, jax.random.PRNGKey(config.seed), mean, std)
    params = model.count_params(state.params)
    step_fn = par.compile(train.train_step, state_lib.step_kwargs(config))
    state, rng = par.put_replicated(state), par.put_replicated(jax.random.PRNGKey(config.seed + 1))
    if par.kind == "eager":
        batches = [jax.device_put(b, devices[0]) for b in host_batches]
    else:  # staged on the devices as the training loop stages them
        batches = list(par.put_batches(iter(host_batches), num_batches))
    holder = {"state": state}

    def dispatch(i):
        holder["state"], holder["metrics"] = step_fn(holder["state"], batches[i % len(batches)], rng)

    def step(i):
        dispatch(i)
        jax.block_until_ready(holder["metrics"])

    timed = timing.measure(step, warmup, steps)
    row = {
        "params": params,
        "first_step_s": timed["first_step_s"],
        **timing.step_stats(timed["step_times_s"], global_batch),
    }
    row["pipelined_ms_per_step"] = timing.pipelined_ms(dispatch, lambda: jax.block_until_ready(holder), steps)
    stats = devices[0].memory_stats() or {}  # None on the CPU
    if "peak_bytes_in_use" in stats:
        row["peak_memory_gb"] = round(stats["peak_bytes_in_use"] / 1e9, 2)
    if profile_steps > 0:
        with tempfile.TemporaryDirectory() as log_dir:
            try:
                options = jax.profiler.ProfileOptions()
                options.python_tracer_level = 0  # the Python tracer would swamp the eager step
                with jax.profiler.trace(log_dir, create_perfetto_trace=True, profiler_options=options):
                    for i in range(profile_steps):
                        step(i)
                path = profile.find_jax_trace(log_dir)
                row["profile"] = profile.summarize(
                    path, "jax", profile_steps, row["step_ms_median"], devices[0].platform == "gpu"
                )
                row["profile"]["trace_file"] = os.path.basename(path)
            except Exception as e:
                row["profile"] = {"error": f"{type(e).__name__}: {e}"[:500]}
    return row
