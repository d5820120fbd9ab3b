"""The pure train step, at the level of gradients: 1 and 8 devices compute the global
gradient, padding length changes nothing, a non-finite step changes nothing.

The batch (16 rows) has a different number of feasible utterances on each of the 8
devices: rows made infeasible (3 output frames for 7+ labels) and padding rows (weight 0).
The reference gradient is computed here from the model and optax's CTC directly, as the
mean over the feasible rows, so a step that miscounts or misreduces cannot match it.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ds2_jax import ctc, features, model, parallel, settings, train
from ds2_jax import state as state_lib
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import make_source
from tests.helpers import quick_compiled, tiny_settings

INFEASIBLE = [3, 4, 5, 10]  # devices (2 rows each) hold 2, 1, 0, 1, 2, 0, 2, 2 feasible rows
PADDING = [7, 11]
FEASIBLE = sorted(set(range(16)) - set(INFEASIBLE) - set(PADDING))


def leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


@pytest.fixture(scope="module")
def setup():
    """(config, initial state, the 16-row batch)."""
    config = tiny_settings(
        per_device_batch_size=2,
        **{
            "model.rnn_size": 16,
            "model.num_conv_layers": 1,  # one conv block (and its batch norm): every step here compiles sooner
            "dataset.synthetic_min_duration_s": 0.4,
            "dataset.synthetic_max_duration_s": 0.6,
        },
    )
    source = make_source(config, Sharding(16))
    batch = {k: v.copy() for k, v in source.train_batch(0).items()}
    for i in INFEASIBLE:  # 1600 samples: 9 frames, 3 output frames, fewer than the labels
        assert batch["label_lengths"][i] > 3
        batch["audio_lengths"][i] = 1600
        batch["audio"][i, 1600:] = 0
    for i in PADDING:  # as pipeline.batch.pad_batch leaves an unused row
        for k in batch:
            batch[k][i] = 0
    state = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
    return config, state, batch


@pytest.fixture(scope="module")
def reference(setup):
    """(loss, gradient) of the feasible rows' mean loss."""
    return reference_loss_and_grads(*setup)


def with_sgd(state, lr=1.0):
    """The state with SGD: new params = params - lr * (the gradient the step used). With momentum,
    whose first step is that too, so that the optimizer has a state (its trace) a skipped step
    must keep: the NaN-gradient test runs it, a shorter compile than the configured Adam's."""
    tx = optax.sgd(lr, momentum=0.9)
    return state.replace(tx=tx, opt_state=tx.init(state.params))


_COMPILED: dict = {}


def run_step(config, state, batch, num_devices, cache=True):
    """One train step through parallel.Parallel on `num_devices` (fake CPU) devices; the
    compiled step is kept for the next call with the same settings."""
    config = settings.override(
        config, {"num_devices": num_devices, "per_device_batch_size": batch["audio"].shape[0] // num_devices}
    )
    par = parallel.make(config)
    args = (par.put_replicated(state), par.put_batch(batch), par.put_replicated(jax.random.PRNGKey(1)))
    # the settings, the state's structure (its optimizer) and the shapes: what the program depends on
    key = (config, jax.tree_util.tree_structure(args), tuple(x.shape for x in jax.tree_util.tree_leaves(args)))
    step = _COMPILED.get(key) if cache else None
    if step is None:
        step = quick_compiled(par.compile(train.train_step, state_lib.step_kwargs(config), donate=False), *args)
        if cache:
            _COMPILED[key] = step
    new, m = step(*args)
    return par.get(new), par.get(m)


def reference_loss_and_grads(config, state, batch):
    """Mean CTC loss over the FEASIBLE rows and its gradient, without train.train_step."""
    net = model.DeepSpeech2(model.ModelConfig.of(config.model))
    feats, frames = features.featurize(
        jnp.asarray(batch["audio"]),
        jnp.asarray(batch["audio_lengths"]),
        state.feature_mean,
        state.feature_std,
        config.features.spectrogram,
    )
    rows = np.zeros(16, bool)
    rows[FEASIBLE] = True

    def loss(params):
        (logits, out_len), _ = net.apply(
            {"params": params, "batch_stats": state.batch_stats}, feats, frames, train=True, mutable=["batch_stats"]
        )
        per = optax.ctc_loss(
            logits,
            ctc.paddings(out_len, logits.shape[1]),
            jnp.asarray(batch["labels"]),
            ctc.paddings(jnp.asarray(batch["label_lengths"]), batch["labels"].shape[1]),
        )
        return jnp.sum(jnp.where(rows, per, 0.0)) / len(FEASIBLE)

    return quick_compiled(jax.jit(jax.value_and_grad(loss)), state.params)(state.params)


def assert_trees_close(a, b, rtol=2e-5):
    for x, y in zip(leaves(a), leaves(b)):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * max(np.abs(y).max(), 1e-6))


