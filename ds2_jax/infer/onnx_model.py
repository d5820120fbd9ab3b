"""An exported model (ds2_jax.export) run with onnxruntime and numpy only: this module and
the transcribe path through it import no jax, so an application needs neither jax nor a GPU stack.

    model = OnnxModel("model.onnx")
    out = model.decoder_inputs(audio, audio_lengths)   # <int16>[B, S], <int32>[B]
    out["log_probs"], out["ids"], out["lengths"]       # [B, T, vocab], [B, T], [B]

The graph takes the log spectrogram; `log_spectrogram` computes it in numpy, as
features.log_spectrogram does in jnp, with the constants of the file's metadata (the ds2_jax.*
keys, `MetaData`), which also say how to read its frames. MetaData is the one spelling of those
keys: export writes `MetaData.of_config(...).props()`, a runner reads `MetaData.of(props)`.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from ds2_jax import geometry, settings, text

FORMAT_KEY = "ds2_jax.format"
FORMAT = "1"
INPUTS = ("spectrogram", "frames")
OUTPUTS = ("log_probs", "lengths")
PREFIX = "ds2_jax."
# The emission_delay_s metadata value of a file whose export could not measure the delay.
UNMEASURED = "unmeasured"


def lookahead_seconds(config: settings.Settings) -> float:
    """How far past an output frame's own audio its value looks (unidirectional models; a
    bidirectional one sees the whole file): the analysis window beyond its hop, each conv's right
    padding, and the row convolution's context."""
    fc, mc = config.features.spectrogram, config.model
    frames, spacing = 0, 1  # lookahead in spectrogram frames; spectrogram frames per layer input frame
    for spec in geometry.conv_specs(mc.num_conv_layers):
        frames += spec.padding[0] * spacing
        spacing *= spec.strides[0]
    frames += mc.row_conv_context * spacing
    return (frames * fc.hop + fc.window - fc.hop) / fc.sample_rate


@dataclasses.dataclass(frozen=True)
class MetaData:
    """What a runner needs from the file (ds2_jax.export.metadata writes it)."""

    alphabet: text.Alphabet
    sample_rate: int
    hop: int
    window: int
    eps: float
    num_conv_layers: int
    frame_seconds: float  # one output frame: hop x the first conv's time stride
    bidirectional: bool
    lookahead_seconds: float
    step: int
    # Subtracted from word times (ds2_jax.infer.delay); None where the export could not measure it
    # (the file says UNMEASURED) or predates it: word times are then uncorrected, and a runner says so.
    emission_delay_s: float | None = None

    @classmethod
    def of_config(cls, config: settings.Settings, step: int, emission_delay_s: float | None) -> "MetaData":
        """The metadata of a model trained with `config` at checkpoint `step`."""
        fc, mc = config.features.spectrogram, config.model
        return cls(
            alphabet=text.Alphabet.of_setting(mc.alphabet),
            sample_rate=fc.sample_rate,
            hop=fc.hop,
            window=fc.window,
            eps=fc.eps,
            num_conv_layers=mc.num_conv_layers,
            frame_seconds=fc.hop * geometry.FIRST_CONV.strides[0] / fc.sample_rate,
            bidirectional=mc.bidirectional,
            lookahead_seconds=lookahead_seconds(config),
            step=step,
            emission_delay_s=emission_delay_s,
        )

    def props(self) -> dict[str, str]:
        """The file's ds2_jax keys, as strings (`of` reads them back)."""
        delay = UNMEASURED if self.emission_delay_s is None else repr(float(self.emission_delay_s))
        values = {
            "format": FORMAT,
            "alphabet": self.alphabet.setting,
            "sample_rate": str(self.sample_rate),
            "hop": str(self.hop),
            "window": str(self.window),
            "eps": repr(self.eps),
            "num_conv_layers": str(self.num_conv_layers),
            "frame_seconds": repr(self.frame_seconds),
            "bidirectional": str(self.bidirectional).lower(),
            "lookahead_seconds": repr(self.lookahead_seconds),
            "step": str(self.step),
            "emission_delay_s": delay,
        }
        return {PREFIX + k: v for k, v in values.items()}

    @classmethod
    def of(cls, props: dict[str, str], path: str) -> "MetaData":
        """The metadata of `props` (the file's custom metadata); a ValueError naming `path` if it
        is not a ds2_jax export of this format."""
        if props.get(FORMAT_KEY) != FORMAT:
            found = (
                f"format {props[FORMAT_KEY]!r}, this ds2_jax reads {FORMAT!r}"
                if FORMAT_KEY in props
                else (f"no {FORMAT_KEY} in its metadata")
            )
            raise ValueError(f"{path}: not a ds2_jax export ({found}); write one with python -m ds2_jax.export")
        try:
            return cls(
                alphabet=text.Alphabet.of_setting(props["ds2_jax.alphabet"]),
                sample_rate=int(props["ds2_jax.sample_rate"]),
                hop=int(props["ds2_jax.hop"]),
                window=int(props["ds2_jax.window"]),
                eps=float(props["ds2_jax.eps"]),
                num_conv_layers=int(props["ds2_jax.num_conv_layers"]),
                frame_seconds=float(props["ds2_jax.frame_seconds"]),
                bidirectional=props["ds2_jax.bidirectional"] == "true",
                lookahead_seconds=float(props["ds2_jax.lookahead_seconds"]),
                step=int(props["ds2_jax.step"]),
                emission_delay_s=_delay(props.get("ds2_jax.emission_delay_s", UNMEASURED)),
            )
        except (KeyError, ValueError) as e:
            raise ValueError(
                f"{path}: a ds2_jax export with damaged metadata ({type(e).__name__}: {e}); export it again"
            ) from e


