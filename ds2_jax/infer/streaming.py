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
model cannot stream frame by frame: its backward RNN starts from the end of the utterance
(engine.RedecodedUtterance re-decodes it from the start instead).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ds2_jax import features, geometry, model, settings
from ds2_jax.activation import clipped_relu
from ds2_jax.rnn import reference


def refuse_bidirectional(config: settings.Settings) -> None:
    """A ValueError for a bidirectional model: its backward RNN needs the end of the audio
    (engine.stream re-decodes such a model instead of coming here)."""
    if config.model.bidirectional:
        raise ValueError("a frame-by-frame stream needs a unidirectional model (model.bidirectional=False)")


# The compute of each stage, compiled once per input shape (a fixed chunk size gives a few);
# the buffers between them are numpy arrays, so appending and dropping frames compiles nothing.


@functools.partial(jax.jit, static_argnames=("strides", "freq_pad", "epsilon"))
def _conv_block(window, kernel, scale, bias, mean, var, *, strides, freq_pad, epsilon):
    """ConvBlock's conv (no time padding: the buffer holds it), batch norm, clipped ReLU of [T, F, C] frames."""
    y = jax.lax.conv_general_dilated(
        window[None], kernel, strides, ((0, 0), (freq_pad, freq_pad)), dimension_numbers=("NHWC", "HWIO", "NHWC")
    )[0]
    return clipped_relu(model.batch_norm_affine(y, scale, bias, mean, var, epsilon))


@functools.partial(jax.jit, static_argnames=("cell", "epsilon"))
def _rnn_layer(x, carry, projection, scale, bias, mean, var, recurrent, *, cell, epsilon):
    """(carry, [T, H] states) of RNNLayer's projection, batch norm and recurrence from `carry`."""
    projected = model.batch_norm_affine(x @ projection, scale, bias, mean, var, epsilon)
    carry, ys = reference.recurrence_from(projected[:, None, None, :], recurrent, cell, carry)
    return carry, ys[:, 0, 0, :]


@jax.jit
def _row_conv_and_output(window, kernel, out_kernel, out_bias):
    """Log-probs of the row convolution (kernel [context + 1, 1, C]) over `window` and the output layer."""
    context = kernel.shape[0] - 1
    count = window.shape[0] - context
    x = sum(window[j : j + count] * kernel[j, 0] for j in range(context + 1))
    return jax.nn.log_softmax(x @ out_kernel + out_bias, axis=-1)


@functools.partial(jax.jit, static_argnames=("fc",))
def _normalized_spectrogram(audio, mean, std, *, fc):
    return (features.log_spectrogram(audio, fc) - mean) / std


class _Frames:
    """A time buffer of frames (numpy) with the absolute index of its first one."""

    def __init__(self, frames: np.ndarray, first: int):
        self.frames, self.first = frames, first

    @property
    def end(self) -> int:
        return self.first + self.frames.shape[0]

    def append(self, more: np.ndarray) -> None:
        self.frames = np.concatenate([self.frames, np.asarray(more, np.float32)], axis=0)

    def drop_before(self, index: int) -> None:
        self.frames, self.first = self.frames[index - self.first :], index


