"""The train step and loop: device-count invariance, eager == compiled, overfitting,
checkpoint round trip and exact resume."""

import dataclasses
import functools
import os

import jax
import numpy as np
import pytest
from flax import jax_utils

from ds2_jax import checkpoint, metrics, parallel, train
from ds2_jax import state as state_lib
from ds2_jax.pipeline.batch import Sharding, shard_for_devices
from ds2_jax.pipeline.source import make_source
from tests.helpers import tiny_config, tiny_settings, write_noise


def losses(workdir):
    return [r.get("loss", r.get("eval_loss")) for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))]


def leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def waveform_augmentation(tmp_path) -> dict:
    """config.waveform with every part but reverberation on for half the utterances."""
    return {
        "waveform.noise_dir": write_noise(tmp_path / "noise"),
        "waveform.noise_prob": 0.5,
        "waveform.speed_prob": 0.5,
        "waveform.gain_prob": 0.5,
    }


@pytest.mark.slow  # 15 s or more on 2 cores (2026-12-06 durations): make test runs it, test-fast does not
def test_one_and_eight_devices_give_the_same_losses(tmp_path):
    """With waveform augmentation on: its draws are the global row's, not the device's."""
    common = {
        "num_train_steps": 5,
        "log_every_steps": 1,
        "eval_every_steps": 0,
        "checkpoint_every_steps": 100,
        **waveform_augmentation(tmp_path),
    }
    one = tiny_config(**common, num_devices=1, per_device_batch_size=16)
    eight = tiny_config(**common, num_devices=8, per_device_batch_size=2)
    s1 = train.train_and_evaluate(one, str(tmp_path / "one"))
    s8 = train.train_and_evaluate(eight, str(tmp_path / "eight"))
    l1, l8 = losses(tmp_path / "one"), losses(tmp_path / "eight")
    assert len(l1) == len(l8) == 5
    np.testing.assert_allclose(l8, l1, rtol=1e-5)
    for a, b in zip(leaves(s1.params), leaves(s8.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def _one_step(config, state, batch):
    step = train.compile_train_step(config)
    rng = jax.random.PRNGKey(1)
    if config.compile:
        devices = jax.local_devices()[:1]
        new_state, m = step(
            jax_utils.replicate(state, devices, axis_name=train.AXIS),
            shard_for_devices(batch, 1),
            jax_utils.replicate(rng, devices),
        )
        return parallel.unreplicate(new_state), parallel.unreplicate(m)
    return step(state, batch, rng)


@pytest.mark.slow  # 15-60 s on 2 idle cores (2026-12-05): make test runs it, test-fast does not
def test_compiled_and_eager_step_agree():
    # Short utterances: the eager step runs every time step of the RNN and CTC op by op. One conv
    # block: eager compiles each distinct op and shape on its own, and a second conv block adds its
    # forward, backward and optimizer ops (the conv count is not the question here).
    config = tiny_settings(
        per_device_batch_size=4,
        **{
            "dataset.synthetic_min_duration_s": 0.3,
            "dataset.synthetic_max_duration_s": 0.4,
            "model.num_conv_layers": 1,
        },
    )
    source = make_source(config, Sharding(4))
    batch = source.train_batch(0)
    state = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
    compiled, m_c = _one_step(config, state, batch)
    config = dataclasses.replace(config, compile=False)
    eager, m_e = _one_step(config, state, batch)
    np.testing.assert_allclose(float(m_e["loss_sum"]), float(m_c["loss_sum"]), rtol=1e-5)
    for a, b in zip(leaves(compiled.params), leaves(eager.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


# The settings of the one-device jit steps below: one program, compiled once (the compilation cache).
FIXED_BATCH = {
    "per_device_batch_size": 4,
    "optimizer.learning_rate": 3e-3,
    "model.rnn_size": 64,
    "model.num_conv_layers": 1,
}


def test_overfits_a_fixed_batch_of_four():
    config = tiny_settings(**FIXED_BATCH)
    source = make_source(config, Sharding(4))
    batch = source.train_batch(0)
    state = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
    kwargs = state_lib.step_kwargs(config)
    step = jax.jit(functools.partial(train.train_step, **kwargs, axis_name=None))
    first = None
    for i in range(40):  # 10 steps reach 5% of the first loss here, 20 under 1%
        state, m = step(state, batch, jax.random.PRNGKey(0))
        loss = float(m["loss_sum"] / m["loss_count"])
        first = first if first is not None else loss
    assert loss <= 0.1 * first, (first, loss)


def test_checkpoint_round_trip(tmp_path):
    config = tiny_settings()
    source = make_source(config, Sharding(16))
    state = state_lib.initial_state(config, source, jax.random.PRNGKey(3))
    mgr = checkpoint.manager(str(tmp_path))
    checkpoint.save(mgr, 7, jax.device_get(state), wait=True)
    template = state_lib.initial_state(config, source, jax.random.PRNGKey(4))
    restored, step = checkpoint.restore_latest(checkpoint.manager(str(tmp_path)), template)
    assert step == 7
    for a, b in zip(leaves(state), leaves(restored)):
        np.testing.assert_array_equal(a, b)


class Killed(BaseException):
    """What faults.kill_at's SIGKILL becomes in-process: nothing after it runs but cleanup."""


TIMING = ("step_time_s", "utterances_per_s", "input_wait_s")  # the only metrics a resume may change


@pytest.mark.slow  # 15-60 s on 2 idle cores (2026-12-05): make test runs it, test-fast does not
def test_killed_and_resumed_run_matches_uninterrupted_in_every_field_and_counter(tmp_path, monkeypatch):
    """Every field of the train state and every metrics counter after two kills and resumes
    equals the uninterrupted run's. SpecAugment and waveform augmentation are on; non-finite steps (2, 5-8) lie on both
    sides of the checkpoints: resumed from checkpoint 3 (1 skipped step), steps 3-4 train with
    their own masks; resumed from checkpoint 6 (2 skipped, the last 1 in a row), every step
    after it is skipped, so the consecutive count has to come from the checkpoint."""
    real_kill = os.kill
    monkeypatch.setattr(
        os, "kill", lambda pid, sig: (_ for _ in ()).throw(Killed()) if pid == os.getpid() else real_kill(pid, sig)
    )
    common = {
        "num_train_steps": 9,
        "log_every_steps": 1,
        "eval_every_steps": 4,
        "checkpoint_every_steps": 3,
        "eval.max_utterances": 8,
        "faults.nan_at_steps": "2,5-8",
        "features.freq_masks": 2,
        "features.time_masks": 2,
        "features.time_mask_max_fraction": 0.2,
        "model.num_conv_layers": 1,  # a shorter compile: the conv count is not the question
        **waveform_augmentation(tmp_path),
    }
    full = train.train_and_evaluate(tiny_config(**common), str(tmp_path / "full"))
    for kill_at in ("step:5", "step:8"):  # each after a checkpoint (3, 6) and before the next
        with pytest.raises(Killed):
            train.train_and_evaluate(tiny_config(**common, **{"faults.kill_at": kill_at}), str(tmp_path / "split"))
    resumed = train.train_and_evaluate(tiny_config(**common), str(tmp_path / "split"))
    assert (int(full.skipped_steps), int(full.consecutive_skips)) == (5, 4)
    fields = [f.name for f in dataclasses.fields(full) if f.name not in ("apply_fn", "tx")]
    assert {"step", "params", "opt_state", "batch_stats", "skipped_steps", "consecutive_skips"} <= set(fields)
    for name in fields:
        a, b = getattr(full, name), getattr(resumed, name)
        assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b), name
        for x, y in zip(leaves(a), leaves(b), strict=True):
            np.testing.assert_array_equal(x, y, err_msg=name)
    records = {w: metrics.read_jsonl(str(tmp_path / w / "metrics.jsonl")) for w in ("full", "split")}
    assert [r["step"] for r in records["split"]] == [r["step"] for r in records["full"]]
    assert [r["skipped_steps"] for r in records["full"] if "skipped_steps" in r] == [0, 0, 1, 1, 1, 2, 3, 4, 5]
    for a, b in zip(records["full"], records["split"], strict=True):
        assert a.keys() == b.keys()
        assert {k: v for k, v in a.items() if k not in TIMING} == {k: v for k, v in b.items() if k not in TIMING}


@pytest.mark.slow
def test_non_finite_steps_are_skipped_and_counted():
    config = tiny_settings(**FIXED_BATCH)
    source = make_source(config, Sharding(4))
    batch = source.train_batch(0)
    state = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
    poisoned = state.replace(feature_std=state.feature_std.at[0].set(0.0))  # -> inf features
    step = jax.jit(functools.partial(train.train_step, **state_lib.step_kwargs(config), axis_name=None))
    new, m = step(poisoned, batch, jax.random.PRNGKey(0))
    assert float(m["finite_steps"]) == 0 and int(new.skipped_steps) == 1 and int(new.consecutive_skips) == 1
    for a, b in zip(leaves(poisoned.params), leaves(new.params)):
        np.testing.assert_array_equal(a, b)
    assert int(new.step) == 1


def test_inconsistent_config_fails_before_compiling(tmp_path):
    with pytest.raises(ValueError, match="num_devices"):
        train.train_and_evaluate(tiny_config(num_devices=64), str(tmp_path))
    with pytest.raises(ValueError, match="min_duration_s"):
        train.train_and_evaluate(
            tiny_config(**{"dataset.min_duration_s": 9.0, "dataset.max_duration_s": 8.0}), str(tmp_path)
        )
    with pytest.raises(ValueError, match="rnn_cell"):
        train.train_and_evaluate(tiny_config(**{"model.rnn_cell": "rnn"}), str(tmp_path))


@pytest.mark.slow
def test_jit_sharding_path_matches_pmap(tmp_path):
    common = {
        "num_train_steps": 5,
        "log_every_steps": 1,
        "eval_every_steps": 5,
        "checkpoint_every_steps": 100,
        "per_device_batch_size": 2,
        "eval.max_utterances": 8,
    }
    s_pmap = train.train_and_evaluate(tiny_config(**common), str(tmp_path / "pmap"))
    s_jit = train.train_and_evaluate(tiny_config(**common, parallelism="jit"), str(tmp_path / "jit"))
    l_pmap, l_jit = losses(tmp_path / "pmap"), losses(tmp_path / "jit")
    assert len(l_jit) == 6  # 5 train records + 1 eval record
    np.testing.assert_allclose(l_jit, l_pmap, rtol=1e-5)
    for a, b in zip(leaves(s_pmap.params), leaves(s_jit.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # 15 s or more on 2 cores (2026-12-06 durations): make test runs it, test-fast does not
def test_pallas_kernels_train_like_the_references():
    """Two steps with the persistent RNN and CTC kernels (interpret mode off the GPU) give
    the losses and parameters of lax.scan + optax."""

    def run(rnn_impl, ctc_impl):
        kernels = {"model.rnn_impl": rnn_impl, "loss.ctc_impl": ctc_impl, "model.num_conv_layers": 1}
        config = tiny_settings(per_device_batch_size=4, **kernels)
        source = make_source(config, Sharding(4))
        state = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
        step = jax.jit(functools.partial(train.train_step, **state_lib.step_kwargs(config), axis_name=None))
        out = []
        for i in range(2):
            state, m = step(state, source.train_batch(i), jax.random.PRNGKey(1))
            out.append(float(m["loss_sum"]) / float(m["loss_count"]))
        return out, state

    ref_losses, ref = run("scan", "optax")
    new_losses, new = run("pallas", "pallas")
    np.testing.assert_allclose(new_losses, ref_losses, rtol=1e-4)
    for a, b in zip(leaves(new.params), leaves(ref.params)):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