def _delay(value: str) -> float | None:
    return None if value == UNMEASURED else float(value)


def log_spectrogram(audio: np.ndarray, meta: MetaData) -> np.ndarray:
    """<int16>[B, S] -> <float32>[B, T, window // 2 + 1] log power spectrum, T = whole windows in S:
    features.log_spectrogram in numpy (Paddle DS2's: Hann window, power scaled by the window's
    energy and the sample rate, non-edge bins doubled, log(power + eps))."""
    x = np.asarray(audio, np.float32) / 32768.0
    if x.shape[1] < meta.window:
        return np.zeros((x.shape[0], 0, meta.window // 2 + 1), np.float32)
    frames = np.lib.stride_tricks.sliding_window_view(x, meta.window, axis=1)[:, :: meta.hop]
    window = np.hanning(meta.window).astype(np.float32)
    power = np.abs(np.fft.rfft(frames * window, axis=-1)) ** 2
    scale = np.sum(window**2) * meta.sample_rate
    bin_scale = np.full((power.shape[-1],), 2.0 / scale)
    bin_scale[[0, -1]] = 1.0 / scale
    return np.log(power * bin_scale + meta.eps).astype(np.float32)


def num_frames(num_samples, meta: MetaData):
    """Whole analysis windows in `num_samples` (geometry.num_frames)."""
    return np.maximum((np.asarray(num_samples) - meta.window) // meta.hop + 1, 0)


class OnnxModel:
    """An onnxruntime session of an exported model and its MetaData."""

    def __init__(self, path: str, threads: int = 0):
        """threads: onnxruntime's intra-op threads (0: its default, all cores)."""
        try:
            import onnxruntime as ort
        except ImportError as e:
            raise ImportError(f"running an ONNX model needs onnxruntime: pip install onnxruntime ({e})") from e
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such file")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3  # onnxruntime's warnings about unused initializers are noise here
        try:
            self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001  (onnxruntime raises its own Fail, InvalidProtobuf, ...)
            raise ValueError(
                f"{path}: not an ONNX model onnxruntime loads ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
            ) from e
        self.meta = MetaData.of(self.session.get_modelmeta().custom_metadata_map, path)

    def decoder_inputs(self, audio: np.ndarray, audio_lengths: np.ndarray) -> dict[str, np.ndarray]:
        """{'log_probs': <float32>[B, T, vocab], 'ids': <int32>[B, T] argmax path, 'lengths': <int32>[B]}
        of <int16>[B, S] zero-padded waveforms (S >= one window) and their <int32>[B] lengths: what
        greedy and beam decoding read (as ds2_jax.forward.infer's)."""
        spectrogram = log_spectrogram(audio, self.meta)
        frames = num_frames(audio_lengths, self.meta).astype(np.int32)
        log_probs, lengths = self.session.run(list(OUTPUTS), {INPUTS[0]: spectrogram, INPUTS[1]: frames})
        return {"log_probs": log_probs, "ids": log_probs.argmax(-1).astype(np.int32), "lengths": lengths}
