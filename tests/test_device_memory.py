"""The train step's device-memory estimate, and the refusal of a batch that cannot fit, before compiling."""

from __future__ import annotations

import jax
import pytest

from ds2_jax import device_memory, errors, resilience, train
from ds2_jax.data.batch import Sharding
from ds2_jax.data.source import make_source
from ds2_jax.state import initial_state, step_kwargs
from tests.helpers import tiny_config, tiny_settings

SHAPES = [(8000, 12), (16000, 20)]  # the longer shape decides


@pytest.fixture(scope="module")
def setup():
    config = tiny_settings(per_device_batch_size=2)
    source = make_source(config, Sharding(2))
    state = initial_state(config, source, jax.random.PRNGKey(0))
    kwargs = {k: v for k, v in step_kwargs(config).items() if k != "learning_rate_fn"}
    return state, kwargs


def test_estimate_is_the_state_gradient_staged_batches_and_the_backward_residuals(setup):
    state, kwargs = setup
    est = device_memory.estimate(train.loss_function, state, 2, SHAPES, kwargs, staged_batches=3)
    for rows in (1, 5):  # measured at 2 and 4 rows; exact at others
        residuals = device_memory.residual_bytes(train.loss_function, state, rows, 16000, 20, kwargs)
        batch = resilience.tree_bytes(device_memory.batch_spec(rows, 16000, 20))
        assert est.at(rows) == (resilience.tree_bytes(state) + resilience.tree_bytes(state.params) + residuals
                                + 3 * batch)
    # The activations the backward keeps dominate a row: more than the int16 audio itself.
    assert est.per_row > 3 * resilience.tree_bytes(device_memory.batch_spec(1, 16000, 20))
    shorter = device_memory.estimate(train.loss_function, state, 2, SHAPES[:1], kwargs, staged_batches=3)
    assert shorter.per_row < est.per_row


def test_a_batch_over_the_limit_is_refused_naming_the_largest_that_fits(setup):
    state, kwargs = setup
    est = device_memory.estimate(train.loss_function, state, 2, SHAPES, kwargs, staged_batches=1)
    limit = est.at(7) + est.per_row // 2
    assert "of the device's" in device_memory.check(est, 7, limit)
    with pytest.raises(MemoryError) as e:
        device_memory.check(est, 8, limit)
    line = errors.one_line(e.value)
    assert "per_device_batch_size=8 cannot fit" in line and "about per_device_batch_size=7 " in line, line
    with pytest.raises(MemoryError, match="not even one row fits"):
        device_memory.check(est, 1, est.fixed)
    assert "limit is unknown" in device_memory.check(est, 10**6, None)  # CPUs: the host check guards them


def test_training_refuses_before_compiling(tmp_path, monkeypatch):
    """The loop checks the estimate against the device's limit before the step compiles."""
    limits = []
    monkeypatch.setattr(device_memory, "device_limit", lambda device: limits.append(device) or 2**20)
    traced = []
    monkeypatch.setattr(train, "train_step", lambda *a, **k: traced.append(1))
    with pytest.raises(MemoryError, match=r"per_device_batch_size=2 cannot fit .* has 1\.0 MiB"):
        train.train_and_evaluate(tiny_config(num_train_steps=2, eval_every_steps=0), str(tmp_path))
    assert limits and not traced  # refused before the first step ran
