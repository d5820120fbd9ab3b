"""benchmarks.flops: the counted model FLOPs against XLA's own count of the same forward pass,
for every architecture choice that changes the products (conv layers, cells, directions,
shared projections, the row convolution)."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from benchmarks import flops
from ds2_jax import model, settings

# scan_unroll past the frames: XLA counts a loop body once, so the recurrence must be unrolled whole.
SMALL = dict(conv_channels=16, rnn_size=256, num_rnn_layers=1, rnn_impl="scan", scan_unroll=64)


def xla_forward_flops(cfg: model.ModelConfig, batch: int, frames: int) -> float:
    """XLA's cost analysis of the compiled forward pass (products and elementwise ops)."""
    net = model.DeepSpeech2(cfg)
    feats, lengths = jnp.zeros((batch, frames, cfg.num_bins)), jnp.full((batch,), frames, jnp.int32)
    # the parameters' shapes only (the count does not read their values): no init to run
    variables = jax.eval_shape(lambda: net.init(jax.random.PRNGKey(0), feats, lengths, train=False))
    compiled = jax.jit(lambda v, f, n: net.apply(v, f, n, train=False)).lower(variables, feats, lengths).compile()
    analysis = compiled.cost_analysis()
    return (analysis[0] if isinstance(analysis, list) else analysis)["flops"]


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"num_conv_layers": 1},
        {"num_conv_layers": 3},
        {"rnn_cell": "gru"},
        {"share_rnn_weights": False},
        {"bidirectional": False, "row_conv_context": 5},
        {"bidirectional": False, "row_conv_context": 0},
        # a character alphabet of Mandarin's size: the output layer is 28% of the products, not 0.4%
        {"alphabet": "".join(chr(0x4E00 + i) for i in range(3000))},
    ],
    ids=lambda changes: ",".join(f"{k}={v if len(str(v)) < 20 else len(v)}" for k, v in changes.items()) or "small",
)
@pytest.mark.slow
def test_counted_forward_flops_match_xla(changes):
    """Within the 2-7% of elementwise work (batch norm, clipping, masks) that XLA adds."""
    section = dataclasses.replace(settings.Model(), **{**SMALL, **changes})
    cfg = model.ModelConfig.of(section)
    batch, frames = 3, 25  # conv 1 (stride 3) leaves 8 frames
    counted = 2 * flops.forward_macs(cfg, batch, frames, cfg.num_bins)
    assert counted == pytest.approx(xla_forward_flops(cfg, batch, frames), rel=0.08)


def test_seed_step_is_about_90_gflop_per_8s_utterance():
    """The issue's rough count: ~90 GFLOP per 8 s utterance for forward and backward."""
    seed = model.ModelConfig.of(settings.Model())
    step = flops.train_step_flops(seed, 1, 801, 161)
    assert 85e9 < step < 95e9
    assert flops.train_step_flops(seed, 4, 801, 161) == 4 * step


def test_peak_is_the_most_specific_device_kind():
    assert flops.peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4e12
    assert flops.peak_flops("NVIDIA H100 PCIe", "bfloat16") == 756e12
    assert flops.peak_flops("NVIDIA H200", "bfloat16") == 989.4e12
    assert flops.peak_flops("NVIDIA A100-SXM4-80GB", "bfloat16") is None
    assert flops.peak_flops("cpu", "float32") is None
