"""The engine of an exported model (ds2_jax.export), run by onnxruntime: no jax imported."""

from __future__ import annotations

import numpy as np

from ds2_jax import decoding, geometry, settings
from ds2_jax.infer import engine, onnx_model


class OnnxEngine(engine.Engine):
    """An exported file; its geometry, alphabet and emission delay come from its metadata."""

    def __init__(self, path: str, decoder_cfg: settings.Decoding | None = None, batch_size: int = 8, threads: int = 0):
        self.model = onnx_model.OnnxModel(path, threads)
        meta = self.meta = self.model.meta
        self.alphabet, self.step = meta.alphabet, meta.step
        self.beam = decoding.make_beam_decoder(decoder_cfg or settings.Decoding(), self.alphabet)
        self.sample_rate, self.hop, self.window = meta.sample_rate, meta.hop, meta.window
        self.num_conv_layers, self.bidirectional = meta.num_conv_layers, meta.bidirectional
        self.lookahead_seconds = meta.lookahead_seconds
        self.batch_size, self.fixed_batch = batch_size, False
        self.emission_delay = meta.emission_delay_s
        self._forward = self.model.decoder_inputs

    def _log_prob_stream(self):
        return PrefixStream(self)


class PrefixStream:
    """Streaming through a whole-utterance graph: each feed runs the model over all the audio so far
    and emits the output frames whose lookahead has arrived (for a unidirectional model those
    frames no longer change: they equal the whole file's). Compute grows with the utterance, so a
    server bounds a stream's length."""

    def __init__(self, engine_: OnnxEngine):
        self.engine, self.audio, self.emitted = engine_, np.zeros(0, np.int16), 0
        self.stride = engine_.hop * geometry.FIRST_CONV.strides[0]  # samples per output frame
        self.lookahead = round(engine_.lookahead_seconds * engine_.sample_rate)

    def _run(self) -> np.ndarray:
        if len(self.audio) < self.engine.window:
            return np.zeros((0, self.engine.alphabet.vocab_size), np.float32)
        out = self.engine.model.decoder_inputs(self.audio[None], np.array([len(self.audio)], np.int32))
        return out["log_probs"][0, : int(out["lengths"][0])]

    def feed(self, chunk: np.ndarray) -> np.ndarray:
        self.audio = np.concatenate([self.audio, chunk])
        # frame j is final once samples up to stride*j + hop + lookahead have arrived
        ready = max((len(self.audio) - self.engine.hop - self.lookahead) // self.stride + 1, 0)
        if ready <= self.emitted:
            return np.zeros((0, self.engine.alphabet.vocab_size), np.float32)
        frames = self._run()[self.emitted : ready]
        self.emitted += len(frames)
        return frames

    def finish(self) -> np.ndarray:
        frames = self._run()[self.emitted :]
        self.emitted += len(frames)
        return frames
