"""The pure train step, and the training loop.

`train_step` is one pure function (features, forward, CTC, backward, gradient
all-reduce, update, metrics). `compile_train_step` wraps it as config.parallelism says
(parallel.py: `jax.pmap` with axis name `batch` and the state donated, or jit over a
device mesh) or, with config.compile=False, leaves it to run op by op on one device, so
the compiled and the eager design run identical code.

`_train` is the loop: steps dispatched ahead of the device (at most
resilience.STEPS_IN_FLIGHT), a log line, an evaluation and a checkpoint at their
intervals, a stop signal answered at the next step with a checkpoint. What the run shows
and watches (bar, metrics.jsonl, input wait, watchdog) is its `reporting.Reporter`; the
points where the tests inject faults are its `faults.Hooks`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from ds2_jax import (
    batch_axis,
    checkpoint,
    ctc,
    determinism,
    errors,
    eval_step,
    evaluation,
    faults,
    features,
    finetune,
    geometry,
    memory,
    model,
    parallel,
    reporting,
    resilience,
    settings,
    workdir_config,
)
from ds2_jax.batch_axis import psum
from ds2_jax.infer import delay
from ds2_jax.pipeline import loader
from ds2_jax.pipeline.source import make_source, with_data_alphabet
from ds2_jax.state import (
    TrainState,
    idle_steps_warning,
    initial_state,
    loss_arguments,
    run_optimizer,
    step_kwargs,
    with_eval_weights,
)

log = logging.getLogger("ds2_jax")
AXIS = parallel.AXIS


def features_of(state, batch, fc):
    return features.featurize(batch["audio"], batch["audio_lengths"], state.feature_mean, state.feature_std, fc)


def loss_function(
    state: TrainState,
    batch: dict[str, jax.Array],
    rng: jax.Array,
    *,
    model_cfg: model.ModelConfig,
    feature_cfg: settings.Spectrogram,
    augment: settings.SpecAugment,
    norm_by_times: bool,
    ctc_impl: str,
    axis_name: str | None = AXIS,
) -> Callable:
    """params -> (this device's share of the global batch's mean loss, (new batch-norm
    statistics, this device's loss sum, the global feasible count, <float32>[B] rows used)).

    The loss is the mean over all feasible utterances of the global batch, so 1 device and
    N devices compute the same gradient once it is psum'd.
    """
    net = model.DeepSpeech2(model_cfg, axis_name=axis_name)
    rng = jax.random.fold_in(rng, state.step)
    if axis_name is not None:
        rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))
    feats, frames = features_of(state, batch, feature_cfg)
    if augment.enabled:
        feats = features.spec_augment(feats, frames, rng, **dataclasses.asdict(augment))
    weights = batch["weights"]

    def loss_fn(params):
        (logits, out_lengths), updates = net.apply(
            {"params": params, "batch_stats": state.batch_stats}, feats, frames, train=True, mutable=["batch_stats"]
        )
        loss, ok = ctc.per_utterance_loss(
            logits, out_lengths, batch["labels"], batch["label_lengths"], norm_by_times, ctc_impl
        )
        used = ok.astype(jnp.float32) * weights
        count = psum(jnp.sum(used), axis_name)
        local_sum = jnp.sum(loss * used)
        return local_sum / jnp.maximum(count, 1.0), (updates["batch_stats"], local_sum, count, used)

    return loss_fn


def loss_gradients(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array, **loss_kwargs):
    """This device's gradient of the global batch's mean loss (before the all-reduce), and
    `loss_function`'s aux; `loss_kwargs` are loss_function's keyword arguments."""
    return jax.grad(loss_function(state, batch, rng, **loss_kwargs), has_aux=True)(state.params)


def micro_batches(batch: dict[str, jax.Array], k: int) -> dict[str, jax.Array]:
    """<[k, B, ...]> of a batch of k x B rows per device: micro-batch i is rows [i B, (i + 1) B)
    of each device's shard (pmap: of the batch it sees; jit: of each device's block of the global
    batch, so no row moves between devices and both parallelisms accumulate the same rows)."""
    devices = batch_axis.mesh_size() if batch_axis.sharded() else 1

    def split(x):
        rows = x.shape[0] // (devices * k)
        x = x.reshape(devices, k, rows, *x.shape[1:])
        return jnp.swapaxes(x, 0, 1).reshape(k, devices * rows, *x.shape[3:])

    return jax.tree_util.tree_map(split, batch)


def accumulated_gradients(
    state: TrainState, batch: dict[str, jax.Array], rng: jax.Array, accumulate_steps: int, **loss_kwargs
):
    """`loss_gradients` over `accumulate_steps` micro-batches of the batch (`micro_batches`), in one
    lax.scan, so the step's activations are one micro-batch's: (this device's gradient of the mean
    loss over every feasible utterance of all of them, (batch-norm statistics after the last,
    this device's loss sum, the global feasible count)).

    The mean is over the utterances, not of the micro-batches' means: K micro-batches of B give
    the gradient of one batch of K x B. Batch norm normalizes each micro-batch by its own
    statistics (as a batch of B would be: the rows a step's activations see), and its running
    statistics are updated once per micro-batch, in order, as K steps of B would.
    """
    parts = micro_batches(batch, accumulate_steps)

    def one(carry, xs):
        stats, grad_sum, loss_sum, count = carry
        micro, i = xs
        fn = loss_function(state.replace(batch_stats=stats), micro, jax.random.fold_in(rng, i), **loss_kwargs)

        def summed(params):  # the micro-batch's loss sum: divided by the count of all of them below
            _, aux = fn(params)
            return aux[1], aux

        grads, (new_stats, local_sum, micro_count, _) = jax.grad(summed, has_aux=True)(state.params)
        grad_sum = jax.tree_util.tree_map(jnp.add, grad_sum, grads)
        return (new_stats, grad_sum, loss_sum + local_sum, count + micro_count), None

    zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
    init = (state.batch_stats, zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
    steps = jnp.arange(accumulate_steps)
    (new_stats, grad_sum, loss_sum, count), _ = jax.lax.scan(one, init, (parts, steps))
    grads = jax.tree_util.tree_map(lambda g: g / jnp.maximum(count, 1.0), grad_sum)
    return grads, (new_stats, loss_sum, count)


def train_step(
    state: TrainState,
    batch: dict[str, jax.Array],
    rng: jax.Array,
    *,
    learning_rate_fn: Callable,
    accumulate_steps: int = 1,
    ema_decay: float = 0.0,
    axis_name: str | None = AXIS,
    **loss_kwargs,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step on this device's shard: `loss_gradients` (its keyword arguments in
    `loss_kwargs`), or with `accumulate_steps` K > 1 `accumulated_gradients` over K micro-batches
    of the batch's K x B rows, gradients psum'd over `axis_name`, Adam. The step is the update:
    the schedule, Adam's count and state.step count updates, and no state is kept between
    micro-batches (a resume starts at an update).

    A step whose loss or gradient is not finite, or whose new parameters or optimizer state
    are not (a finite gradient through a learning rate, eps or b2 that divides by 0), leaves
    parameters, optimizer and batch-norm statistics unchanged: a NaN never enters the state.
    With accumulation one non-finite micro-batch skips the whole update (its sum is not
    finite), counted as one skipped step.

    With `ema_decay` d > 0 the state's ema_params move to d' ema + (1 - d') params after each update,
    d' = min(d, (1 + n) / (10 + n)) after n updates (tf.train.ExponentialMovingAverage's warm-up: an
    early average follows the model instead of remembering its random start); a skipped step
    keeps them.
    """
    if accumulate_steps > 1:
        grads, (new_stats, loss_sum, count) = accumulated_gradients(
            state, batch, rng, accumulate_steps, axis_name=axis_name, **loss_kwargs
        )
    else:
        grads, (new_stats, loss_sum, count, _) = loss_gradients(state, batch, rng, axis_name=axis_name, **loss_kwargs)
    grads = psum(grads, axis_name)
    loss_sum = psum(loss_sum, axis_name)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss_sum) & jnp.isfinite(grad_norm)

    updated = state.apply_gradients(grads=grads, batch_stats=new_stats)
    finite = finite & all_finite((updated.params, updated.opt_state))

    def keep(new, old):
        return jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, old)

    new_state = updated.replace(
        params=keep(updated.params, state.params),
        opt_state=keep(updated.opt_state, state.opt_state),
        batch_stats=keep(updated.batch_stats, state.batch_stats),
        skipped_steps=state.skipped_steps + (~finite).astype(jnp.int32),
        consecutive_skips=jnp.where(finite, 0, state.consecutive_skips + 1),
    )
    if state.ema_params is not None:
        new_state = new_state.replace(
            ema_params=keep(moving_average(state.ema_params, updated.params, ema_decay, state.step), state.ema_params)
        )
    weights = batch["weights"]
    utterances = psum(jnp.sum(weights), axis_name)
    step_metrics = {
        "loss_sum": jnp.where(finite, loss_sum, 0.0),
        "loss_count": jnp.where(finite, count, 0.0),
        "infeasible": utterances - count,
        "untrainable": (count == 0).astype(jnp.float32),  # no feasible utterance: no loss to report
        "utterances": utterances,
        "grad_norm_sum": jnp.where(finite, grad_norm, 0.0),
        "finite_steps": finite.astype(jnp.float32),
        "steps": jnp.ones((), jnp.float32),
        "learning_rate_sum": learning_rate_fn(state.step),
    }
    return new_state, step_metrics


def moving_average(ema, params, decay: float, updates: jax.Array):
    """ema moved towards params by one update (train_step's rule), after `updates` updates."""
    d = jnp.minimum(decay, (1.0 + updates) / (10.0 + updates)).astype(jnp.float32)
    return jax.tree_util.tree_map(lambda e, p: d * e + (1.0 - d) * p, ema, params)


def all_finite(tree) -> jax.Array:
    """<bool>[]: every floating-point entry of `tree` is finite (integer leaves, e.g. Adam's count, are)."""
    leaves = [x for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])) if leaves else jnp.bool_(True)


