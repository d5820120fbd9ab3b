"""DeepSpeech2 (Paddle's DS2 seed configuration and its variants) in Flax Linen.

Every layer takes and returns (inputs, lengths): padding travels through the conv
stack (lengths from the strides, padded frames re-zeroed), batch norm (statistics over
valid frames only, optionally summed over devices), the RNNs (the backward direction
starts from a zero state at each sequence's last valid frame) and the output layer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ds2_jax import geometry, settings, space_to_depth, text
from ds2_jax.activation import clipped_relu
from ds2_jax.rnn import recurrence

CELL_GATES = {"simple": 1, "gru": 3, "lstm": 4}
DTYPES = {name: getattr(jnp, name) for name in settings.DTYPES}


@dataclasses.dataclass(frozen=True)
class ModelConfig(settings.Model):
    """The architecture: config.model (settings.Model, checked there) plus the input and
    output widths; read by the JAX model and its PyTorch twin."""

    num_bins: int = 161
    vocab_size: int = text.VOCAB_SIZE

    @classmethod
    def of(cls, section: settings.Model, num_bins: int = 161) -> "ModelConfig":
        """config.model (checked when the Settings were built) with the input width."""
        return cls(
            **{f.name: getattr(section, f.name) for f in dataclasses.fields(settings.Model)},
            num_bins=num_bins,
            vocab_size=text.Alphabet.of_setting(section.alphabet).vocab_size,
        )

    @property
    def compute_dtype(self):
        return DTYPES[self.dtype]


def time_mask(lengths: jax.Array, num_steps: int) -> jax.Array:
    """<bool>[B, T]: True on valid frames."""
    # An iota, not arange()[None, :]: it converts to ONNX with a symbolic num_steps (jax2onnx).
    return jax.lax.broadcasted_iota(jnp.int32, (lengths.shape[0], num_steps), 1) < jnp.expand_dims(lengths, 1)


def mask_time(x: jax.Array, lengths: jax.Array) -> jax.Array:
    """Zeros frames at and beyond `lengths` along axis 1."""
    mask = time_mask(lengths, x.shape[1]).reshape(x.shape[:2] + (1,) * (x.ndim - 2))
    return jnp.where(mask, x, jnp.zeros((), x.dtype))


class MaskedBatchNorm(nn.Module):
    """Batch norm over the last axis with statistics from valid frames only.

    With `axis_name` the sums and counts are psum'd, so every device normalizes with
    the statistics of the global batch (synchronized batch norm).
    """

    momentum: float = 0.99
    epsilon: float = 1e-5
    axis_name: str | None = None
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array, train: bool) -> jax.Array:
        """x: [B, T, ..., C]; mask: <bool>[B, T]."""
        c = x.shape[-1]
        ra_mean = self.variable("batch_stats", "mean", lambda: jnp.zeros((c,), jnp.float32))
        ra_var = self.variable("batch_stats", "var", lambda: jnp.ones((c,), jnp.float32))
        scale = self.param("scale", nn.initializers.ones, (c,), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (c,), jnp.float32)
        xf = x.astype(jnp.float32)  # statistics and the affine in float32 (their gradient sums too)
        if train:
            m = mask.reshape(mask.shape + (1,) * (x.ndim - 2)).astype(jnp.float32)
            reduce_axes = tuple(range(x.ndim - 1))
            per_row = 1.0
            for d in x.shape[2:-1]:
                per_row *= d
            count = jnp.sum(m) * per_row
            total = jnp.sum(xf * m, axis=reduce_axes)
            if self.axis_name is not None:
                count, total = jax.lax.psum((count, total), self.axis_name)
            mean = total / jnp.maximum(count, 1.0)
            sq = jnp.sum(jnp.square(xf - mean) * m, axis=reduce_axes)
            if self.axis_name is not None:
                sq = jax.lax.psum(sq, self.axis_name)
            var = sq / jnp.maximum(count, 1.0)
            if not self.is_initializing():
                ra_mean.value = self.momentum * ra_mean.value + (1 - self.momentum) * mean
                ra_var.value = self.momentum * ra_var.value + (1 - self.momentum) * var
        else:
            mean, var = ra_mean.value, ra_var.value
        return batch_norm_affine(xf, scale, bias, mean, var, self.epsilon).astype(self.dtype)


def batch_norm_affine(x, scale, bias, mean, var, epsilon: float):
    """x normalized by (mean, var) and scaled: per channel, so per frame with the running statistics
    (inference; ds2_jax.infer.streaming applies it chunk by chunk)."""
    mul = scale * jax.lax.rsqrt(var + epsilon)
    return x * mul + (bias - mean * mul)


class ConvBlock(nn.Module):
    """Conv (no bias) -> masked batch norm -> clipped ReLU -> re-mask padded frames."""

    spec: geometry.ConvSpec
    channels: int
    cfg: ModelConfig
    axis_name: str | None

    @nn.compact
    def __call__(self, x, lengths, train: bool):
        """x: [B, T, F, C_in] -> [B, T', F', channels]; lengths: frames [B] -> [B]."""
        s = self.spec
        x = nn.Conv(
            self.channels,
            kernel_size=s.kernel,
            strides=s.strides,
            padding=((s.padding[0], s.padding[0]), (s.padding[1], s.padding[1])),
            use_bias=False,
            dtype=self.cfg.compute_dtype,
            param_dtype=jnp.float32,
            conv_general_dilated=space_to_depth.conv if self.cfg.conv_impl == "space_to_depth" else None,
        )(x)
        lengths = geometry.conv_out(lengths, s.kernel[0], s.strides[0], s.padding[0])
        x = _batch_norm(self.cfg, self.axis_name)(x, time_mask(lengths, x.shape[1]), train)
        return mask_time(clipped_relu(x), lengths), lengths


def _batch_norm(cfg: ModelConfig, axis_name, name=None) -> MaskedBatchNorm:
    return MaskedBatchNorm(
        momentum=cfg.batch_norm_momentum,
        epsilon=cfg.batch_norm_epsilon,
        axis_name=axis_name if cfg.sync_batch_norm else None,
        dtype=cfg.compute_dtype,
        name=name,
    )


class RNNLayer(nn.Module):
    """Input projection (no bias) + batch norm, then a recurrence per direction.

    With share_rnn_weights (Paddle DS2) one projection and one batch norm feed both
    directions; otherwise each direction has its own. Directions are concatenated.
    """

    cfg: ModelConfig
    axis_name: str | None

    @nn.compact
    def __call__(self, x, lengths, train: bool):
        """x: [B, T, D] -> [B, T, H * directions]."""
        cfg = self.cfg
        gates = CELL_GATES[cfg.rnn_cell]
        width = gates * cfg.rnn_size
        num_dirs = 2 if cfg.bidirectional else 1
        mask = time_mask(lengths, x.shape[1])

        def projection(name):
            p = nn.Dense(width, use_bias=False, dtype=cfg.compute_dtype, param_dtype=jnp.float32, name=name)(x)
            return _batch_norm(cfg, self.axis_name, name=f"{name}_bn")(p, mask, train)

        if cfg.share_rnn_weights or num_dirs == 1:
            projections = [projection("input_proj")]  # read by every direction
        else:
            projections = [projection(f"input_proj_{d}") for d in ("fwd", "bwd")]
        recurrent = self.param(
            "recurrent_kernel",
            nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", batch_axis=(0,)),
            (num_dirs, cfg.rnn_size, width),
            jnp.float32,
        )
        h = recurrence.bidirectional(
            projections,
            recurrent,  # float32: each recurrence casts it for its products and returns a float32 gradient
            lengths,
            cell=cfg.rnn_cell,
            impl=cfg.rnn_impl,
            unroll=cfg.scan_unroll,
        )
        return mask_time(h, lengths)


class RowConv(nn.Module):
    """Lookahead row convolution (DS2 paper): out_t = sum_j w_j * h_{t+j}, j = 0..context."""

    context: int
    dtype: Any

    @nn.compact
    def __call__(self, x, lengths):
        c = x.shape[-1]
        x = nn.Conv(
            c,
            kernel_size=(self.context + 1,),
            padding=((0, self.context),),
            feature_group_count=c,
            use_bias=False,
            dtype=self.dtype,
            param_dtype=jnp.float32,
        )(x)
        return mask_time(x, lengths)


class DeepSpeech2(nn.Module):
    """Normalized features -> per-frame logits over blank + 28 symbols."""

    cfg: ModelConfig
    axis_name: str | None = None

    @nn.compact
    def __call__(self, feats: jax.Array, lengths: jax.Array, train: bool) -> tuple[jax.Array, jax.Array]:
        """feats: <float32>[B, T, bins], lengths: <int32>[B] frames.

        Returns (<float32>[B, T', vocab] logits, <int32>[B] output frames).
        """
        cfg = self.cfg
        x = mask_time(feats.astype(cfg.compute_dtype), lengths)[..., None]
        for spec in geometry.conv_specs(cfg.num_conv_layers):
            x, lengths = ConvBlock(spec, cfg.conv_channels, cfg, self.axis_name)(x, lengths, train)
        b, t = x.shape[:2]
        x = x.reshape(b, t, -1)
        for _ in range(cfg.num_rnn_layers):
            x = RNNLayer(cfg, self.axis_name)(x, lengths, train)
        if not cfg.bidirectional and cfg.row_conv_context > 0:
            x = RowConv(cfg.row_conv_context, cfg.compute_dtype)(x, lengths)
        # The output layer in float32: bfloat16 logits of magnitude 16-32 are 0.125 apart, and the
        # bias gradient is a sum over every frame of the batch.
        logits = nn.Dense(cfg.vocab_size, dtype=jnp.float32, param_dtype=jnp.float32, name="output")(x)
        return logits, lengths


def count_params(params) -> int:
    return sum(x.size for x in jax.tree_util.tree_leaves(params))