@pytest.mark.slow  # 15 s or more on 2 cores (2026-12-06 durations): make test runs it, test-fast does not
def test_sgd_step_applies_the_global_mean_gradient_on_one_and_eight_devices(setup, reference):
    config, state, batch = setup
    sgd = with_sgd(state)
    ref_loss, ref_grads = reference
    for n in (1, 8):
        new, m = run_step(config, sgd, batch, n)
        grads = jax.tree_util.tree_map(lambda old, new: old - new, sgd.params, new.params)
        assert_trees_close(grads, ref_grads)
        assert float(m["loss_count"]) == len(FEASIBLE)
        assert float(m["infeasible"]) == len(INFEASIBLE)
        assert float(m["utterances"]) == 16 - len(PADDING)
        assert float(m["untrainable"]) == 0
        np.testing.assert_allclose(float(m["loss_sum"]) / float(m["loss_count"]), float(ref_loss), rtol=1e-5)
        np.testing.assert_allclose(float(m["grad_norm_sum"]), float(optax.global_norm(ref_grads)), rtol=1e-5)


def test_a_step_without_a_trainable_utterance_is_marked_untrainable(setup):
    """Every row infeasible or padding: loss_count 0 and `untrainable` 1, which the log reports as no loss."""
    config, state, batch = setup
    none = dict(batch, weights=np.zeros_like(batch["weights"]))
    _, m = run_step(config, with_sgd(state), none, 1)
    assert float(m["loss_count"]) == 0 and float(m["untrainable"]) == 1


@pytest.mark.slow  # 15 s or more on 2 cores (2026-12-06 durations): make test runs it, test-fast does not
def test_adam_step_on_eight_devices_is_the_optimizer_applied_to_the_global_gradient(setup, reference):
    """The configured optimizer (clip + Adam): moments and parameters are those of the
    reference gradient, so a uniform gradient scale (which Adam's update hides) cannot pass."""
    config, state, batch = setup
    new, m = run_step(config, state, batch, 8)
    _, ref_grads = reference
    updates, opt_state = state.tx.update(ref_grads, state.opt_state, state.params)
    np.testing.assert_allclose(float(m["grad_norm_sum"]), float(optax.global_norm(ref_grads)), rtol=1e-5)
    assert_trees_close(new.opt_state, opt_state)  # Adam's mu = (1 - b1) g, nu = (1 - b2) g^2
    assert_trees_close(new.params, optax.apply_updates(state.params, updates))


def pad_frames(batch, extra_frames):
    """The same utterances in a batch `extra_frames` frames (of 160 samples) longer."""
    out = dict(batch)
    out["audio"] = np.pad(batch["audio"], [(0, 0), (0, extra_frames * 160)])
    return out


def test_padding_length_changes_nothing_in_train_mode(setup):
    """Logits, batch-norm statistics and gradients of a batch padded to T and T + 40 frames."""
    config, state, batch = setup
    longer = pad_frames(batch, 40)
    kw = state_lib.step_kwargs(config)
    net = model.DeepSpeech2(kw["model_cfg"])

    @jax.jit
    def forward(b):
        feats, frames = train.features_of(state, b, kw["feature_cfg"])
        (logits, out_len), upd = net.apply(
            {"params": state.params, "batch_stats": state.batch_stats},
            feats,
            frames,
            train=True,
            mutable=["batch_stats"],
        )
        return logits, out_len, upd["batch_stats"]

    outs = [jax.device_get(quick_compiled(forward, b)(b)) for b in (batch, longer)]
    (la, na, sa), (lb, nb, sb) = outs
    assert lb.shape[1] > la.shape[1]
    np.testing.assert_array_equal(na, nb)
    valid = np.arange(la.shape[1])[None, :] < na[:, None]
    np.testing.assert_allclose(lb[:, : la.shape[1]][valid], la[valid], rtol=1e-5, atol=1e-5)
    assert_trees_close(sb, sa)

    sgd = with_sgd(state)
    new_a, ma = run_step(config, sgd, batch, 8)
    new_b, mb = run_step(config, sgd, longer, 8)
    np.testing.assert_allclose(float(mb["loss_sum"]), float(ma["loss_sum"]), rtol=1e-5)
    assert_trees_close(new_b.params, new_a.params)  # SGD: the same gradient
    assert_trees_close(new_b.batch_stats, new_a.batch_stats)
    assert_trees_close(new_a.batch_stats, sa)  # the step stores what the model computed