def compile_train_step(config: settings.Settings) -> Callable:
    """The train step compiled for config.parallelism, or eager with config.compile=False."""
    return parallel.make(config).compile(step_function(config), step_kwargs(config))


def step_function(config: settings.Settings) -> Callable:
    """train_step, or with config.faults.nan_at_steps the step whose features are NaN at those
    steps (faults.with_nan_features): the pure loss knows nothing of fault injection."""
    nan_steps = faults.parse_steps(config.faults.nan_at_steps)
    return faults.with_nan_features(train_step, nan_steps) if nan_steps else train_step


# ----------------------------------------------------------------------------- loop


def train_and_evaluate(config, workdir: str) -> TrainState:
    """Trains for config.num_train_steps, resuming from the latest checkpoint in workdir
    (one already at that step returns its state: "nothing to train").

    SIGTERM/SIGINT/SIGHUP checkpoint at the next step boundary and return; a step with a
    non-finite loss is skipped (config.optimizer.max_consecutive_skips in a row stop
    the run); no progress for config.step_timeout_s, or a collective failing because another
    process is gone (errors.PeerLost), ends the process (exit 3). A second
    run on the same workdir is refused while this one holds its lock (workdir/run.lock).
    """
    config = settings.from_config_dict(config)
    try:
        # The stop signals are caught from the start: one arriving while the model is built or the step
        # compiles (minutes) stops the run at the first step boundary, not with a traceback or a kill.
        alone = jax.process_count() == 1  # a shared workdir is left to its processes
        with (
            resilience.Preemption(workdir if alone else None) as preemption,
            resilience.WorkdirLock(workdir, enabled=jax.process_index() == 0),
            checkpoint.managed(workdir, config.keep_checkpoints, config.keep_best_checkpoints) as mgr,
        ):
            return _train(config, workdir, mgr, preemption)
    except Exception as e:
        if jax.process_count() > 1 and errors.is_peer_lost(e):  # a collective whose peer was killed
            raise errors.peer_lost(e, jax.process_index(), jax.process_count()) from e
        raise