class _ConvStage:
    """One ConvBlock, streamed: conv over the buffered frames, batch norm (running statistics),
    clipped ReLU; output frame j reads input frames [stride*j - pad, stride*j - pad + kernel)."""

    def __init__(self, spec: geometry.ConvSpec, params: dict, stats: dict, epsilon: float, in_shape: tuple):
        self.spec, self.kernel = spec, params["Conv_0"]["kernel"]
        bn = params["MaskedBatchNorm_0"]
        self.affine = (
            bn["scale"],
            bn["bias"],
            stats["MaskedBatchNorm_0"]["mean"],
            stats["MaskedBatchNorm_0"]["var"],
            epsilon,
        )
        self.buffer = _Frames(np.zeros((spec.padding[0], *in_shape), np.float32), -spec.padding[0])  # left padding
        self.next = 0  # the next output frame
        self.out_shape = (
            geometry.conv_out(in_shape[0], spec.kernel[1], spec.strides[1], spec.padding[1]),
            self.kernel.shape[-1],
        )

    def __call__(self, frames: np.ndarray, last: bool = False) -> np.ndarray:
        """[T, F, C] new input frames -> [T', F', C'] the output frames they complete (with `last`:
        all that remain, the right padding added)."""
        (k, _), (s, _), (p, pf) = self.spec.kernel, self.spec.strides, self.spec.padding
        self.buffer.append(frames)
        if last:
            self.buffer.append(np.zeros((p, *frames.shape[1:]), np.float32))
        count = max((self.buffer.end + p - k) // s + 1 - self.next, 0)
        start = s * self.next - p
        window = self.buffer.frames[start - self.buffer.first : start - self.buffer.first + s * (count - 1) + k]
        self.next += count
        self.buffer.drop_before(s * self.next - p)
        if count == 0:
            return np.zeros((0, *self.out_shape), np.float32)
        return np.asarray(
            _conv_block(
                window,
                self.kernel,
                *self.affine[:4],
                strides=tuple(self.spec.strides),
                freq_pad=pf,
                epsilon=self.affine[4],
            )
        )


class _RnnStage:
    """One RNNLayer (forward only), streamed: projection and batch norm per frame, the recurrence
    continued from the state the last chunk left."""

    def __init__(self, params: dict, stats: dict, cell: str, epsilon: float):
        self.projection = params["input_proj"]["kernel"]
        bn = params["input_proj_bn"]
        self.affine = (bn["scale"], bn["bias"], stats["input_proj_bn"]["mean"], stats["input_proj_bn"]["var"], epsilon)
        self.recurrent, self.cell = params["recurrent_kernel"], cell
        self.carry = reference.initial_carry(cell, 1, 1, self.recurrent.shape[1], jnp.float32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """[T, D] -> [T, H]."""
        if x.shape[0] == 0:
            return np.zeros((0, self.recurrent.shape[1]), np.float32)
        self.carry, ys = _rnn_layer(
            x, self.carry, self.projection, *self.affine[:4], self.recurrent, cell=self.cell, epsilon=self.affine[4]
        )
        return np.asarray(ys)


class _RowConvAndOutput:
    """The lookahead row convolution (frame t waits for frames t+1 .. t+context) and the output layer."""

    def __init__(self, kernel: jax.Array, output: dict, width: int):
        self.kernel, self.output = kernel, output  # kernel: [context + 1, 1, C] depthwise
        self.context = kernel.shape[0] - 1
        self.buffer = _Frames(np.zeros((0, width), np.float32), 0)

    def __call__(self, x: np.ndarray, last: bool = False) -> np.ndarray:
        """[T, H] RNN states -> [T', vocab] log-probs of the frames whose lookahead is complete."""
        self.buffer.append(x)
        if last:
            self.buffer.append(np.zeros((self.context, x.shape[1]), np.float32))
        count = max(self.buffer.frames.shape[0] - self.context, 0)
        if count == 0:
            return np.zeros((0, self.output["bias"].shape[0]), np.float32)
        out = _row_conv_and_output(
            self.buffer.frames[: count + self.context], self.kernel, self.output["kernel"], self.output["bias"]
        )
        self.buffer.drop_before(self.buffer.first + count)
        return np.asarray(out)


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
        self.rnns = [
            _RnnStage(params[f"RNNLayer_{i}"], stats[f"RNNLayer_{i}"], mc.rnn_cell, eps)
            for i in range(mc.num_rnn_layers)
        ]
        # Without a row convolution (row_conv_context=0), one tap of weight 1: the identity
        kernel = (
            params["RowConv_0"]["Conv_0"]["kernel"]
            if mc.row_conv_context > 0
            else np.ones((1, 1, mc.rnn_size), np.float32)
        )
        self.head = _RowConvAndOutput(kernel, params["output"], mc.rnn_size)

    def feed(self, chunk: np.ndarray) -> np.ndarray:
        """<float32>[frames, vocab] log-probs of the output frames `chunk` (<int16>[n]) completes."""
        return self._run(np.asarray(chunk, np.int16), last=False)

    def finish(self) -> np.ndarray:
        """The log-probs of the frames that waited for the end of the audio."""
        return self._run(np.zeros(0, np.int16), last=True)

    def _spectrogram(self, chunk: np.ndarray) -> np.ndarray:
        """[T, num_bins, 1] normalized features of the whole windows now complete."""
        self.samples = np.concatenate([self.samples, chunk])
        frames = geometry.num_frames(len(self.samples), self.fc.window, self.fc.hop)
        if frames == 0:
            return np.zeros((0, self.fc.num_bins, 1), np.float32)
        used = self.samples[None, : (frames - 1) * self.fc.hop + self.fc.window]
        self.samples = self.samples[frames * self.fc.hop :]
        return np.asarray(_normalized_spectrogram(used, self.mean, self.std, fc=self.fc))[0, ..., None]

    def _run(self, chunk: np.ndarray, last: bool) -> np.ndarray:
        x = self._spectrogram(chunk)
        for conv in self.convs:
            x = conv(x, last)
        x = x.reshape(x.shape[0], x.shape[1] * x.shape[2])
        for rnn in self.rnns:
            x = rnn(x)
        return self.head(x, last)
