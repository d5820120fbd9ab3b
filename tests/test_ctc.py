"""CTC against torch.nn.functional.ctc_loss, infeasible masking, greedy decoding."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ds2_jax import ctc, geometry
from ds2_jax.kernels import dispatch

pytestmark = pytest.mark.gpu  # kernel numerics: make test-gpu runs them on a GPU


def random_problem(seed=0, b=6, t=40, v=29, max_label=12):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((b, t, v)).astype(np.float32) * 3
    logit_lengths = rng.integers(t // 2, t + 1, size=b).astype(np.int32)
    label_lengths = rng.integers(1, max_label + 1, size=b).astype(np.int32)
    labels = np.zeros((b, max_label), np.int32)
    for i, n in enumerate(label_lengths):
        labels[i, :n] = rng.integers(1, v, size=n)
    return logits, logit_lengths, labels, label_lengths


def torch_ctc(logits, logit_lengths, labels, label_lengths):
    return torch_ctc_tensor(torch.tensor(logits), logit_lengths, labels, label_lengths).numpy()


def torch_ctc_tensor(logits, logit_lengths, labels, label_lengths):
    log_probs = torch.log_softmax(logits, -1).transpose(0, 1)
    return torch.nn.functional.ctc_loss(
        log_probs,
        torch.tensor(labels, dtype=torch.long),
        torch.tensor(logit_lengths, dtype=torch.long),
        torch.tensor(label_lengths, dtype=torch.long),
        blank=0,
        reduction="none",
        zero_infinity=False,
    )


# 'pallas' runs the forward-backward kernels (interpret mode off the GPU).
IMPLS = ["optax", "pallas"]


@pytest.mark.parametrize("impl", IMPLS)
def test_matches_torch_ctc_loss(impl):
    loss = jax.jit(functools.partial(ctc.per_utterance_loss, impl=impl))  # one compile, three problems
    for seed in range(3):
        logits, ll, labels, yl = random_problem(seed)
        got, ok = loss(jnp.asarray(logits), jnp.asarray(ll), jnp.asarray(labels), jnp.asarray(yl))
        assert np.all(ok)
        want = torch_ctc(logits, ll, labels, yl)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("impl", IMPLS)
def test_gradient_matches_torch(impl):
    logits, ll, labels, yl = random_problem(3, b=5, t=33, max_label=9)
    weights = np.arange(1, 6, dtype=np.float32)

    def total(x):
        loss, _ = ctc.per_utterance_loss(x, jnp.asarray(ll), jnp.asarray(labels), jnp.asarray(yl), impl=impl)
        return jnp.sum(loss * weights)

    got = np.asarray(jax.jit(jax.grad(total))(jnp.asarray(logits)))
    x = torch.tensor(logits, requires_grad=True)
    (torch_ctc_tensor(x, ll, labels, yl) * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(got, x.grad.numpy(), atol=1e-4 * np.abs(x.grad.numpy()).max())


def test_auto_picks_the_kernel_on_gpus_only():
    assert dispatch.ctc_impl("auto") == ("pallas" if jax.default_backend() == "gpu" else "optax")
    logits, ll, labels, yl = (jnp.asarray(a) for a in random_problem(b=2))
    with pytest.raises(ValueError, match="loss.ctc_impl='warp'"):
        ctc.per_utterance_loss(logits, ll, labels, yl, impl="warp")


def test_norm_by_times_divides_by_frames():
    logits, ll, labels, yl = random_problem(1)
    raw, _ = ctc.per_utterance_loss(jnp.asarray(logits), jnp.asarray(ll), jnp.asarray(labels), jnp.asarray(yl))
    norm, _ = ctc.per_utterance_loss(jnp.asarray(logits), jnp.asarray(ll), jnp.asarray(labels), jnp.asarray(yl), True)
    np.testing.assert_allclose(np.asarray(norm), np.asarray(raw) / ll, rtol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_infeasible_labels_are_masked_out_of_loss_and_gradient(impl):
    logits = np.random.default_rng(0).standard_normal((2, 5, 29)).astype(np.float32)
    labels = np.array([[3, 3, 3, 0], [4, 5, 0, 0]], np.int32)  # 3,3,3 needs 5 frames; only 4 valid
    ll, yl = jnp.array([4, 5]), jnp.array([3, 2])

    def total(x):
        loss, ok = ctc.per_utterance_loss(x, ll, jnp.asarray(labels), yl, impl=impl)
        return jnp.sum(loss), ok

    (value, ok), grad = jax.jit(jax.value_and_grad(total, has_aux=True))(jnp.asarray(logits))
    np.testing.assert_array_equal(ok, [False, True])
    assert np.isfinite(value) and value < 1e3
    assert np.all(np.asarray(grad)[0] == 0)
    assert np.any(np.asarray(grad)[1] != 0)
    # empty labels are infeasible too (nothing to learn)
    assert not bool(ctc.feasible(jnp.array([4]), jnp.zeros((1, 2), jnp.int32), jnp.array([0]))[0])


def test_min_frames_counts_repeats():
    labels = jnp.array([[1, 1, 2, 2, 2], [1, 2, 3, 3, 0]])  # repeats past each length do not count
    np.testing.assert_array_equal(geometry.ctc_min_frames(labels, jnp.array([4, 3])), [6, 3])
    assert [geometry.ctc_min_frames(np.asarray(r[:n])) for r, n in zip(labels, [4, 3])] == [6, 3]  # host form


@pytest.mark.parametrize("impl", IMPLS)
def test_frames_exactly_what_the_labels_need_have_one_path_and_its_loss(impl):
    """At T == ctc_min_frames the only alignment is the labels with one blank between repeats:
    feasible, and the loss is minus that path's log-probability. One frame fewer: masked."""
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((3, 5, 29)).astype(np.float32)
    labels = jnp.array([[3, 3, 0], [4, 5, 6], [3, 3, 0]], jnp.int32)
    lengths, label_lengths = jnp.array([3, 3, 2]), jnp.array([2, 3, 2])  # needs 3, 3, 3
    paths = [[3, 0, 3], [4, 5, 6]]
    loss, ok = jax.jit(functools.partial(ctc.per_utterance_loss, impl=impl))(
        jnp.asarray(logits), lengths, labels, label_lengths
    )
    np.testing.assert_array_equal(ok, [True, True, False])
    logp = np.asarray(jax.nn.log_softmax(logits))
    want = [-sum(logp[i, t, c] for t, c in enumerate(p)) for i, p in enumerate(paths)]
    np.testing.assert_allclose(np.asarray(loss)[:2], want, rtol=1e-5)
    assert float(loss[2]) == 0.0


def test_a_certain_path_has_a_loss_of_zero_never_below():
    """Logits that make one alignment all but certain: float32 rounding takes optax's loss a hair
    below zero (-2e-9 here); the loss a step sees is clipped at 0, for every row."""
    rows, T, L = 6, 9, 5
    labels = np.tile(np.arange(1, L + 1, dtype=np.int32), (rows, 1))
    logits = np.zeros((rows, T, 29), np.float32)
    for r, big in enumerate((20.0, 25.0, 30.0, 40.0, 50.0, 80.0)):
        for t in range(T):
            logits[r, t, t + 1 if t < L else 0] = big
    args = jnp.asarray(logits), jnp.full((rows,), T), jnp.asarray(labels), jnp.full((rows,), L)
    raw = jax.jit(ctc._optax_loss)(*args)
    assert (np.asarray(raw) < 0).any()  # the case this test is about
    loss, ok = jax.jit(functools.partial(ctc.per_utterance_loss, impl="optax"))(*args)
    assert np.asarray(ok).all() and (np.asarray(loss) >= 0).all() and np.asarray(loss).max() < 1e-6