def _nothing_to_train(start: int, config: settings.Settings, workdir: str) -> bool:
    """True (after saying so) when the workdir's checkpoint is at or past num_train_steps."""
    if start < config.num_train_steps:
        return False
    where = f"the checkpoint in {workdir} is at step {start}"
    if start == config.num_train_steps:
        log.info(
            "nothing to train: workdir already at step %d of %d (%s). Raise --config.num_train_steps "
            "to train on, or evaluate it with --mode=eval",
            start,
            config.num_train_steps,
            workdir,
        )
    else:
        log.warning(
            "%s, past num_train_steps=%d: nothing to train (steps are never undone). Raise "
            "--config.num_train_steps above %d to train on, evaluate it with --mode=eval, or choose "
            "another --workdir to start over",
            where,
            config.num_train_steps,
            start,
        )
    return True


def _train(config: settings.Settings, workdir: str, mgr, preemption: resilience.Preemption) -> TrainState:
    """train_and_evaluate's loop, with the workdir locked, the checkpoint manager `mgr` open and the
    stop signals caught (`preemption`)."""
    if config.init_from and not mgr.all_steps():  # before the data is built: a bad source fails at once
        finetune.check_source(config)
    par, sharding, source = _devices_and_data(config)
    config = with_data_alphabet(config, source)  # the output layer follows the data's alphabet
    init_rng, step_rng = jax.random.split(jax.random.PRNGKey(config.seed))
    state, config = _initial_or_restored(config, workdir, mgr, source, init_rng)
    start = int(state.step)
    if _nothing_to_train(start, config, workdir):
        return state
    changes = _resume_notes(config, workdir, start)
    p_train, p_eval, state, step_rng = _compiled_steps(config, par, state, step_rng, source)
    host_batches = loader.train_batches(config, sharding, source, start, config.num_train_steps)
    batches = par.put_batches(host_batches, config.prefetch_batches)
    hooks = faults.Hooks(config.faults)
    done, ranked = start, None  # ranked: the step of the last checkpoint saved with its eval's WER
    with reporting.Reporter(config, workdir, start, is_chief=jax.process_index() == 0) as report:
        report.resume_changes(start, changes)
        log.info(
            "compiling the train step for batch shapes %s (the first step: minutes for a large batch)", source.shapes()
        )
        with report.showing_bar(), contextlib.closing(batches):
            for step in range(start, config.num_train_steps):
                hooks.step_start(step)
                batch = report.next_batch(batches)
                with report.running(step):
                    state, step_metrics = _run_step(p_train, state, batch, step_rng, config, first=step == start)
                done = step + 1
                report.dispatched(step, step_metrics)
                hooks.step_dispatched(done)
                report.wait_in_flight(resilience.STEPS_IN_FLIGHT)  # bounded: a stop waits for few steps, not ~30
                if _log_due(done, config):
                    report.interval_end(state)
                    _stop_if_diverged(state, done, config, mgr)
                if config.eval_every_steps and done % config.eval_every_steps == 0:
                    ranked = (
                        _evaluate_in_training(p_eval, state, done, source, par, config, workdir, mgr, report, hooks)
                        or ranked
                    )
                if preemption.signal is not None:
                    log.warning("preempted at step %d: writing a checkpoint and exiting", done)
                    break
                if _checkpoint_due(done, config, ranked):
                    _save(mgr, done, par.get(state), report, hooks)
            resilience.wait_ready(state)  # polled, with the handlers on: a second signal can abandon it
        final = par.get(state)
        _save_last(mgr, start, done, final, report, hooks)
    return final


