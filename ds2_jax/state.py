"""The train state, its optimizer, the step's static arguments from the config, and the
state restored from a workdir's checkpoint.

What the training loop (train.py), evaluation and transcription share, below them all.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

from ds2_jax import checkpoint, errors, features, layout, model, settings
from ds2_jax.kernels import dispatch

log = logging.getLogger("ds2_jax")

INIT_FRAMES = 64  # Frames of the dummy input that shapes the parameters at init.


class TrainState(train_state.TrainState):
    batch_stats: Any = None
    feature_mean: jax.Array | None = None
    feature_std: jax.Array | None = None
    skipped_steps: jax.Array | None = None  # non-finite steps skipped in total
    consecutive_skips: jax.Array | None = None
    ema_params: Any = None  # the parameters' moving average (optimizer.ema_decay > 0), else None


def with_eval_weights(state: TrainState, ema: bool) -> TrainState:
    """`state` with the weights evaluation, transcription and export use: its EMA parameters when
    `ema` (eval.ema_weights) and it keeps them, else its own."""
    return state.replace(params=state.ema_params) if ema and state.ema_params is not None else state


def copy_tree(tree):
    """A copy of every array (an EMA starts as the parameters, in buffers of its own: a donated
    state may not hold one buffer twice)."""
    return jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), tree)


def run_optimizer(config: settings.Settings) -> settings.Optimizer:
    """config.optimizer as the run uses it: a cosine decay_steps of 0 written out as the steps from
    the warm-up's end to num_train_steps (so raising num_train_steps stretches the decay)."""
    opt = config.optimizer
    if opt.schedule == "cosine" and opt.decay_steps == 0:
        return dataclasses.replace(opt, decay_steps=max(config.num_train_steps - opt.warmup_steps, 1))
    return opt


def learning_rate_schedule(opt: settings.Optimizer) -> optax.Schedule:
    """Optional linear warm-up, then constant, cosine or exponential decay."""
    decay_steps = max(opt.decay_steps, 1)
    after = {  # the names: settings.SCHEDULES, checked there
        "constant": lambda: optax.constant_schedule(opt.learning_rate),
        "cosine": lambda: optax.cosine_decay_schedule(opt.learning_rate, decay_steps),
        "exponential": lambda: optax.exponential_decay(opt.learning_rate, decay_steps, opt.decay_rate),
    }[opt.schedule]()
    if opt.warmup_steps <= 0:
        return after
    warmup = optax.linear_schedule(0.0, opt.learning_rate, opt.warmup_steps)
    return optax.join_schedules([warmup, after], [opt.warmup_steps])


IDLE_FRACTION = 0.01  # a step below this fraction of optimizer.learning_rate barely trains


def schedule_end(opt: settings.Optimizer) -> tuple[int, int] | None:
    """(first step below IDLE_FRACTION of the peak rate, step from which the rate is 0) of a
    'cosine' schedule; None for the others (they never reach 0)."""
    if opt.schedule != "cosine":
        return None
    warmup, decay = max(opt.warmup_steps, 0), max(opt.decay_steps, 1)
    low = warmup + math.ceil(decay * math.acos(2 * IDLE_FRACTION - 1) / math.pi)  # 0.5 (1 + cos) < fraction
    return low, warmup + decay


def idle_steps_warning(opt: settings.Optimizer, start: int, stop: int) -> str | None:
    """What to change when steps [start, stop) would train past the schedule's end: some at
    learning rate 0, or most of them below 1% of it (they would hardly change the model);
    None otherwise (a schedule's own tail is not warned about)."""
    ends = schedule_end(opt)
    if ends is None:
        return None
    low, end = ends
    idle = stop - max(start, low)
    if stop <= end and 2 * idle <= stop - start:
        return None
    first = max(start, low) + 1  # counted as the log counts them: step n is the n-th finished
    warmup = max(opt.warmup_steps, 0)
    stretched = math.ceil((stop - warmup) * math.pi / math.acos(2 * IDLE_FRACTION - 1))  # low == stop
    return (
        f"steps {first}-{stop} will train at under {IDLE_FRACTION:.0%} of optimizer.learning_rate (0 from step "
        f"{end}): optimizer.schedule='cosine' ends at step {end} (optimizer.warmup_steps={opt.warmup_steps} + "
        f"optimizer.decay_steps={opt.decay_steps}). To train further, stretch the schedule: "
        f"--config.optimizer.decay_steps={stretched} or more, or 0 to decay to num_train_steps (the rate rises "
        "again from this step on), or use "
        "--config.optimizer.schedule=constant"
    )


