"""The engine interface: int16 waveforms at the model's rate -> texts, word times, streams.

`Engine` holds what both backends share: the windows a long file runs in, batching by length,
greedy or beam decoding, word timings, and the streams (`Utterance` for a unidirectional model,
`RedecodedUtterance` for a bidirectional one). A backend (jax_backend:
a workdir's checkpoint; onnx_backend: an exported file) supplies the model's geometry, `_forward`
(a padded batch -> decoder inputs) and `_log_prob_stream` (a streaming forward pass).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ds2_jax import decoding, errors, geometry, text

PAD_SECONDS = 4.0  # Files are padded to a multiple of this: each multiple is one compiled shape.
# Longer files run in windows of WINDOW_SECONDS (memory and compiled shapes bounded by it),
# each overlapping its neighbours by CONTEXT_SECONDS on either side; the output frames of
# the overlaps are dropped (they lack context beyond the window), the rest are joined and
# decoded as one utterance.
WINDOW_SECONDS = 24.0
CONTEXT_SECONDS = 3.0


PIECE_HOPS = 10  # a streaming model is fed this many feature hops at a time

# A bidirectional model's backward RNN starts from the end of the audio, so its stream re-decodes all
# the audio so far once REDECODE_SECONDS, and REDECODE_SHARE of what it last decoded, have come since:
# a partial every second at first, then further apart, so the decodes of a stream of L seconds cover
# at most (2 + 1/SHARE) L + n (n + 1) / 2 SECONDS of audio, n = 1/SHARE (10 L + 36 s): linear in L.
REDECODE_SECONDS = 1.0
REDECODE_SHARE = 1 / 8


class Engine:
    """A model plus a decoder. Backends set the attributes below and implement `_forward`."""

    sample_rate: int
    hop: int
    window: int
    num_conv_layers: int
    alphabet: text.Alphabet
    step: int
    bidirectional: bool
    lookahead_seconds: float
    batch_size: int = 8
    # Whether every forward pass has batch_size rows (jax: one compiled shape per length) or only
    # the rows it holds (onnxruntime takes any batch: a server's partial batch computes no padding rows).
    fixed_batch: bool = True
    beam: object = None  # decoding's beam decoder, or None: greedy
    # Seconds taken off every word time (ds2_jax.infer.delay); None where unmeasured (uncorrected).
    emission_delay: float | None = None

    def _forward(self, audio: np.ndarray, lengths: np.ndarray) -> dict[str, np.ndarray]:
        """<int16>[B, S], <int32>[B] -> {'ids' <int32>[B, T] (argmax), 'log_probs' <float32>[B, T, V]
        (with a beam decoder), 'lengths' <int32>[B]}."""
        raise NotImplementedError

    def _log_prob_stream(self):
        """An object with feed(<int16>[n]) and finish() -> <float32>[frames, vocab] log-probs."""
        raise NotImplementedError

    @property
    def frame_seconds(self) -> float:
        """Seconds per output frame: the hop times the first conv's time stride."""
        return self.hop * geometry.FIRST_CONV.strides[0] / self.sample_rate

    def transcribe(self, waveforms: list[np.ndarray]) -> list[str]:
        """Texts of <int16>[S_i] waveforms (see transcribe_each); the first failure is raised."""
        texts = self.transcribe_each(waveforms)
        for t in texts:
            if isinstance(t, BaseException):
                raise t
        return texts

    def transcribe_each(self, waveforms: list[np.ndarray]) -> list[str | Exception]:
        """Each waveform's text, or the error that stopped it (the others still run). Long
        files run in windows (see WINDOW_SECONDS), all windows batched by length."""
        outputs = self.frame_outputs(waveforms)
        texts: list[str | Exception] = list(outputs)
        good = [i for i, o in enumerate(outputs) if not isinstance(o, BaseException)]
        if self.beam is not None:
            decoded = self.beam.decode_all([outputs[i] for i in good])
        else:
            decoded = [greedy_text(outputs[i], self.alphabet) for i in good]
        for i, t in zip(good, decoded):
            texts[i] = t
        return texts

    def transcribe_timed(self, waveforms: list[np.ndarray]) -> list[tuple[str, list[decoding.TimedWord]] | Exception]:
        """Each waveform's greedy text and its words' times (decoding.word_timings), or the error that
        stopped it; greedy decoding only (beam search's words have no frames here)."""
        if self.beam is not None:
            raise ValueError("word timings come from the greedy path: build the engine with beam_width=0")
        out: list = []
        for ids in self.frame_outputs(waveforms):
            out.append(ids if isinstance(ids, BaseException) else (greedy_text(ids, self.alphabet), self.words(ids)))
        return out

    def words(self, ids: np.ndarray) -> list[decoding.TimedWord]:
        """The timed words of one <int32>[T] argmax path, less the emission delay where it is known."""
        return decoding.word_timings(ids, len(ids), self.alphabet, self.frame_seconds, self.emission_delay or 0.0)

    def windows(self, num_samples: int) -> list[tuple[int, int, int, int]]:
        """(first sample, end sample, first kept output frame, end kept frame, both counted from
        the window's first) of each window of a file; one window for a file that fits in one."""
        hop = self.hop
        total = geometry.output_frames(geometry.num_frames(num_samples, self.window, hop), self.num_conv_layers)
        window = int(WINDOW_SECONDS * self.sample_rate)
        if num_samples <= window:
            return [(0, num_samples, 0, total)]
        stride = hop * geometry.FIRST_CONV.strides[0]  # samples per output frame; windows start on one
        window_frames, context = window // stride, int(CONTEXT_SECONDS * self.sample_rate) // stride
        core = window_frames - 2 * context
        out = []
        for first in range(0, total, core):
            start = max(first - context, 0)
            out.append(
                (
                    start * stride,
                    min(start * stride + window, num_samples),
                    first - start,
                    min(first + core, total) - start,
                )
            )
        return out

    def too_short(self, num_samples: int) -> errors.AudioError | None:
        """An AudioError for audio too short to give the model one output frame."""
        frames = geometry.output_frames(geometry.num_frames(num_samples, self.window, self.hop), self.num_conv_layers)
        if frames >= 1:
            return None
        return errors.AudioError(
            f"too short: {1000 * num_samples / self.sample_rate:.0f} ms gives the model no output frame"
        )

    def frame_outputs(self, waveforms: list[np.ndarray], batch_size: int | None = None) -> list[np.ndarray | Exception]:
        """Per waveform: <int32>[T] greedy ids (or <float32>[T, 29] log-probs with a beam decoder)
        of its windows joined, or the error of a batch holding one of its windows. `batch_size`: the
        windows per forward pass of this call (default the engine's)."""
        batch_size = batch_size or self.batch_size
        pad = int(PAD_SECONDS * self.sample_rate)
        failed: dict[int, Exception] = {i: e for i, wav in enumerate(waveforms) if (e := self.too_short(len(wav)))}
        pieces = [(i, *w) for i, wav in enumerate(waveforms) if i not in failed for w in self.windows(len(wav))]
        order = sorted(range(len(pieces)), key=lambda p: pieces[p][2] - pieces[p][1])
        kept: list = [None] * len(pieces)
        key = "ids" if self.beam is None else "log_probs"
        for first in range(0, len(order), batch_size):
            rows = order[first : first + batch_size]
            try:
                samples = max(pad, -(-max(pieces[p][2] - pieces[p][1] for p in rows) // pad) * pad)
                count = batch_size if self.fixed_batch else len(rows)
                audio = np.zeros((count, samples), np.int16)
                lengths = np.zeros((count,), np.int32)
                for j, p in enumerate(rows):
                    i, s0, s1, _, _ = pieces[p]
                    audio[j, : s1 - s0] = waveforms[i][s0:s1]
                    lengths[j] = s1 - s0
                out = {k: np.asarray(v) for k, v in self._forward(audio, lengths).items()}
                for j, p in enumerate(rows):
                    _, _, _, k0, k1 = pieces[p]
                    kept[p] = out[key][j, k0 : min(k1, int(out["lengths"][j]))]
            except Exception as e:  # noqa: BLE001  (out of memory, a bad file: its files fail, not all)
                for p in rows:
                    failed.setdefault(pieces[p][0], e)
        mine: list[list] = [[] for _ in waveforms]
        for p, piece in enumerate(pieces):  # in file order, then window order
            mine[piece[0]].append(kept[p])
        return [failed[i] if i in failed else np.concatenate(mine[i]) for i in range(len(waveforms))]

    def stream(self) -> "Utterance | RedecodedUtterance":
        """A stream of one utterance (greedy): a unidirectional model's frames as their lookahead
        arrives; a bidirectional model's text re-decoded from the start (RedecodedUtterance)."""
        if self.bidirectional:
            return RedecodedUtterance(self)
        return Utterance(self, model=self._log_prob_stream())


def greedy_text(ids: np.ndarray, alphabet: text.Alphabet) -> str:
    """The text of one <int32>[T] argmax path."""
    return decoding.greedy_texts(np.asarray(ids)[None], np.array([len(ids)]), alphabet)[0]


@dataclasses.dataclass
class _Stream:
    """What both kinds of stream share: `feed` chunks, `finish` once, then `words`; `ids` the greedy
    path so far."""

    engine: Engine
    samples: int = 0
    finished: bool = False

    def __post_init__(self):
        self.ids = np.zeros(0, np.int32)

    @property
    def text(self) -> str:
        return greedy_text(self.ids, self.engine.alphabet)

    @property
    def seconds(self) -> float:
        return self.samples / self.engine.sample_rate

    def words(self) -> list[decoding.TimedWord]:
        return self.engine.words(self.ids)

    def _check_open(self) -> None:
        if self.finished:
            raise ValueError("this utterance is finished")


@dataclasses.dataclass
class Utterance(_Stream):
    """A unidirectional model's stream: each output frame once its lookahead has arrived, so the
    text only grows, and the final equals the whole file's.

    Whatever sizes the chunks come in, the model is fed pieces of PIECE_HOPS hops (and at the end
    the rest in power-of-two numbers of hops), so a jax backend compiles its streaming stages for
    a few shapes, not one per chunk size; the frames are the same either way."""

    model: object = dataclasses.field(default=None, kw_only=True)  # the backend's log-prob stream

    def __post_init__(self):
        super().__post_init__()
        self.pending = np.zeros(0, np.int16)  # samples not yet fed to the model

    def feed(self, chunk: np.ndarray) -> str:
        """The text so far after <int16>[n] more samples (frames wait for their lookahead)."""
        self._check_open()
        self.samples += len(chunk)
        self.pending = np.concatenate([self.pending, np.asarray(chunk, np.int16)])
        piece = PIECE_HOPS * self.engine.hop
        whole = len(self.pending) // piece * piece
        for first in range(0, whole, piece):
            self._add(self.model.feed(self.pending[first : first + piece]))
        self.pending = self.pending[whole:]
        return self.text

    def finish(self) -> str:
        """The final text: the rest fed, and the frames that waited for the end of the audio added."""
        if not self.finished:
            hops = len(self.pending) // self.engine.hop
            first = 0
            for bit in reversed(range(hops.bit_length())):  # the rest as 2^k hops, largest first
                if hops >> bit & 1:
                    size = (1 << bit) * self.engine.hop
                    self._add(self.model.feed(self.pending[first : first + size]))
                    first += size
            if first < len(self.pending):
                self._add(self.model.feed(self.pending[first:]))  # under a hop: no new frame
            self.finished = True
            self._add(self.model.finish())
        return self.text

    def _add(self, log_probs: np.ndarray) -> None:
        self.ids = np.concatenate([self.ids, np.asarray(log_probs).argmax(-1).astype(np.int32)])


@dataclasses.dataclass
class RedecodedUtterance(_Stream):
    """A bidirectional model's stream: a partial is the whole-file pass over all the audio so far,
    re-run when enough has come (REDECODE_SECONDS, REDECODE_SHARE), so its text may change as more
    arrives; the final is that pass over all of it, the text `transcribe` gives the same audio.
    A partial runs as many rows a forward pass as its audio has windows (up to batch_size): a jax
    engine otherwise computes batch_size rows (on a CPU 1 row of 4 s took a seventh of 8 rows' time),
    and one window a pass puts a long stream's windows in series (on a GPU 5x the time at 300 s).
    The final runs as `transcribe` does."""

    def __post_init__(self):
        super().__post_init__()
        self.chunks: list[np.ndarray] = []
        self.decoded = 0  # samples in the last decode

    def feed(self, chunk: np.ndarray) -> str:
        """The text so far after <int16>[n] more samples: re-decoded when due, else the last decode's."""
        self._check_open()
        self.chunks.append(np.asarray(chunk, np.int16))
        self.samples += len(chunk)
        due = max(REDECODE_SECONDS * self.engine.sample_rate, REDECODE_SHARE * self.decoded)
        if self.samples - self.decoded >= due:
            self._decode()
        return self.text

    def finish(self) -> str:
        """The final text: all the audio decoded as one file (empty where it gives no output frame)."""
        if not self.finished:
            self.finished = True
            self._decode(final=True)
        return self.text

    def _decode(self, final: bool = False) -> None:
        audio = np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.int16)
        self.chunks = [audio]
        if self.engine.too_short(len(audio)) is not None:
            return  # no output frame yet
        rows = None if final else min(len(self.engine.windows(len(audio))), self.engine.batch_size)
        out = self.engine.frame_outputs([audio], batch_size=rows)[0]
        if isinstance(out, BaseException):
            raise out
        self.ids = (out if out.ndim == 1 else out.argmax(-1)).astype(np.int32)  # log-probs with a beam decoder
        self.decoded = len(audio)