@functools.partial(jax.custom_vjp)
def _nan_cotangent(x):
    return x


_nan_cotangent.defvjp(lambda x: (x, None), lambda _, g: (jnp.full_like(g, jnp.nan),))


def assert_state_kept(new, old):
    for part in ("params", "opt_state", "batch_stats"):
        for a, b in zip(leaves(getattr(new, part)), leaves(getattr(old, part))):
            np.testing.assert_array_equal(a, b, err_msg=part)
    assert int(new.skipped_steps) == int(old.skipped_steps) + 1
    assert int(new.consecutive_skips) == int(old.consecutive_skips) + 1
    assert int(new.step) == int(old.step) + 1


def test_step_with_nan_loss_keeps_params_optimizer_and_batch_stats(setup):
    config, state, batch = setup
    poisoned = state.replace(feature_std=state.feature_std.at[0].set(0.0))  # inf features: NaN loss
    new, m = run_step(config, poisoned, batch, 8)
    assert float(m["finite_steps"]) == 0 and float(m["grad_norm_sum"]) == 0
    assert float(m["loss_sum"]) == float(m["loss_count"]) == 0  # a skipped step adds nothing to the mean loss
    assert_state_kept(new, poisoned)


@pytest.mark.slow
def test_step_with_finite_loss_but_nan_gradient_keeps_everything(setup, monkeypatch):
    """The loss is finite and only the gradient is NaN: the step must look at the gradient too."""
    config, state, batch = setup
    state = with_sgd(state)
    real = ctc.per_utterance_loss
    monkeypatch.setattr(ctc, "per_utterance_loss", lambda logits, *a, **k: real(_nan_cotangent(logits), *a, **k))
    new, m = run_step(config, state, batch, 8, cache=False)
    assert float(m["finite_steps"]) == 0 and float(m["loss_sum"]) == float(m["loss_count"]) == 0
    assert_state_kept(new, state)
    monkeypatch.undo()
    good, m = run_step(config, new, batch, 8)  # the kept state trains on normally
    assert float(m["finite_steps"]) == 1 and int(good.consecutive_skips) == 0 and int(good.skipped_steps) == 1
    assert all(np.isfinite(x).all() for x in leaves(good.params))


def _poisoned_state() -> optax.GradientTransformation:
    """SGD whose own state turns NaN while its updates stay finite."""

    def update(updates, state, params=None):
        return jax.tree_util.tree_map(lambda g: -1e-3 * g, updates), jnp.full_like(state, jnp.nan)

    return optax.GradientTransformation(lambda params: jnp.zeros(()), update)


@pytest.mark.parametrize(
    "tx",
    [
        # bias correction 1 - b2**t = 0: NaN updates from a finite state and gradient, as a NaN rate gives
        pytest.param(lambda: optax.adam(1e-3, b2=1.0), id="b2_of_1"),
        pytest.param(_poisoned_state, id="nan_optimizer_state"),
    ],
)
def test_step_whose_new_parameters_or_optimizer_state_are_not_finite_keeps_the_old_state(setup, tx):
    """issue 40: loss and gradient finite, the update not (a bad rate, eps or b2 reaching the
    optimizer by any path, or its state): the step is skipped like a NaN loss, never applied."""
    config, state, batch = setup
    start = state.replace(tx=tx())
    start = start.replace(opt_state=start.tx.init(start.params))
    new, m = run_step(config, start, batch, 8, cache=False)
    assert float(m["finite_steps"]) == 0 and float(m["loss_sum"]) == float(m["loss_count"]) == 0
    assert_state_kept(new, start)
    assert all(np.isfinite(x).all() for x in leaves((new.params, new.opt_state)))