def _compiled_steps(config: settings.Settings, par, state: TrainState, step_rng, source):
    """(train step, eval step, state, step rng): the steps compiled for `par` once the batch is known
    to fit the device (and, on one CPU host, the host's memory); state and rng placed on the devices."""
    kw = step_kwargs(config)  # computed once: the eval step takes its model, features and loss from it
    est = _check_device_memory(config, par, state, source, kw)
    p_train, p_eval = par.compile(step_function(config), kw), eval_step.compile_eval_step(par, kw)  # eval: as placed
    state, step_rng = par.put_replicated(state), par.put_replicated(step_rng)
    on_one_cpu_host = par.devices[0].platform == "cpu" and jax.process_count() == 1
    if on_one_cpu_host and par.kind != "eager" and hasattr(p_train, "lower"):  # else: the estimate alone
        p_train = _check_host_step_memory(config, par, p_train, est, state, step_rng, source)
    return p_train, p_eval, state, step_rng


def _log_due(done: int, config: settings.Settings) -> bool:
    """A log interval ends after step `done` (every log_every_steps, and at the last step)."""
    return done % config.log_every_steps == 0 or done == config.num_train_steps


def _checkpoint_due(done: int, config: settings.Settings, ranked: int | None) -> bool:
    """A periodic checkpoint after step `done`: every checkpoint_every_steps, but not the last step's
    (saved after the loop) nor one an eval has just saved with its WER (`ranked`)."""
    return done % config.checkpoint_every_steps == 0 and done not in (config.num_train_steps, ranked)