def make_optimizer(opt: settings.Optimizer, frozen: tuple[str, ...] = ()) -> optax.GradientTransformation:
    """Adam after clipping by global norm (Paddle's gradient_clipping_threshold); the parameters
    `frozen` names (config.freeze, see `frozen_labels`) get zero updates (optax.multi_transform)
    and no Adam state, and the clipping norm is the trained parameters' alone."""
    adam = optax.chain(
        optax.clip_by_global_norm(opt.clip_global_norm),
        optax.adam(learning_rate_schedule(opt), b1=opt.b1, b2=opt.b2, eps=opt.eps),
    )
    if not frozen:
        return adam
    return optax.multi_transform(
        {"trained": adam, "frozen": optax.set_to_zero()}, lambda params: frozen_labels(params, frozen)
    )


def freeze_names(freeze: str) -> tuple[str, ...]:
    """config.freeze ('ConvBlock, RNNLayer_0') as a tuple of names."""
    return tuple(n.strip().strip("/") for n in freeze.split(",") if n.strip())


def _frozen_by(path: str, name: str) -> bool:
    """Whether parameter `path` ('RNNLayer_0/recurrent_kernel') is frozen by `name`: the path itself, a
    prefix of it ending at a '/', or a module family ('ConvBlock' for ConvBlock_0, ConvBlock_1...)."""
    top = path.split("/")[0]
    return (
        path == name
        or path.startswith(name + "/")
        or (top.rpartition("_")[0] == name and top.rpartition("_")[2].isdigit())
    )