def test_learning_rate_warms_up_linearly_from_zero_then_decays():
    opt = tiny_settings(
        **{
            "optimizer.learning_rate": 1e-3,
            "optimizer.warmup_steps": 10,
            "optimizer.decay_steps": 100,
            "optimizer.schedule": "exponential",
            "optimizer.decay_rate": 0.5,
        }
    ).optimizer
    lr = state_lib.learning_rate_schedule(opt)
    np.testing.assert_allclose([lr(0), lr(5), lr(10), lr(110), lr(210)], [0, 5e-4, 1e-3, 5e-4, 2.5e-4], rtol=1e-6)
    cosine = state_lib.learning_rate_schedule(dataclasses.replace(opt, schedule="cosine"))
    np.testing.assert_allclose([cosine(10), cosine(60), cosine(110)], [1e-3, 5e-4, 0.0], atol=1e-9)


def test_steps_past_a_cosine_schedule_are_announced_with_the_decay_steps_that_stretch_it():
    """The demo's schedule (warm-up 30, cosine over 400): its own run is quiet; resuming it to 430 or
    480 would train at a rate of (nearly) 0, and the advised decay_steps makes every step train."""
    opt = tiny_settings(
        **{
            "optimizer.learning_rate": 2e-3,
            "optimizer.warmup_steps": 30,
            "optimizer.decay_steps": 400,
            "optimizer.schedule": "cosine",
        }
    ).optimizer
    lr = state_lib.learning_rate_schedule(opt)
    assert state_lib.idle_steps_warning(opt, 0, 400) is None and state_lib.idle_steps_warning(opt, 0, 430) is None
    for stop in (430, 480):
        message = state_lib.idle_steps_warning(opt, 400, stop)
        assert message.startswith(
            f"steps 406-{stop} will train at under 1% of optimizer.learning_rate (0 from step 430)"
        )
        assert float(lr(404)) >= 0.01 * 2e-3 > float(lr(405))  # step 406 is the first below 1%
        advised = int(message.split("--config.optimizer.decay_steps=")[1].split()[0])
        stretched = dataclasses.replace(opt, decay_steps=advised)
        assert state_lib.idle_steps_warning(stretched, 400, stop) is None
        assert float(state_lib.learning_rate_schedule(stretched)(stop - 1)) >= 0.01 * 2e-3
    never = dataclasses.replace(opt, schedule="exponential")  # never reaches 0
    assert state_lib.idle_steps_warning(never, 400, 100_000) is None


def test_optimizer_clips_the_global_gradient_norm_before_adam():
    opt = tiny_settings(**{"optimizer.clip_global_norm": 1.0}).optimizer
    tx = state_lib.make_optimizer(opt)
    params = {"a": jnp.zeros(3), "b": jnp.zeros(())}
    grads = {"a": jnp.array([30.0, 0.0, 40.0]), "b": jnp.array(0.0)}  # global norm 50
    _, state = tx.update(grads, tx.init(params), params)
    mu = optax.tree_utils.tree_get(state, "mu")  # (1 - b1) * the clipped gradient
    np.testing.assert_allclose(mu["a"], (1 - opt.b1) * np.array([0.6, 0.0, 0.8]), rtol=1e-6)


@pytest.mark.slow  # 15 s or more on 2 cores (2026-12-06 durations): make test runs it, test-fast does not
def test_spec_augment_draws_differ_by_step_and_by_device_and_repeat_for_the_same_step(setup):
    """The step's masks come from (rng, state.step, device index): the same step masks alike
    (a resumed run repeats them), the next step otherwise; the same rows on device 0 and on
    device 1 are masked differently. (The loss depends on the step number through the masks
    only: the learning rate acts on the update, after it.) One compiled step on two devices:
    the rows on one device, padding rows (weight 0, no frames) on the other, which add nothing
    to the loss or the batch-norm sums, so a step that ignored the device index would give
    both placements the same loss, bit for bit."""
    config, state, batch = setup
    config = settings.override(
        config, {"features.freq_masks": 2, "features.time_masks": 2, "features.time_mask_max_fraction": 0.2}
    )
    rows = {k: v[:2] for k, v in batch.items()}  # two feasible rows
    padding = {k: np.zeros_like(v) for k, v in rows.items()}

    def loss(s, first, second):
        placed = {k: np.concatenate([first[k], second[k]]) for k in rows}
        _, m = run_step(config, state.replace(step=jnp.asarray(s, jnp.int32)), placed, 2)
        assert float(m["loss_count"]) == 2
        return float(m["loss_sum"])

    on_0 = [loss(s, rows, padding) for s in (0, 1, 2, 0)]
    assert on_0[0] == on_0[3]  # the same step: the same draws
    assert len(set(on_0[:3])) == 3, on_0  # each step its own
    assert loss(0, padding, rows) != on_0[0]  # device 1 draws other masks for the same rows at the same step