def _evaluate_in_training(
    p_eval,
    state,
    done: int,
    source,
    par,
    config: settings.Settings,
    workdir: str,
    mgr,
    report: reporting.Reporter,
    hooks,
) -> int | None:
    """The eval of dataset.eval_split after step `done`, on the placed train state (its EMA weights
    where it keeps them and eval.ema_weights); the model's emission delay, measured on the same
    argmax paths, recorded for step `done` in the workdir's timing.json (infer.delay: word times of
    transcribe and export then need no data); with
    keep_best_checkpoints, a checkpoint ranked by its WER (checkpoint.manager): returns its step
    (None: no checkpoint saved)."""
    hooks.eval_start(done)
    with report.evaluating(done) as on_batch:
        result = evaluation.evaluate(
            p_eval,
            with_eval_weights(state, config.eval.ema_weights),
            source,
            config.dataset.eval_split,
            config.eval.max_utterances,
            par,
            on_batch=on_batch,
            lag_of=_lag_of(config, source.alphabet),
        )
    report.evaluated(done, result)
    if result["delay_utterances"] and jax.process_index() == 0:
        delay.record(workdir, done, result["emission_delay_s"], result["delay_utterances"], config.dataset.eval_split)
    if not config.keep_best_checkpoints:
        return None
    _save(mgr, done, par.get(state), report, hooks, {"wer": result["wer"], "cer": result["cer"]})
    return done


def _lag_of(config: settings.Settings, alphabet):
    """(audio, argmax path) -> the first word's lag after the speech onset (infer.delay.first_word_lag)."""
    fc = config.features
    frame_seconds = fc.hop * geometry.FIRST_CONV.strides[0] / fc.sample_rate
    return functools.partial(
        delay.first_word_lag, sample_rate=fc.sample_rate, alphabet=alphabet, frame_seconds=frame_seconds
    )


def _save_last(mgr, start: int, done: int, host_state, report: reporting.Reporter, hooks: faults.Hooks) -> None:
    """The last step's checkpoint (unless the loop saved it, or trained nothing), then every save
    finished, or its failure explained."""
    if done > start and mgr.latest_step() != done:
        _save(mgr, done, host_state, report, hooks)
    with report.suspended("the last checkpoint"):
        checkpoint.finish_or_explain(mgr)


def _check_device_memory(config: settings.Settings, par, state, source, kw: dict) -> memory.Estimate:
    """Refuses a batch whose step cannot fit the device, before anything compiles (memory.py);
    returns the estimate."""
    est = memory.estimate(
        loss_function,
        state,
        config.per_device_batch_size,
        source.shapes(),
        loss_arguments(kw),
        staged_batches=config.prefetch_batches + 1,
    )
    log.info("%s", memory.check(est, config.per_device_batch_size, memory.device_limit(par.devices[0])))
    return est


def _check_host_step_memory(config: settings.Settings, par, p_train, est, state, rng, source) -> Callable:
    """CPU, one process: compiles the step for the longest batch shape and refuses the batch when XLA's
    buffers and the convolution patches exceed the host's available memory (memory.py), before
    the first step allocates them. Returns the step, calling that executable for batches of its
    shape (no second compile); the step as it was where XLA gives no memory analysis."""
    samples, label_len = max(source.shapes())
    rows = config.per_device_batch_size  # a micro-batch's: the activations scale with it
    batch_rows = rows * config.optimizer.accumulate_steps * len(par.devices)
    spec = par.abstract_batch(memory.batch_spec(batch_rows, samples, label_len))
    log.info("compiling the train step for the longest batch shape (%d samples) to check its memory", samples)
    compiled = p_train.lower(state, spec, rng).compile()
    need = memory.compiled_need(compiled, len(par.devices))
    if need is None:
        return p_train
    log.info("%s", memory.check_compiled(need, est, rows, len(par.devices), memory.available_host_memory()))
    shapes = {k: v.shape for k, v in spec.items()}

    def step(state, batch, rng):
        if all(batch[k].shape == shape for k, shape in shapes.items()):
            return compiled(state, batch, rng)
        return p_train(state, batch, rng)

    return step


