"""Gradient accumulation (optimizer.accumulate_steps): K micro-batches of B rows inside one
compiled step give the update of one batch of K x B, on pmap and jit alike; batch norm
normalizes each micro-batch alone and updates its running statistics once per micro-batch;
a non-finite micro-batch skips the whole update; the step's memory is a micro-batch's.

Batch norm makes a batch of K x B rows and K micro-batches of B differ unless every row has
the same statistics, so the batch here repeats one utterance's audio in every row (the
statistics of identical rows are those of one) while the transcripts differ row by row and
one micro-batch has a padding row: a step that averaged the micro-batches' means, dropped one,
or scaled by K instead of the utterance count gives another update.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ds2_jax import ctc, memory, parallel, settings, train, valid_conv
from ds2_jax import state as state_lib
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import make_source
from tests.helpers import quick_compiled, tiny_settings

ROWS = 8  # the update's rows: K=2 micro-batches of 4 (1 device) or of 2 per device (2 devices)
PADDING = 5  # micro-batch 1 (rows 4-7) holds 3 utterances, micro-batch 0 holds 4


def leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def assert_trees_close(a, b, rtol=2e-5):
    for x, y in zip(leaves(a), leaves(b)):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * max(np.abs(y).max(), 1e-6))


@pytest.fixture(scope="module")
def setup():
    """(config, initial state with SGD at rate 1, the 8-row batch of one audio and 8 transcripts)."""
    config = tiny_settings(
        per_device_batch_size=4,
        **{
            "model.rnn_size": 16,
            "model.num_conv_layers": 1,  # one conv block (its batch norm too): a shorter compile
            "dataset.synthetic_min_duration_s": 0.4,
            "dataset.synthetic_max_duration_s": 0.6,
        },
    )
    source = make_source(config, Sharding(ROWS))
    batch = {k: v.copy() for k, v in source.train_batch(0).items()}
    batch["audio"][:] = batch["audio"][0]
    batch["audio_lengths"][:] = batch["audio_lengths"][0]
    assert len({tuple(r) for r in batch["labels"]}) == ROWS  # the transcripts differ
    for k in batch:  # as pipeline.batch.pad_batch leaves an unused row
        batch[k][PADDING] = 0
    state = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
    tx = optax.sgd(1.0)
    return config, state.replace(tx=tx, opt_state=tx.init(state.params)), batch


def run(config, state, batch, k: int, devices: int = 1, parallelism: str = "jit"):
    """One train step with accumulate_steps=k on `devices` fake CPU devices."""
    config = settings.override(
        config,
        {
            "optimizer.accumulate_steps": k,
            "num_devices": devices,
            "parallelism": parallelism,
            "per_device_batch_size": ROWS // devices // k,
        },
    )
    par = parallel.make(config)
    args = (par.put_replicated(state), par.put_batch(batch), par.put_replicated(jax.random.PRNGKey(1)))
    step = par.compile(train.train_step, state_lib.step_kwargs(config), donate=False)
    new, m = quick_compiled(step, *args)(*args)
    return par.get(new), par.get(m)


@pytest.fixture(scope="module")
def whole(setup):
    """The step on the whole batch of 8 (no accumulation), one device."""
    return run(*setup, k=1)


@pytest.mark.parametrize(
    "k,devices,parallelism", [(2, 1, "jit"), (4, 1, "jit"), (2, 2, "pmap"), (2, 2, "jit")], ids=str
)
@pytest.mark.slow
def test_k_micro_batches_of_b_give_the_update_of_one_batch_of_k_times_b(setup, whole, k, devices, parallelism):
    new, m = run(*setup, k=k, devices=devices, parallelism=parallelism)
    ref, ref_m = whole
    assert_trees_close(new.params, ref.params)
    for key in ("loss_sum", "loss_count", "utterances", "grad_norm_sum", "steps"):
        np.testing.assert_allclose(m[key], ref_m[key], rtol=2e-5, err_msg=key)
    assert float(m["loss_count"]) == ROWS - 1 and float(m["steps"]) == 1
    assert int(new.step) == 1  # one update: the schedule and checkpoints count updates


@pytest.mark.parametrize("parallelism", ["pmap", "jit"])
def test_micro_batch_k_is_rows_k_b_to_k_b_plus_b_of_each_devices_shard(parallelism):
    """Each device accumulates its own rows (no row crosses devices), the same under pmap and jit."""
    config = tiny_settings(num_devices=2, parallelism=parallelism, per_device_batch_size=6)
    par = parallel.make(config)
    rows = {"x": np.arange(12, dtype=np.int32)}  # device 0 holds 0-5, device 1 holds 6-11

    def split(state, batch, axis_name=None):
        return train.micro_batches(batch, 3)["x"]

    got = np.asarray(par.compile(split, {}, donate=False)(par.put_replicated(np.zeros(())), par.put_batch(rows)))
    if parallelism == "pmap":  # [devices, K, B] -> [K, devices x B] as jit sees it
        got = np.swapaxes(got, 0, 1).reshape(3, 4)
    np.testing.assert_array_equal(got, [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5, 10, 11]])


@pytest.mark.slow  # 15 s or more on 2 cores (2026-12-06 durations): make test runs it, test-fast does not
def test_the_update_is_not_the_mean_of_the_micro_batches_means(setup, whole):
    """The micro-batches hold 4 and 3 utterances: the mean of their means weighs them wrongly.
    Each micro-batch's mean gradient is the SGD update of the whole batch's step (`whole`'s program)
    with the other micro-batch's rows made padding (no frames, weight 0)."""
    config, state, batch = setup
    halves = []
    for keep in (slice(0, 4), slice(4, 8)):
        half = {k: np.zeros_like(v) for k, v in batch.items()}
        for k in half:
            half[k][keep] = batch[k][keep]
        halves.append(run(config, state, half, k=1)[0].params)
    mean_of_means = jax.tree_util.tree_map(lambda a, b: (a + b) / 2, *halves)  # p - (g0 + g1) / 2
    apart = max(np.abs(a - b).max() for a, b in zip(leaves(mean_of_means), leaves(whole[0].params)))
    assert apart > 1e-4  # the test tells the two apart


def test_batch_norm_running_statistics_are_updated_once_per_micro_batch(setup, whole):
    """With identical rows each micro-batch's statistics are the batch's (b): one batch of 8 moves the
    running value v to m v + (1 - m) b, K micro-batches to m^K v + (1 - m^K) b."""
    config, state, batch = setup
    m = config.model.batch_norm_momentum
    one = whole[0].batch_stats
    for k in (2, 4):
        new, _ = run(config, state, batch, k=k)
        for v, v1, vk in zip(leaves(state.batch_stats), leaves(one), leaves(new.batch_stats)):
            b = (v1 - m * v) / (1 - m)
            np.testing.assert_allclose(vk, m**k * v + (1 - m**k) * b, rtol=1e-4, atol=1e-5)


def test_a_non_finite_micro_batch_skips_the_whole_update(setup, monkeypatch):
    """One micro-batch's loss is NaN: nothing of the other enters the state, one step is counted as
    skipped (today's rule for a step), and the next update trains on."""
    config, state, batch = setup
    marker = int(batch["labels"][6, 0])  # row 6: the second micro-batch only
    assert all(int(batch["labels"][i, 0]) != marker for i in range(4))
    real = ctc.per_utterance_loss

    def poisoned(logits, lengths, labels, *a, **k):
        loss, ok = real(logits, lengths, labels, *a, **k)
        return jnp.where(labels[:, 0] == marker, jnp.nan, loss), ok

    monkeypatch.setattr(ctc, "per_utterance_loss", poisoned)
    new, m = run(config, state, batch, k=2)
    assert float(m["finite_steps"]) == 0 and float(m["loss_sum"]) == float(m["loss_count"]) == 0
    for part in ("params", "opt_state", "batch_stats"):
        for a, b in zip(leaves(getattr(new, part)), leaves(getattr(state, part))):
            np.testing.assert_array_equal(a, b, err_msg=part)
    assert int(new.skipped_steps) == 1 and int(new.consecutive_skips) == 1 and int(new.step) == 1
    monkeypatch.undo()
    good, m = run(config, new, batch, k=2)
    assert float(m["finite_steps"]) == 1 and int(good.consecutive_skips) == 0 and int(good.skipped_steps) == 1


def test_the_setting_reaches_the_step_and_the_data(setup):
    """accumulate_steps is a static argument of the step, and the run's batches hold K x B rows."""
    config, _, _ = setup
    changed = settings.override(config, {"optimizer.accumulate_steps": 3})
    assert state_lib.step_kwargs(changed)["accumulate_steps"] == 3
    assert state_lib.step_kwargs(config)["accumulate_steps"] == 1
    assert "accumulate_steps" not in state_lib.loss_arguments(state_lib.step_kwargs(changed))
    with pytest.raises(ValueError, match="optimizer.accumulate_steps=0"):
        settings.override(config, {"optimizer.accumulate_steps": 0})


@functools.cache  # the memory test's K=4 step is the layout test's space_to_depth one
def _compiled(config, rows: int, k: int):
    """The compiled step (one CPU device) for `rows` x `k` rows of 1.5 s."""
    config = settings.override(config, {"optimizer.accumulate_steps": k})
    source = make_source(config, Sharding(rows))
    state = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
    spec = memory.batch_spec(rows * k, 24_000, 40)
    step = jax.jit(functools.partial(train.train_step, **state_lib.step_kwargs(config), axis_name=None))
    return step.lower(state, spec, jax.random.PRNGKey(0)).compile()


def _temp_bytes(config, rows: int, k: int) -> int:
    """XLA's temporary bytes of the compiled step."""
    return _compiled(config, rows, k).memory_analysis().temp_size_in_bytes


# The step the memory test compiles (its K=4 one: the same program, compiled once on one worker).
MEMORY = {"model.rnn_size": 64, "model.conv_channels": 8, "model.num_conv_layers": 1}


@pytest.mark.xdist_group("accumulate_steps")
@pytest.mark.parametrize("conv_impl, canonical", [("space_to_depth", True), ("direct", False)])
@pytest.mark.slow
def test_on_the_cpu_the_accumulating_steps_convolutions_are_in_the_fast_layout(conv_impl, canonical):
    """XLA:CPU runs a convolution with its fast library only in the canonical layout, and inside
    the micro-batch loop it does not canonicalize autodiff's backward convolutions (the generic
    emitter then took 80% of an update: benchmarks/results/2026-12-06-cpu-recipe). The default conv
    (space_to_depth over valid_conv) leaves none other in the compiled step; 'direct' (lax's
    strided convolution and its autodiff), the control, does."""
    config = tiny_settings(**{**MEMORY, "model.conv_impl": conv_impl})
    layouts = re.findall(r"convolution\(.*?dim_labels=(\S+?),", _compiled(config, 4, 4).as_text())
    assert layouts and (set(layouts) == {valid_conv.CANONICAL}) == canonical, layouts


@pytest.mark.xdist_group("accumulate_steps")
@pytest.mark.slow  # 15 s or more on 2 cores (2026-12-06 durations): make test runs it, test-fast does not
def test_the_step_at_k_micro_batches_needs_the_memory_of_one():
    """The compiled step's temporaries (activations, residuals: what grows with the batch) at K=4
    micro-batches of B are those at B, not at 4 x B (measured by XLA's memory analysis)."""
    config = tiny_settings(**MEMORY)
    at_b, at_4b, k4 = _temp_bytes(config, 4, 1), _temp_bytes(config, 16, 1), _temp_bytes(config, 4, 4)
    assert at_4b > 2.5 * at_b  # the measure sees the batch
    assert k4 < 1.15 * at_b, (at_b, k4, at_4b)


@pytest.mark.slow
def test_a_resumed_accumulating_run_equals_the_uninterrupted_one(tmp_path):
    """The step is the whole update (no state between micro-batches), and the data is ordered by update:
    2 + 2 updates resumed from a checkpoint equal 4 in one go, bit for bit."""
    config = tiny_settings(
        per_device_batch_size=2,
        num_devices=1,
        num_train_steps=4,
        eval_every_steps=0,
        **{
            "optimizer.accumulate_steps": 2,
            "model.rnn_size": 16,
            "model.num_conv_layers": 1,
            "dataset.synthetic_min_duration_s": 0.4,
            "dataset.synthetic_max_duration_s": 0.6,
            "dataset.synthetic_pool_size": 16,
        },
    )
    straight = train.train_and_evaluate(config, str(tmp_path / "a"))
    train.train_and_evaluate(settings.override(config, {"num_train_steps": 2}), str(tmp_path / "b"))
    resumed = train.train_and_evaluate(config, str(tmp_path / "b"))
    assert int(straight.step) == int(resumed.step) == 4
    for part in ("params", "opt_state", "batch_stats"):
        for a, b in zip(leaves(getattr(straight, part)), leaves(getattr(resumed, part))):
            np.testing.assert_array_equal(a, b, err_msg=part)
