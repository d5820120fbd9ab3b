"""Weight EMA (optimizer.ema_decay): the train state's moving average of the parameters moves by
its rule after each update and never after a skipped one, is checkpointed and resumed exactly,
and is what eval (in training and --mode=eval), transcribe and export use unless told otherwise
(eval.ema_weights, --noema_weights)."""

import functools
import json
import os

import jax
import numpy as np
import pytest

from ds2_jax import evaluation, settings, train
from ds2_jax import state as state_lib
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import make_source
from tests.helpers import tiny_settings

SMALL = {
    "model.rnn_size": 16,
    "dataset.synthetic_min_duration_s": 0.4,
    "dataset.synthetic_max_duration_s": 0.6,
    "dataset.synthetic_pool_size": 8,
    "dataset.feature_stats_utterances": 8,
    "per_device_batch_size": 2,
    "num_devices": 1,
    "optimizer.learning_rate": 1e-2,
}


BOTH = (True, False)


def leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def ema_settings(**more):
    return tiny_settings(**{**SMALL, "optimizer.ema_decay": 0.5, **more})


@pytest.fixture(scope="module")
def step_setup():
    config = ema_settings()
    source = make_source(config, Sharding(2))
    state = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
    step = jax.jit(functools.partial(train.train_step, **state_lib.step_kwargs(config), axis_name=None))
    return config, state, source.train_batch(0), step


def test_the_average_starts_at_the_parameters_and_moves_by_its_warmed_up_decay(step_setup):
    """After n updates the decay is min(0.5, (1 + n) / (10 + n)): 0.1, 0.182, ..., then 0.5 from n = 8."""
    _, state, batch, step = step_setup
    for a, b in zip(leaves(state.ema_params), leaves(state.params)):
        np.testing.assert_array_equal(a, b)
    ema = leaves(state.ema_params)
    for n in range(10):
        state, m = step(state, batch, jax.random.PRNGKey(1))
        assert float(m["finite_steps"]) == 1
        d = min(0.5, (1 + n) / (10 + n))
        ema = [d * e + (1 - d) * p for e, p in zip(ema, leaves(state.params))]
        for got, want in zip(leaves(state.ema_params), ema):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert max(np.abs(a - b).max() for a, b in zip(leaves(state.ema_params), leaves(state.params))) > 1e-4


def test_a_skipped_step_leaves_the_average_where_it_was(step_setup):
    _, state, batch, step = step_setup
    poisoned = state.replace(feature_std=state.feature_std.at[0].set(0.0))  # inf features: NaN loss
    new, m = step(poisoned, batch, jax.random.PRNGKey(1))
    assert float(m["finite_steps"]) == 0
    for a, b in zip(leaves(new.ema_params), leaves(state.ema_params)):
        np.testing.assert_array_equal(a, b)


def test_off_keeps_no_average_and_the_setting_reaches_the_step():
    assert state_lib.step_kwargs(tiny_settings())["ema_decay"] == 0.0
    assert state_lib.step_kwargs(ema_settings())["ema_decay"] == 0.5
    config = tiny_settings(**SMALL)
    source = make_source(config, Sharding(2))
    assert state_lib.initial_state(config, source, jax.random.PRNGKey(0)).ema_params is None
    with pytest.raises(ValueError, match="optimizer.ema_decay=1.0"):
        ema_settings(**{"optimizer.ema_decay": 1.0})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(config, a 4-step run with an eval at step 4, a 2-step run resumed to 4)."""
    root = tmp_path_factory.mktemp("ema")
    config = ema_settings(**{"num_train_steps": 4, "eval_every_steps": 4, "eval.max_utterances": 4})
    straight, resumed = str(root / "straight"), str(root / "resumed")
    train.train_and_evaluate(config, straight)
    train.train_and_evaluate(settings.override(config, {"num_train_steps": 2, "eval_every_steps": 0}), resumed)
    train.train_and_evaluate(config, resumed)
    return config, straight, resumed


@pytest.mark.slow
def test_the_average_is_checkpointed_and_resumed_exactly(runs):
    config, straight, resumed = runs
    trained = settings.choosing_weights(config, False)
    a, _ = state_lib.restore_state(trained, straight)
    b, _ = state_lib.restore_state(trained, resumed)
    for part in ("ema_params", "params"):
        for x, y in zip(leaves(getattr(a, part)), leaves(getattr(b, part))):
            np.testing.assert_array_equal(x, y, err_msg=part)


def test_eval_transcribe_and_export_take_the_average_unless_told_not_to(runs):
    """restore_state (eval, transcribe's engine, export, fine-tuning) gives the EMA as params by default;
    --noema_weights (eval.ema_weights=False) the trained ones; the in-training eval scored the EMA."""
    from ds2_jax.infer import load as infer

    config, straight, _ = runs
    ema, _ = state_lib.restore_state(config, straight)
    raw, _ = state_lib.restore_state(settings.choosing_weights(config, False), straight)
    for x, y in zip(leaves(ema.params), leaves(raw.ema_params)):
        np.testing.assert_array_equal(x, y)
    assert max(np.abs(x - y).max() for x, y in zip(leaves(ema.params), leaves(raw.params))) > 1e-5
    for flag, want in ((True, raw.ema_params), (False, raw.params)):
        t = infer.open_engine(workdir=straight, config=settings.choosing_weights(config, flag))
        for x, y in zip(leaves(t.state.params), leaves(want)):
            np.testing.assert_array_equal(x, y)
    in_training = [json.loads(r) for r in open(os.path.join(straight, "metrics.jsonl"))]
    loss = next(r["eval_loss"] for r in in_training if "eval_loss" in r)
    split, choose = config.dataset.eval_split, settings.choosing_weights
    scored = {f: evaluation.evaluate_splits(choose(config, f), straight)[split]["loss"] for f in BOTH}
    assert loss == pytest.approx(scored[True], rel=1e-5) and loss != pytest.approx(scored[False], rel=1e-5)


@pytest.mark.slow
def test_a_resume_cannot_turn_the_average_on_or_off(runs, tmp_path):
    config, straight, _ = runs
    off = settings.override(config, {"optimizer.ema_decay": 0.0, "num_train_steps": 6})
    with pytest.raises(ValueError, match="cannot turn the weight EMA off"):
        train.train_and_evaluate(off, straight)
    changed = settings.override(config, {"optimizer.ema_decay": 0.9, "num_train_steps": 5, "eval_every_steps": 0})
    assert int(train.train_and_evaluate(changed, straight).step) == 5  # another decay resumes
