"""Streaming recognition with a unidirectional model (model.bidirectional=False): audio fed in
chunks, log-probabilities out as soon as every input they depend on has arrived.

    stream = Stream(config, state)          # a restored workdir's (state.restore_state)
    for chunk in chunks:                    # <int16>[n] samples, any n
        new = stream.feed(chunk)            # <float32>[frames, vocab] log-probs, maybe 0 frames
    rest = stream.finish()                  # the frames that waited for the end

What each stage carries across chunks:
  featurizer   the samples of the next window not yet whole (window - hop of overlap)
  each conv    its input frames still needed (the time kernel's reach, left padding at the start)
  batch norm   nothing: inference uses the running statistics, so it is per frame
  each RNN     its hidden state (LSTM: and its cell state)
  row conv     the last row_conv_context frames, the lookahead it waits for
`finish` supplies the zeros the whole-file model sees past the end (conv and row-conv padding),
so the frames joined equal the whole-file forward pass (tests/test_streaming.py). A bidirectional
model cannot stream: its backward RNN starts from the end of the utterance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ds2_jax import features, geometry, model, settings
from ds2_jax.activation import clipped_relu
from ds2_jax.rnn import reference


def refuse_bidirectional(config: settings.Settings) -> None:
    """A ValueError saying why a bidirectional model cannot stream."""
    if config.model.bidirectional:
        raise ValueError("--stream needs a unidirectional model (model.bidirectional=False, with its row-convolution "
                         "lookahead): this one is bidirectional, and its backward RNN starts from the end of each "
                         "utterance, so nothing is known before the audio ends; transcribe whole files instead")


class _Frames:
    """A time buffer of frames with the absolute index of its first one."""

    def __init__(self, frames: jax.Array, first: int):
        self.frames, self.first = frames, first

    @property
    def end(self) -> int:
        return self.first + self.frames.shape[0]

    def append(self, more: jax.Array) -> None:
        self.frames = jnp.concatenate([self.frames, more], axis=0)

    def drop_before(self, index: int) -> None:
        self.frames, self.first = self.frames[index - self.first :], index


class _ConvStage:
    """One ConvBlock, streamed: conv over the buffered frames, batch norm (running statistics),
    clipped ReLU; output frame j reads input frames [stride*j - pad, stride*j - pad + kernel)."""

    def __init__(self, spec: geometry.ConvSpec, params: dict, stats: dict, epsilon: float, in_shape: tuple):
        self.spec, self.kernel = spec, params["Conv_0"]["kernel"]
        bn = params["MaskedBatchNorm_0"]
        self.affine = (bn["scale"], bn["bias"], stats["MaskedBatchNorm_0"]["mean"], stats["MaskedBatchNorm_0"]["var"],
                       epsilon)
        self.buffer = _Frames(jnp.zeros((spec.padding[0], *in_shape), jnp.float32), -spec.padding[0])  # left padding
        self.next = 0  # the next output frame
        self.out_shape = (geometry.conv_out(in_shape[0], spec.kernel[1], spec.strides[1], spec.padding[1]),
                          self.kernel.shape[-1])

    def __call__(self, frames: jax.Array, last: bool = False) -> jax.Array:
        """[T, F, C] new input frames -> [T', F', C'] the output frames they complete (with `last`:
        all that remain, the right padding added)."""
        (k, _), (s, _), (p, pf) = self.spec.kernel, self.spec.strides, self.spec.padding
        self.buffer.append(frames)
        if last:
            self.buffer.append(jnp.zeros((p, *frames.shape[1:]), frames.dtype))
        count = max((self.buffer.end + p - k) // s + 1 - self.next, 0)
        start = s * self.next - p
        window = self.buffer.frames[start - self.buffer.first : start - self.buffer.first + s * (count - 1) + k]
        self.next += count
        self.buffer.drop_before(s * self.next - p)
        if count == 0:
            return jnp.zeros((0, *self.out_shape), jnp.float32)
        y = jax.lax.conv_general_dilated(window[None], self.kernel, (s, self.spec.strides[1]), ((0, 0), (pf, pf)),
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                         precision=jax.lax.Precision.HIGHEST)[0]
        return clipped_relu(model.batch_norm_affine(y, *self.affine))


class _RnnStage:
    """One RNNLayer (forward only), streamed: projection and batch norm per frame, the recurrence
    continued from the state the last chunk left."""

    def __init__(self, params: dict, stats: dict, cell: str, epsilon: float):
        self.projection = params["input_proj"]["kernel"]
        bn = params["input_proj_bn"]
        self.affine = (bn["scale"], bn["bias"], stats["input_proj_bn"]["mean"], stats["input_proj_bn"]["var"], epsilon)
        self.recurrent, self.cell = params["recurrent_kernel"], cell
        self.carry = reference.initial_carry(cell, 1, 1, self.recurrent.shape[1], jnp.float32)

    def __call__(self, x: jax.Array) -> jax.Array:
        """[T, D] -> [T, H]."""
        projected = model.batch_norm_affine(jnp.dot(x, self.projection, precision=jax.lax.Precision.HIGHEST),
                                            *self.affine)
        self.carry, ys = reference.recurrence_from(projected[:, None, None, :], self.recurrent, self.cell, self.carry)
        return ys[:, 0, 0, :]


class _RowConvStage:
    """The lookahead row convolution: frame t waits for frames t+1 .. t+context."""

    def __init__(self, kernel: jax.Array, width: int):
        self.kernel = kernel  # [context + 1, 1, C] depthwise
        self.context = kernel.shape[0] - 1
        self.buffer = _Frames(jnp.zeros((0, width), jnp.float32), 0)

    def __call__(self, x: jax.Array, last: bool = False) -> jax.Array:
        self.buffer.append(x)
        if last:
            self.buffer.append(jnp.zeros((self.context, x.shape[1]), x.dtype))
        count = max(self.buffer.frames.shape[0] - self.context, 0)
        window = self.buffer.frames[: count + self.context]
        out = sum(window[j : j + count] * self.kernel[j, 0] for j in range(self.context + 1))
        self.buffer.drop_before(self.buffer.first + count)
        return out


class Stream:
    """One utterance's streaming forward pass (float32) through a restored unidirectional model."""

    def __init__(self, config: settings.Settings, state):
        refuse_bidirectional(config)
        mc, self.fc = config.model, config.features.spectrogram
        params, stats = state.params, state.batch_stats
        self.mean, self.std = state.feature_mean, state.feature_std
        self.samples = np.zeros(0, np.int16)  # not yet in a whole window
        eps = mc.batch_norm_epsilon
        shape, self.convs = (self.fc.num_bins, 1), []
        for i, spec in enumerate(geometry.conv_specs(mc.num_conv_layers)):
            self.convs.append(_ConvStage(spec, params[f"ConvBlock_{i}"], stats[f"ConvBlock_{i}"], eps, shape))
            shape = self.convs[-1].out_shape
        self.rnns = [_RnnStage(params[f"RNNLayer_{i}"], stats[f"RNNLayer_{i}"], mc.rnn_cell, eps)
                     for i in range(mc.num_rnn_layers)]
        self.row_conv = _RowConvStage(params["RowConv_0"]["Conv_0"]["kernel"], mc.rnn_size) \
            if mc.row_conv_context > 0 else None
        self.output = params["output"]

    def feed(self, chunk: np.ndarray) -> np.ndarray:
        """<float32>[frames, vocab] log-probs of the output frames `chunk` (<int16>[n]) completes."""
        return self._run(np.asarray(chunk, np.int16), last=False)

    def finish(self) -> np.ndarray:
        """The log-probs of the frames that waited for the end of the audio."""
        return self._run(np.zeros(0, np.int16), last=True)

    def _spectrogram(self, chunk: np.ndarray) -> jax.Array:
        """[T, num_bins, 1] normalized features of the whole windows now complete."""
        self.samples = np.concatenate([self.samples, chunk])
        frames = geometry.num_frames(len(self.samples), self.fc.window, self.fc.hop)
        if frames == 0:
            return jnp.zeros((0, self.fc.num_bins, 1), jnp.float32)
        spec = features.log_spectrogram(self.samples[None, : (frames - 1) * self.fc.hop + self.fc.window], self.fc)[0]
        self.samples = self.samples[frames * self.fc.hop :]
        return ((spec - self.mean) / self.std)[..., None]

    def _run(self, chunk: np.ndarray, last: bool) -> np.ndarray:
        x = self._spectrogram(chunk)
        for conv in self.convs:
            x = conv(x, last)
        x = x.reshape(x.shape[0], x.shape[1] * x.shape[2])
        for rnn in self.rnns:
            x = rnn(x) if x.shape[0] else jnp.zeros((0, rnn.recurrent.shape[1]), jnp.float32)
        if self.row_conv is not None:
            x = self.row_conv(x, last)
        logits = jnp.dot(x, self.output["kernel"], precision=jax.lax.Precision.HIGHEST) + self.output["bias"]
        return np.asarray(jax.nn.log_softmax(logits, axis=-1))
