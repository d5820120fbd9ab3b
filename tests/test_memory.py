"""Whether a run fits in memory: the train step's device-memory estimate, the CPU's compiled step, and the
refusal of a batch that cannot fit, before compiling or allocating."""

from __future__ import annotations

import jax
import pytest

from ds2_jax import errors, memory, train
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import make_source
from ds2_jax.state import initial_state, loss_arguments, step_kwargs
from tests.helpers import tiny_config, tiny_settings

SHAPES = [(8000, 12), (16000, 20)]  # the longer shape decides


@pytest.fixture(scope="module")
def setup():
    config = tiny_settings(per_device_batch_size=2)
    source = make_source(config, Sharding(2))
    state = initial_state(config, source, jax.random.PRNGKey(0))
    kwargs = loss_arguments(step_kwargs(config))
    return state, kwargs


def test_estimate_is_the_state_gradient_staged_batches_and_the_backward_residuals(setup):
    state, kwargs = setup
    est = memory.estimate(train.loss_function, state, 2, SHAPES, kwargs, staged_batches=3)
    for rows in (1, 5):  # measured at 2 and 4 rows; exact at others
        residuals = memory.residual_bytes(train.loss_function, state, rows, 16000, 20, kwargs)
        batch = memory.tree_bytes(memory.batch_spec(rows, 16000, 20))
        assert est.at(rows) == (memory.tree_bytes(state) + memory.tree_bytes(state.params) + residuals + 3 * batch)
    # The activations the backward keeps dominate a row: more than the int16 audio itself.
    assert est.per_row > 3 * memory.tree_bytes(memory.batch_spec(1, 16000, 20))
    shorter = memory.estimate(train.loss_function, state, 2, SHAPES[:1], kwargs, staged_batches=3)
    assert shorter.per_row < est.per_row


def test_a_batch_over_the_limit_is_refused_naming_the_largest_that_fits(setup):
    state, kwargs = setup
    est = memory.estimate(train.loss_function, state, 2, SHAPES, kwargs, staged_batches=1)
    limit = est.at(7) + est.per_row // 2
    assert "of the device's" in memory.check(est, 7, limit)
    with pytest.raises(MemoryError) as e:
        memory.check(est, 8, limit)
    line = errors.one_line(e.value)
    assert "per_device_batch_size=8 cannot fit" in line and "about per_device_batch_size=7 " in line, line
    with pytest.raises(MemoryError, match="not even one row fits"):
        memory.check(est, 1, est.fixed)
    assert "limit is unknown" in memory.check(est, 10**6, None)  # CPUs: the host check guards them


def test_training_refuses_before_compiling(tmp_path, monkeypatch):
    """The loop checks the estimate against the device's limit before the step compiles."""
    limits = []
    monkeypatch.setattr(memory, "device_limit", lambda device: limits.append(device) or 2**20)
    traced = []
    monkeypatch.setattr(train, "train_step", lambda *a, **k: traced.append(1))
    with pytest.raises(MemoryError, match=r"per_device_batch_size=2 cannot fit .* has 1\.0 MiB"):
        train.train_and_evaluate(tiny_config(num_train_steps=2, eval_every_steps=0), str(tmp_path))
    assert limits and not traced  # refused before the first step ran


def test_convolution_patches_are_counted_from_the_compiled_step():
    """XLA:CPU's memory analysis leaves out Eigen's convolution patches; they are read off the HLO."""
    x, w = jax.ShapeDtypeStruct((3, 20, 30, 2), "float32"), jax.ShapeDtypeStruct((5, 7, 2, 4), "float32")
    conv = jax.jit(
        lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    )
    text = conv.lower(x, w).compile().as_text()
    # 3 rows x 16 x 24 output positions x a 5 x 7 window x 2 input channels, float32
    assert memory.convolution_scratch_bytes(text) == 3 * 16 * 24 * 5 * 7 * 2 * 4
    assert memory.convolution_scratch_bytes("ROOT %add = f32[2]{0} add(%a, %b)") == 0


def _run_with_available_memory(monkeypatch, tmp_path, rows: int, per_device: int):
    """train_and_evaluate on the CPU's 8 test devices with `per_device` bytes available per device;
    returns (the result or the MemoryError, the host-memory lines logged, the steps run)."""
    monkeypatch.setattr(memory, "available_host_memory", lambda: per_device * jax.local_device_count())
    steps, lines = [], []
    run_step = train._run_step
    monkeypatch.setattr(train, "_run_step", lambda *a, **k: steps.append(1) or run_step(*a, **k))
    check = memory.check_compiled
    monkeypatch.setattr(memory, "check_compiled", lambda *a: lines.append(check(*a)) or lines[-1])
    try:
        result = train.train_and_evaluate(
            tiny_config(num_train_steps=2, eval_every_steps=0, per_device_batch_size=rows), str(tmp_path)
        )
    except MemoryError as e:
        result = e
    return result, lines, steps


@pytest.mark.slow  # 15 s or more on 2 cores (2026-12-06 durations): make test runs it, test-fast does not
def test_on_the_cpu_a_batch_the_shape_estimate_lets_through_is_refused_before_the_first_step(
    setup, tmp_path, monkeypatch
):
    """On the CPU the step's real need (XLA's buffers and the convolution patches, measured: ~10x the
    shape estimate) is checked against the host's available memory before the first step."""
    state, kwargs = setup
    est = memory.estimate(train.loss_function, state, 64, SHAPES, kwargs, staged_batches=3)
    result, _, steps = _run_with_available_memory(monkeypatch, tmp_path, 64, per_device=3 * est.at(64))
    assert isinstance(result, MemoryError) and not steps, result
    line = errors.one_line(result)
    assert "per_device_batch_size=64 cannot fit in this machine's memory" in line, line
    fits = int(line.split("about per_device_batch_size=")[1].split(" ")[0])
    assert 0 < fits < 64, line  # the rows scale the need: fewer fit


def test_on_the_cpu_a_small_batch_still_trains_with_the_compiled_step_checked(tmp_path, monkeypatch):
    """Not too eager: 2 rows per device (the step's peak is a few MiB each) train in 64 MiB each."""
    result, lines, steps = _run_with_available_memory(monkeypatch, tmp_path, 2, per_device=64 * 2**20)
    assert not isinstance(result, MemoryError), result
    assert int(result.step) == 2 and len(steps) == 2
    assert lines and lines[0].startswith("host memory: the step needs about"), lines