def frozen_labels(params, frozen: tuple[str, ...]):
    """params' tree of 'frozen' / 'trained' labels (optax.multi_transform's); a name that freezes
    no parameter is a ValueError naming the model's modules."""
    paths = {
        jax.tree_util.keystr(k, simple=True, separator="/"): None
        for k, _ in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    unused = [n for n in frozen if not any(_frozen_by(p, n) for p in paths)]
    if unused:
        modules = sorted({p.split("/")[0] for p in paths})
        raise ValueError(
            f"freeze={','.join(frozen)!r}: {', '.join(unused)} names no parameter of this model; its "
            f"modules are {modules} (a name freezes a module, its family like 'ConvBlock', or a path "
            "like 'RNNLayer_0/recurrent_kernel')"
        )
    return jax.tree_util.tree_map_with_path(
        lambda k, _: (
            "frozen"
            if any(_frozen_by(jax.tree_util.keystr(k, simple=True, separator="/"), n) for n in frozen)
            else "trained"
        ),
        params,
    )


@functools.lru_cache(maxsize=8)
def _compiled_init(cfg: model.ModelConfig):
    """rng -> the variables of `cfg`'s model, compiled once per architecture in a process: every
    run's start and every checkpoint restore's template (an evaluation, a fine-tune's source, a
    transcribe) initialises one, and the compile is most of it (~3 s on a CPU core)."""
    net = model.DeepSpeech2(cfg)
    frames = INIT_FRAMES
    return jax.jit(lambda r: net.init(r, jnp.zeros((1, frames, cfg.num_bins)), jnp.array([frames]), train=False))


def create_state(
    config: settings.Settings, rng: jax.Array, feature_mean: np.ndarray, feature_std: np.ndarray
) -> TrainState:
    """Initial (unreplicated) state: parameters, batch-norm statistics, optimizer state."""
    cfg = model.ModelConfig.of(config.model, num_bins=len(feature_mean))
    with dispatch.unlogged():  # one dummy row: not the kernel choice training makes
        variables = _compiled_init(cfg)(rng)
    return TrainState.create(
        apply_fn=model.DeepSpeech2(cfg).apply,
        params=variables["params"],
        tx=make_optimizer(run_optimizer(config), freeze_names(config.freeze)),
        batch_stats=variables["batch_stats"],
        feature_mean=jnp.asarray(feature_mean, jnp.float32),
        feature_std=jnp.asarray(feature_std, jnp.float32),
        skipped_steps=jnp.zeros((), jnp.int32),
        consecutive_skips=jnp.zeros((), jnp.int32),
        ema_params=copy_tree(variables["params"]) if config.optimizer.ema_decay > 0 else None,
    )


def initial_state(config: settings.Settings, source, rng: jax.Array) -> TrainState:
    mean, std = source.feature_stats(features.spectrogram_stats)
    return create_state(config, rng, mean, std)


def step_kwargs(config: settings.Settings) -> dict:
    """The fixed (static) arguments of train_step, derived from the settings."""
    return dict(
        model_cfg=model.ModelConfig.of(config.model),
        feature_cfg=config.features.spectrogram,
        augment=config.features.augment,
        norm_by_times=config.loss.norm_by_times,
        ctc_impl=config.loss.ctc_impl,  # 'auto': kernels.dispatch.ctc_impl, where the loss runs
        learning_rate_fn=learning_rate_schedule(run_optimizer(config)),
        accumulate_steps=config.optimizer.accumulate_steps,
        ema_decay=config.optimizer.ema_decay,
    )


# step_kwargs that train.loss_function does not take
STEP_ONLY = ("learning_rate_fn", "accumulate_steps", "ema_decay")


def loss_arguments(kw: dict) -> dict:
    """step_kwargs' arguments of train.loss_function."""
    return {k: v for k, v in kw.items() if k not in STEP_ONLY}


BEST = "best"  # a step argument naming the checkpoint of the lowest in-training eval WER


def restore_state(config: settings.Settings, workdir: str, step: int | str | None = None) -> tuple[TrainState, int]:
    """(unreplicated state, step) of checkpoint `step` (default: latest; 'best': the lowest
    in-training eval WER, checkpoint.best) of `workdir`; its params are the EMA's where it keeps
    one and config.eval.ema_weights (`with_eval_weights`).

    The template's feature statistics are placeholders: the checkpoint's replace them,
    so no dataset is needed.
    """
    num_bins = config.features.num_bins
    template = create_state(
        config, jax.random.PRNGKey(0), np.zeros(num_bins, np.float32), np.ones(num_bins, np.float32)
    )
    mgr = checkpoint.manager(workdir, config.keep_checkpoints)
    if step == BEST:
        step = best_step(mgr, workdir)
    if step is None:
        writing = checkpoint.wait_for_saves(mgr)  # a training run writing into this workdir now
        state, step = checkpoint.restore_latest(mgr, template)  # skips a damaged or unfinished newest one
        if state is None and writing:
            raise checkpoint.still_being_written(mgr, writing)
        if state is None:
            raise FileNotFoundError(f"no checkpoint in {os.path.join(workdir, layout.CHECKPOINTS)}: train first")
        if writing:
            log.warning(
                "checkpoint %d in %s is still being written: using checkpoint %d, the newest finished",
                writing[0],
                mgr.directory,
                step,
            )
    elif step in mgr.all_steps():
        if (missing := checkpoint.unfinished(mgr, step)) is not None:
            raise errors.CheckpointError(
                f"checkpoint {step} in {mgr.directory} was never finished (no {missing}): "
                "a training run may be writing it now (wait for it), or a save was cut "
                f"short; or choose another step of {sorted(mgr.all_steps())}"
            )
        try:
            state = mgr.restore(step, args=checkpoint.ocp.args.StandardRestore(template))
        except Exception as e:  # noqa: BLE001  (orbax raises many types)
            raise errors.CheckpointError(
                f"checkpoint {step} in {mgr.directory} does not restore into this model "
                f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); if the model settings differ from "
                f"{os.path.join(workdir, layout.CONFIG)}, use those, or choose another step"
            ) from e
        if (bad := checkpoint.non_finite(state)) is not None:
            raise errors.CheckpointError(
                f"checkpoint {step} in {mgr.directory} is not finite (NaN or inf in {bad}): "
                f"choose another step of {sorted(mgr.all_steps())}"
            )
    else:
        raise FileNotFoundError(f"no checkpoint at step {step} in {mgr.directory} (it has {sorted(mgr.all_steps())})")
    state = with_eval_weights(state.replace(apply_fn=template.apply_fn, tx=template.tx), config.eval.ema_weights)
    return state, int(step)


def best_step(mgr, workdir: str) -> int:
    """The step of `workdir`'s checkpoint with the lowest in-training eval WER; a FileNotFoundError
    saying how to get one when no checkpoint was saved with its WER."""
    found = checkpoint.best(mgr)
    if found is None:
        raise FileNotFoundError(
            f"no checkpoint in {mgr.directory} was saved with an eval WER (it has "
            f"{sorted(mgr.all_steps())}), so none is 'best': train with "
            "--config.keep_best_checkpoints=N (and eval_every_steps > 0), or name a step"
        )
    return found[0]
