"""parallelism='jit' runs the per-utterance parts (spectrogram, recurrence, CTC) and their
Pallas kernels on each device's rows: same numbers as one device and as pmap, and no
all-gather of the batch in the compiled step. Kernels run in Pallas interpret mode off
the GPU, where XLA partitions them like any op and gathers the batch around them (on
GPUs their custom calls can only be replicated): without batch_axis.map_batch these
tests see the all-gathers. On a GPU machine the same tests run the native kernels on
its GPUs (one GPU: a one-device mesh, the same shard_map path)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from ds2_jax import batch_axis, ctc, parallel, settings, train
from ds2_jax import state as state_lib
from ds2_jax.kernels import dispatch, mosaic_rnn
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import make_source
from ds2_jax.rnn import recurrence
from tests.helpers import quick_compiled, tiny_settings

pytestmark = pytest.mark.gpu  # kernel numerics under jit: make test-gpu runs them on a GPU

KERNELS = {"model.rnn_impl": "pallas", "loss.ctc_impl": "pallas"}
# Hopper only: the Mosaic GPU recurrence (bfloat16, width a multiple of 128).
MOSAIC = {"model.rnn_impl": "mosaic", "loss.ctc_impl": "pallas", "model.dtype": "bfloat16", "model.rnn_size": 128}
DEVICES, PER_DEVICE = min(8, jax.device_count()), 2  # 8 fake CPU devices; on a GPU machine its GPUs


def mesh():
    return jax.sharding.Mesh(np.array(jax.devices()[:DEVICES]), (batch_axis.AXIS,))


def on_mesh(fn, *args):
    """jit(fn) traced on the DEVICES-device mesh, the leading axis of every argument sharded."""
    m = mesh()
    args = [jax.device_put(a, NamedSharding(m, PartitionSpec(batch_axis.AXIS))) for a in args]
    return jax.jit(batch_axis.traced_on(fn, m))(*args)


def test_kernels_per_shard_give_the_one_device_values_and_gradients():
    """The recurrent weights' gradient is summed over the shards (shard_map's transpose)."""
    rng = np.random.default_rng(0)
    b, t, h = DEVICES * PER_DEVICE, 9, 16
    xs = jnp.asarray(rng.normal(size=(b, t, h)), jnp.float32)
    lengths = jnp.asarray(rng.integers(4, t + 1, size=b), jnp.int32)
    recurrent = jnp.asarray(rng.normal(size=(2, h, h)) * 0.3, jnp.float32)
    labels = jnp.asarray(rng.integers(1, 29, size=(b, 3)), jnp.int32)
    label_lengths = jnp.asarray(rng.integers(1, 4, size=b), jnp.int32)
    proj = jnp.asarray(rng.normal(size=(2 * h, 29)) * 0.3, jnp.float32)

    def loss(xs, lengths, labels, label_lengths, recurrent, proj):
        hs = recurrence.bidirectional([xs], recurrent, lengths, impl="pallas")
        per_utt, _ = ctc.per_utterance_loss(hs @ proj, lengths, labels, label_lengths, impl="pallas")
        return jnp.sum(per_utt)

    grad = jax.value_and_grad(loss, argnums=(0, 4, 5))
    want = jax.jit(grad)(xs, lengths, labels, label_lengths, recurrent, proj)
    # recurrent and proj enter replicated: close over them so on_mesh shards only the batch
    got = on_mesh(lambda *batch: grad(*batch, recurrent, proj), xs, lengths, labels, label_lengths)
    for a, b_ in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b_), rtol=2e-5, atol=1e-5)


def test_map_batch_runs_on_each_devices_rows_only_under_a_mesh():
    def rows(x):  # how many rows fn sees
        return x[:, 0] + x.shape[0]

    x = jnp.zeros((DEVICES * PER_DEVICE, 3))
    np.testing.assert_array_equal(jax.jit(lambda x: batch_axis.map_batch(rows, [x]))(x), DEVICES * PER_DEVICE)
    np.testing.assert_array_equal(on_mesh(lambda x: batch_axis.map_batch(rows, [x]), x), PER_DEVICE)
    # under pmap each program already holds its shard
    shards = x.reshape(DEVICES, PER_DEVICE, 3)
    pm = jax.pmap(lambda x: batch_axis.map_batch(rows, [x]), axis_name=batch_axis.AXIS, devices=jax.devices()[:DEVICES])
    np.testing.assert_array_equal(pm(shards), PER_DEVICE)


def test_auto_decides_on_the_per_device_batch_as_under_pmap(monkeypatch):
    """'auto' keeps the RNN kernels to <= 16 rows per device: under jit it must see a device's
    rows, not the global batch; and the CTC choice no longer depends on the parallelism."""
    seen = []
    choose = dispatch.rnn_impl
    monkeypatch.setattr(
        dispatch, "rnn_impl", lambda impl, cell, xs, w: seen.append(xs.shape[0]) or choose(impl, cell, xs, w)
    )
    xs, lengths = jnp.ones((DEVICES * PER_DEVICE, 5, 8)), jnp.full((DEVICES * PER_DEVICE,), 5)
    on_mesh(lambda xs, lengths: recurrence.bidirectional([xs], jnp.zeros((2, 8, 8)), lengths, impl="auto"), xs, lengths)
    assert seen == [PER_DEVICE]
    impls = {kind: state_lib.step_kwargs(tiny_settings(parallelism=kind))["ctc_impl"] for kind in settings.PARALLELISMS}
    assert impls == {"pmap": "auto", "jit": "auto"}


def _kernel_config(kind: str, **overrides):
    return tiny_settings(
        parallelism=kind,
        per_device_batch_size=PER_DEVICE,
        num_devices=DEVICES,
        **{
            "dataset.synthetic_min_duration_s": 0.3,
            "dataset.synthetic_max_duration_s": 0.5,
            "model.rnn_size": 16,
            "model.num_conv_layers": 1,  # the kernels' question; one conv block compiles sooner
            **overrides,
        },
    )


def _compiled(config):
    """(the strategy, the compiled step, a source, the initial state placed) for config. The state
    trains with plain SGD: the questions are the batch's rows and their sums, which the optimizer
    only follows (SGD's update is the gradient itself), and Adam's update lengthened each compile."""
    par = parallel.make(config)
    source = make_source(config, Sharding(DEVICES * PER_DEVICE))
    state = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
    tx = optax.sgd(0.1)
    state = state.replace(tx=tx, opt_state=tx.init(state.params))
    return par, par.compile(train.train_step, state_lib.step_kwargs(config)), source, par.put_replicated(state)


def all_gathers(hlo: str) -> list[str]:
    return [line.strip()[:200] for line in hlo.splitlines() if re.search(r"\ball-gather(-start)?\(", line)]


def _two_steps(kind: str, kernels: dict):
    """Losses and final state of two steps with the kernels; for jit also the compiled HLO."""
    config = _kernel_config(kind, **kernels)
    par, step, source, state = _compiled(config)
    rng = par.put_replicated(jax.random.PRNGKey(1))
    batches = [par.put_batch(source.train_batch(i)) for i in range(2)]
    step = quick_compiled(step, state, batches[0], rng)
    hlo = step.as_text() if kind == "jit" else None
    losses = []
    for batch in batches:
        state, m = step(state, batch, rng)
        m = par.get(m)
        losses.append(float(m["loss_sum"]) / float(m["loss_count"]))
    return losses, par.get(state), hlo


@pytest.mark.slow  # 15-60 s on 2 idle cores (2026-12-05): make test runs it, test-fast does not
@pytest.mark.parametrize("kernels, rtol", [(KERNELS, 1e-5), (MOSAIC, 1e-3)], ids=["pallas", "mosaic"])
def test_jit_with_the_kernels_trains_like_pmap_and_gathers_no_batch(kernels, rtol):
    if kernels is MOSAIC and not mosaic_rnn.supported():
        pytest.skip("the Mosaic GPU recurrence runs on Hopper GPUs only")
    pmap_losses, pmap_state, _ = _two_steps("pmap", kernels)
    jit_losses, jit_state, hlo = _two_steps("jit", kernels)
    np.testing.assert_allclose(jit_losses, pmap_losses, rtol=rtol)
    for a, b in zip(jax.tree_util.tree_leaves(jit_state.params), jax.tree_util.tree_leaves(pmap_state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=10 * rtol, atol=rtol / 10)
    assert "all-reduce" in hlo or DEVICES == 1  # one device: XLA drops the all-reduces
    assert all_gathers(hlo) == []


def test_compiled_jit_step_with_the_default_impls_gathers_no_batch():
    """Data parallel: the only collectives are the all-reduces of gradients, batch-norm
    statistics and metrics; no device ever holds another device's rows (with 'auto', the
    featurizer's FFT is what XLA would gather around)."""
    config = _kernel_config("jit")
    par, step, source, state = _compiled(config)
    rng = par.put_replicated(jax.random.PRNGKey(1))
    hlo = quick_compiled(step, state, par.put_batch(source.train_batch(0)), rng).as_text()
    assert "all-reduce" in hlo or DEVICES == 1  # one device: XLA drops the all-reduces
    assert all_gathers(hlo) == []
