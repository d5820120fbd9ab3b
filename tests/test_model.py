"""Model: conv output lengths, padding invariance, variants, parameter counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ds2_jax import geometry, model


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
        11 * 41 * 32 + 11 * 21 * 32 * 32 + 2 * 2 * 32  # convs + their BN
        + rnn_in * 2048 + 2 * 2048 + 2 * 2048 * 2048  # layer 1
        + 2 * (4096 * 2048 + 2 * 2048 + 2 * 2048 * 2048)  # layers 2, 3
        + 4096 * 29 + 29
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