def _devices_and_data(config: settings.Settings):
    """(parallel.Parallel, its batch sharding, the source of this process's rows), logged and
    checked (the eval split, the host memory of the batches in flight) before anything is allocated."""
    determinism.check(config, jax.default_backend())
    log.info("compilation cache: %s", parallel.enable_compilation_cache(config.compilation_cache_dir) or "off")
    par = parallel.make(config)
    accumulate = config.optimizer.accumulate_steps
    sharding = par.batch_sharding(config.per_device_batch_size * accumulate)  # an update's rows
    log.info(
        "devices: %s x %d process(es), %s, global batch %d%s",
        parallel.devices_line(par.devices),
        jax.process_count(),
        par.kind,
        sharding.global_batch,
        f" ({accumulate} micro-batches of {config.per_device_batch_size} per device)" if accumulate > 1 else "",
    )
    cpu_note = parallel.cpu_warning(config, par.devices)
    if cpu_note:
        log.warning("%s", cpu_note)
    source = make_source(config, sharding)
    log.info("compiled batch shapes (samples, labels): %s", source.shapes())
    if config.eval_every_steps:
        source.check_eval_split(config.dataset.eval_split)
    memory.check_host_memory(
        config,
        sharding.local_batch,
        source.shapes(),
        config.prefetch_batches + 1 + loader.resolve_num_workers(config.dataset) * config.dataset.worker_buffer_size,
    )
    return par, sharding, source


def _initial_or_restored(
    config: settings.Settings, workdir: str, mgr, source, init_rng
) -> tuple[TrainState, settings.Settings]:
    """(the unreplicated initial state, or the newest checkpoint that restores into it (process 0
    moves damaged newer ones aside), or with config.init_from and no checkpoint yet the source's
    (finetune.py); the config, its init_from resolved to the source's 'ABS_WORKDIR:STEP')."""
    state = initial_state(config, source, init_rng)
    log.info("model parameters: %s", f"{model.count_params(state.params):,}")
    resilience.check_workdir(workdir, memory.tree_bytes(state))
    if mgr.all_steps():  # before the restore: another model's checkpoints are not "damaged"
        workdir_config.refuse_fixed_changes(config, workdir)
        workdir_config.refuse_ema_toggle(config, workdir)
    restored, _ = checkpoint.restore_latest(mgr, state, move_damaged=jax.process_index() == 0)
    if restored is not None:
        if config.init_from:
            log.info(
                "init_from=%r not used: %s has checkpoints of its own, the run resumes them", config.init_from, workdir
            )
        return restored.replace(apply_fn=state.apply_fn, tx=state.tx), config
    if config.init_from:
        state, resolved = finetune.initial_state(config, state)
        config = dataclasses.replace(config, init_from=resolved)  # config.json records the source
    return state, config


def _resume_notes(config: settings.Settings, workdir: str, start: int) -> list[tuple[str, object, object]]:
    """Warns when steps [start, num_train_steps) outrun the schedule; records (process 0) and
    returns the settings a resume changes (workdir_config.record_resume_changes)."""
    idle = idle_steps_warning(run_optimizer(config), start, config.num_train_steps)
    if idle:
        log.warning("%s", idle)
    # After the restore: a config its checkpoints don't fit never replaces the one they do;
    # a resume's changed settings are recorded beside it, not over it.
    return workdir_config.record_resume_changes(config, workdir, start) if jax.process_index() == 0 else []


def _save(
    mgr, step: int, host_state, report: reporting.Reporter, hooks: faults.Hooks, metrics: dict | None = None
) -> None:
    with report.suspended(f"checkpoint {step}"):  # waits for the previous save, then writes
        checkpoint.save_or_explain(mgr, step, host_state, metrics)
    hooks.checkpoint_started(step)


def _run_step(p_train, state, batch, rng, config: settings.Settings, first: bool):
    """One step; the first is waited for, so compile errors and OOM surface here, explained."""
    try:
        state, step_metrics = p_train(state, batch, rng)
        if first:
            jax.block_until_ready(step_metrics)
        return state, step_metrics
    except Exception as e:
        if errors.is_out_of_memory(e):
            shapes = {k: tuple(v.shape) for k, v in batch.items()}
            raise errors.out_of_memory(e, shapes, config) from e
        raise


def _stop_if_diverged(state, step: int, config: settings.Settings, mgr) -> None:
    """A FloatingPointError after optimizer.max_consecutive_skips non-finite steps in a row, naming
    the checkpoint to resume from (never a non-finite one: the step keeps none, the save refuses one)."""
    consecutive = reporting.first(state.consecutive_skips)
    if consecutive >= config.optimizer.max_consecutive_skips:
        raise FloatingPointError(
            f"{int(consecutive)} consecutive steps had a non-finite loss, gradient or update (up to step {step}); "
            f"training stopped; {checkpoint.newest_words(mgr)} (a non-finite state is never saved). Rerun "
            "with a lower optimizer.learning_rate, after checking the data, or raise "
            "optimizer.max_consecutive_skips"
        )
