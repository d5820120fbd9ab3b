"""Model: conv output lengths, padding invariance, variants, parameter counts, the row convolution's lookahead."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ds2_jax import activation, geometry, model


def small_cfg(**kw):
    base = dict(num_conv_layers=2, conv_channels=4, num_rnn_layers=2, rnn_size=16)
    base.update(kw)
    return model.ModelConfig(**base)


def run(cfg, feats, lengths, train=False, variables=None):
    net = model.DeepSpeech2(cfg)
    if variables is None:
        variables = net.init(jax.random.PRNGKey(0), feats, lengths, train=False)
    if train:
        (out, out_len), _ = net.apply(variables, feats, lengths, train=True, mutable=["batch_stats"])
    else:
        out, out_len = net.apply(variables, feats, lengths, train=False)
    return np.asarray(out), np.asarray(out_len), variables


@pytest.mark.parametrize("num_conv", [1, 2, 3])
def test_output_lengths_match_formula(num_conv):
    cfg = small_cfg(num_conv_layers=num_conv)
    lengths = np.array([97, 64, 31, 5], np.int32)
    feats = jnp.zeros((4, 97, 161))
    out, out_len, _ = run(cfg, feats, jnp.asarray(lengths))
    # time: conv 1 is kernel 11, stride 3, pad 5 -> ceil(T / 3); later convs keep T.
    np.testing.assert_array_equal(out_len, -(-lengths // 3))
    np.testing.assert_array_equal(out_len, geometry.output_frames(lengths, num_conv))
    assert out.shape == (4, -(-97 // 3), 29)


@pytest.mark.parametrize(
    "variant",
    [
        dict(),
        dict(rnn_cell="gru"),
        dict(rnn_cell="lstm", share_rnn_weights=False),
        dict(bidirectional=False, row_conv_context=3),
        dict(dtype="bfloat16"),
    ],
)
def test_padded_frames_never_change_valid_outputs(variant):
    cfg = small_cfg(**variant)
    rng = np.random.default_rng(0)
    lengths = jnp.array([60, 37])
    feats = rng.standard_normal((2, 60, 161)).astype(np.float32)
    feats[1, 37:] = 0
    garbage = feats.copy()
    garbage[1, 37:] = rng.standard_normal((23, 161)) * 5
    for train in (False, True):
        a, la, v = run(cfg, jnp.asarray(feats), lengths, train)
        b, lb, _ = run(cfg, jnp.asarray(garbage), lengths, train, v)
        n = int(la[1])
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_allclose(a[1, :n], b[1, :n], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(a[0], b[0], rtol=1e-5, atol=1e-5)


def test_batch_norm_ignores_padding_statistics():
    bn = model.MaskedBatchNorm()
    x = jnp.concatenate([jnp.ones((1, 3, 2)), 100 * jnp.ones((1, 2, 2))], axis=1)
    mask = jnp.array([[True, True, True, False, False]])
    v = bn.init(jax.random.PRNGKey(0), x, mask, train=True)
    _, upd = bn.apply(v, x, mask, train=True, mutable=["batch_stats"])
    np.testing.assert_allclose(upd["batch_stats"]["mean"], 0.01 * np.ones(2), rtol=1e-6)


def test_seed_configuration_shape_and_size():
    cfg = model.ModelConfig()  # the Paddle seed: 2 conv, 3 x BiRNN 2048 shared, 29 outputs
    net = model.DeepSpeech2(cfg)
    v = jax.eval_shape(lambda: net.init(jax.random.PRNGKey(0), jnp.zeros((1, 30, 161)), jnp.array([30]), train=False))
    p = v["params"]
    rnn_in = 32 * geometry.output_bins(161, 2)
    assert rnn_in == 32 * 41
    assert p["RNNLayer_0"]["input_proj"]["kernel"].shape == (rnn_in, 2048)
    assert p["RNNLayer_0"]["recurrent_kernel"].shape == (2, 2048, 2048)
    assert p["output"]["kernel"].shape == (4096, 29)
    expected = (
        11 * 41 * 32
        + 11 * 21 * 32 * 32
        + 2 * 2 * 32  # convs + their BN
        + rnn_in * 2048
        + 2 * 2048
        + 2 * 2048 * 2048  # layer 1
        + 2 * (4096 * 2048 + 2 * 2048 + 2 * 2048 * 2048)  # layers 2, 3
        + 4096 * 29
        + 29
    )
    assert model.count_params(p) == expected


def test_rejects_bad_settings():
    with pytest.raises(ValueError, match="rnn_cell"):
        model.ModelConfig(rnn_cell="transformer")
    with pytest.raises(ValueError, match="num_conv_layers"):
        model.ModelConfig(num_conv_layers=4)
    with pytest.raises(ValueError, match="dtype"):
        model.ModelConfig(dtype="float16")
    with pytest.raises(ValueError, match="bfloat16"):
        model.ModelConfig(rnn_impl="mosaic", dtype="float32")


def masked_moments(x, mask):
    """numpy mean and (population) variance per channel over the valid frames of x [B, T, ..., C]."""
    rows = np.asarray(x, np.float64)[np.asarray(mask)]  # [valid frames, ..., C]
    rows = rows.reshape(-1, rows.shape[-1])
    return rows.mean(0), rows.var(0)


def bn_input(seed=0):
    """x <float32>[4, 7, 5, 3] (a conv block's [B, T, F, C]) with mean 3 and large padded frames, mask [4, 7]."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 7, 5, 3)).astype(np.float32) * np.array([1.0, 2.0, 0.5], np.float32) + 3.0
    mask = np.arange(7)[None, :] < np.array([7, 4, 1, 0])[:, None]
    x[~mask] = 50.0
    return x, mask


def test_batch_norm_normalizes_with_masked_moments_and_updates_running_stats_by_momentum():
    x, mask = bn_input()
    bn = model.MaskedBatchNorm(momentum=0.9, epsilon=1e-5)
    v = {
        "params": {"scale": jnp.array([1.0, 2.0, 0.5]), "bias": jnp.array([0.0, 1.0, -1.0])},
        "batch_stats": {"mean": jnp.array([0.5, -1.0, 2.0]), "var": jnp.array([1.0, 4.0, 0.25])},
    }
    y, upd = bn.apply(v, x, mask, train=True, mutable=["batch_stats"])
    mean, var = masked_moments(x, mask)
    np.testing.assert_allclose(upd["batch_stats"]["mean"], 0.9 * np.array([0.5, -1.0, 2.0]) + 0.1 * mean, rtol=1e-5)
    np.testing.assert_allclose(upd["batch_stats"]["var"], 0.9 * np.array([1.0, 4.0, 0.25]) + 0.1 * var, rtol=1e-5)
    want = (x - mean) / np.sqrt(var + 1e-5) * np.array([1.0, 2.0, 0.5]) + np.array([0.0, 1.0, -1.0])
    np.testing.assert_allclose(np.asarray(y)[mask], want[mask], rtol=1e-4, atol=1e-4)
    # eval mode normalizes with the running statistics, whatever the batch holds
    y_eval = bn.apply({"params": v["params"], "batch_stats": upd["batch_stats"]}, x, mask, train=False)
    ra_mean, ra_var = (np.asarray(upd["batch_stats"][k]) for k in ("mean", "var"))
    want = (x - ra_mean) / np.sqrt(ra_var + 1e-5) * np.array([1.0, 2.0, 0.5]) + np.array([0.0, 1.0, -1.0])
    np.testing.assert_allclose(np.asarray(y_eval), want, rtol=1e-4, atol=1e-4)


def test_synchronized_batch_norm_over_devices_equals_one_device():
    """Four devices, one row each (7, 4, 1 and 0 valid frames): the statistics of the whole batch."""
    x, mask = bn_input(1)
    bn = model.MaskedBatchNorm(axis_name="batch")
    v = model.MaskedBatchNorm().init(jax.random.PRNGKey(0), x, mask, train=True)
    apply = lambda x, m: bn.apply(v, x, m, train=True, mutable=["batch_stats"])  # noqa: E731
    y, upd = jax.pmap(apply, axis_name="batch", devices=jax.devices()[:4])(x[:, None], mask[:, None])
    y_one, upd_one = model.MaskedBatchNorm().apply(v, x, mask, train=True, mutable=["batch_stats"])
    np.testing.assert_allclose(np.asarray(y)[:, 0][mask], np.asarray(y_one)[mask], rtol=1e-5, atol=1e-5)
    for k in ("mean", "var"):
        for d in range(4):
            np.testing.assert_allclose(upd["batch_stats"][k][d], upd_one["batch_stats"][k], rtol=1e-5)


def test_clipped_relu_clips_at_0_and_20_and_passes_gradient_only_between():
    x = jnp.array([-3.0, 0.5, 19.5, 25.0])
    np.testing.assert_array_equal(activation.clipped_relu(x), [0.0, 0.5, 19.5, 20.0])
    np.testing.assert_array_equal(jax.grad(lambda x: jnp.sum(activation.clipped_relu(x)))(x), [0.0, 1.0, 1.0, 0.0])


# ----------------------------------------------------------------------------- lookahead (streaming)


def _first_changed(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """(first, last) frame where two [T, C] outputs differ."""
    changed = np.flatnonzero(np.any(np.abs(a - b) > 1e-6, axis=-1))
    return int(changed[0]), int(changed[-1])


@pytest.mark.parametrize("context", [1, 3])
def test_row_convolution_output_at_t_sees_frames_t_to_t_plus_context(context):
    """out_t = sum_j w_j * h_(t+j), j = 0..context (the DS2 paper's lookahead), zero past the
    sequence: perturbing frame s changes outputs s - context .. s and no other."""
    rng = np.random.default_rng(0)
    t, c = 12, 5
    x = rng.standard_normal((1, t, c)).astype(np.float32)
    lengths = jnp.array([t])
    conv = model.RowConv(context, jnp.float32)
    v = conv.init(jax.random.PRNGKey(0), jnp.asarray(x), lengths)
    w = np.asarray(v["params"]["Conv_0"]["kernel"])[:, 0, :]  # [context + 1, C]
    out = np.asarray(conv.apply(v, jnp.asarray(x), lengths))[0]
    padded = np.concatenate([x[0], np.zeros((context, c), np.float32)])
    want = sum(w[j] * padded[j : j + t] for j in range(context + 1))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    for s in (0, t // 2, t - 1):
        y = x.copy()
        y[0, s] += 1.0
        changed = np.asarray(conv.apply(v, jnp.asarray(y), lengths))[0]
        assert _first_changed(out, changed) == (max(s - context, 0), s), s


def test_unidirectional_model_looks_ahead_by_exactly_the_row_convolution_context():
    """A forward-only model's output at t depends on no input frame past the convs' reach of
    t + row_conv_context: perturbing one late input frame changes outputs from exactly
    `context` frames earlier than without the row convolution, and every output after."""
    rng = np.random.default_rng(1)
    feats = rng.standard_normal((1, 90, 161)).astype(np.float32)
    lengths = jnp.array([90])
    moved = feats.copy()
    moved[0, 60] += 3.0
    first = {}
    for context in (0, 4):
        cfg = small_cfg(num_rnn_layers=1, bidirectional=False, row_conv_context=context)
        a, _, v = run(cfg, jnp.asarray(feats), lengths)
        b, _, _ = run(cfg, jnp.asarray(moved), lengths, variables=v)
        first[context], last = _first_changed(a[0], b[0])
        assert last == a.shape[1] - 1  # the forward RNN carries it to the end
        np.testing.assert_array_equal(a[0, : first[context]], b[0, : first[context]])
    assert 0 < first[4] == first[0] - 4
