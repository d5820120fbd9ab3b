"""Audio files -> text with a trained workdir or its export (--model): one 'path<TAB>text' line
per file on stdout, printed as each batch of --batch_size files is done (a tab, newline or backslash in a path is
written \\t, \\n, \\\\, so each line splits at its one tab).

    python -m ds2_jax.transcribe --workdir=W a.flac b.wav ...                 # greedy
    python -m ds2_jax.transcribe --workdir=W --lm=lm.arpa [--beam_width=32 \\
        --alpha=0.5 --beta=1.0] a.flac ...                                  # beam + LM
    python -m ds2_jax.transcribe --model=model.onnx a.flac ...              # an export: onnxruntime, no jax
    python -m ds2_jax.transcribe --workdir=W --timestamps [--json] a.flac   # word start/end seconds
    python -m ds2_jax.transcribe --workdir=W --stream [--chunk_ms=320] a.flac  # unidirectional: chunk by chunk

Restores the latest checkpoint of W (or --step=N, or --step=best: the lowest in-training eval
WER) with the config W was trained with (W/config.json) and the feature statistics stored in
its state. Reads anything libsndfile reads (WAV, FLAC, OGG, ...) at any sample rate and channel
count: channels are averaged, other rates resampled with soxr to the model's
(features.sample_rate; a lower rate with a warning). The model's sample rate and alphabet
(model.alphabet) come from W/config.json. A missing, empty or undecodable file gets
an 'error: <path>: <reason>' line on stderr and the rest still run; the exit code is 1
if any file failed. Long files run in overlapping windows (WINDOW_SECONDS), so memory is
bounded by the window, not by the file. Flags are checked before the model loads (exit 2);
Ctrl-C keeps the lines printed and says how far it got (exit 130); a reader that stops
reading (`| head -1`) ends it quietly.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import sys

import numpy as np

from ds2_jax import decoding, errors, geometry, settings

log = logging.getLogger("ds2_jax")
# Errors name decoding.* settings; here they are these flags.
FLAG_OF_SETTING = {
    "decoding.lm_path": "--lm",
    "decoding.lexicon_path": "--lexicon",
    "decoding.beam_width": "--beam_width",
    "decoding.alpha": "--alpha",
    "decoding.beta": "--beta",
}
PAD_SECONDS = 4.0  # Files are padded to a multiple of this: each multiple is one compiled shape.
# Longer files run in windows of WINDOW_SECONDS (memory and compiled shapes bounded by it),
# each overlapping its neighbours by CONTEXT_SECONDS on either side; the output frames of
# the overlaps are dropped (they lack context beyond the window), the rest are joined and
# decoded as one utterance.
WINDOW_SECONDS = 24.0
CONTEXT_SECONDS = 3.0


READ_BLOCK_SECONDS = 60.0  # A longer file is read, downmixed and resampled a block at a time.


def _open(path: str):
    """An open soundfile.SoundFile with frames; an AudioError that says what is wrong with it."""
    import soundfile

    if not os.path.exists(path):
        raise errors.AudioError("no such file")
    if os.path.isdir(path):
        raise errors.AudioError("a directory, not an audio file")
    if os.path.getsize(path) == 0:
        raise errors.AudioError("empty file (0 bytes)")
    try:
        open(path, "rb").close()
    except OSError as e:  # libsndfile would call it "System error"
        raise errors.AudioError(f"cannot be read: {(e.strerror or str(e)).lower()}") from e
    try:
        f = soundfile.SoundFile(path)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as e:
        raise errors.AudioError(f"not audio that libsndfile reads (WAV, FLAC, OGG, ...): {e}") from e
    if f.frames == 0:
        f.close()
        raise errors.AudioError("no samples (0 frames)")
    return f


def _int16(audio: np.ndarray) -> np.ndarray:
    if not np.isfinite(audio).all():  # a float WAV can hold them; int16 has no NaN
        raise errors.AudioError(f"{int(np.sum(~np.isfinite(audio)))} samples are NaN or infinite")
    return np.clip(np.round(audio * 32768.0), -32768, 32767).astype(np.int16)


def load_audio(path: str, sample_rate: int = 16_000) -> np.ndarray:
    """<int16>[S] mono waveform at `sample_rate` (downmixed, resampled with soxr).

    Audio below `sample_rate` is upsampled with a warning: the model never saw it, and
    nothing above half the file's rate is in it. A file longer than READ_BLOCK_SECONDS is
    read block by block, so memory holds the int16 result and one block, not the file's
    float32 channels (an hour of 44.1 kHz stereo: 1.3 GB)."""
    with _open(path) as f:
        rate, frames = f.samplerate, f.frames
        if rate < sample_rate:
            log.warning(
                "%s: %d Hz audio resampled to %d Hz; the model was trained on %d Hz audio, and nothing above "
                "%d Hz is in this file, so expect more errors",
                path,
                rate,
                sample_rate,
                sample_rate,
                rate // 2,
            )
        if rate != sample_rate:
            try:
                import soxr
            except ImportError as e:
                raise ImportError(
                    f"{rate} Hz audio needs soxr to resample to {sample_rate} Hz: pip install soxr"
                ) from e
        block = int(READ_BLOCK_SECONDS * rate)
        if 0 < frames <= block:
            audio = f.read(dtype="float32", always_2d=True).mean(axis=1)
            return _int16(audio if rate == sample_rate else soxr.resample(audio, rate, sample_rate, quality="HQ"))
        stream = (
            None if rate == sample_rate else soxr.ResampleStream(rate, sample_rate, 1, dtype="float32", quality="HQ")
        )
        parts = []
        for chunk in f.blocks(blocksize=block, dtype="float32", always_2d=True):
            mono = chunk.mean(axis=1)
            parts.append(_int16(mono if stream is None else stream.resample_chunk(mono)))
        if stream is not None:
            parts.append(_int16(stream.resample_chunk(np.zeros(0, np.float32), last=True)))
        return np.concatenate(parts)


class Transcriber:
    """A restored model plus a decoder; `transcribe` maps int16 waveforms at the model's rate to texts."""

    emission_delay = 0.0  # seconds taken off every word time: the model's (ds2_jax.timing); main sets it

    def __init__(
        self,
        workdir: str,
        decoder_cfg: settings.Decoding | None = None,
        step: int | str | None = None,
        batch_size: int = 8,
        config: settings.Settings | None = None,
        restored: tuple | None = None,
    ):
        """`config`: the workdir's (workdir_config.load_config), when the caller has read it already;
        `restored`: (state, step) of state.restore_state, when the caller has restored it already."""
        import jax

        from ds2_jax import eval_step, state, workdir_config

        self.config = config if config is not None else workdir_config.load_config(workdir)
        from ds2_jax import text

        self.alphabet = text.Alphabet.of_setting(self.config.model.alphabet)  # the model's outputs
        self.beam = decoding.make_beam_decoder(decoder_cfg or settings.Decoding(), self.alphabet)
        self.state, self.step = restored or state.restore_state(self.config, workdir, step)
        fc = self.config.features
        self.sample_rate, self.hop, self.window = fc.sample_rate, fc.hop, fc.window
        self.num_conv_layers = self.config.model.num_conv_layers
        self.batch_size = batch_size
        kw = state.step_kwargs(self.config)
        infer = jax.jit(
            functools.partial(
                eval_step.infer,
                model_cfg=kw["model_cfg"],
                feature_cfg=kw["feature_cfg"],
                log_probs=self.beam is not None,
            )
        )
        self._forward = functools.partial(infer, self.state)  # (audio, lengths) -> eval_step.decoder_inputs

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
            decoded = [
                decoding.greedy_texts(outputs[i][None], np.array([len(outputs[i])]), self.alphabet)[0] for i in good
            ]
        for i, t in zip(good, decoded):
            texts[i] = t
        return texts

    def transcribe_timed(self, waveforms: list[np.ndarray]) -> list[tuple[str, list[decoding.TimedWord]] | Exception]:
        """Each waveform's greedy text and its words' times (decoding.word_timings), or the error that
        stopped it; greedy decoding only (beam search's words have no frames here)."""
        if self.beam is not None:
            raise ValueError("word timings come from the greedy path: build the Transcriber with beam_width=0")
        out: list = []
        for ids in self.frame_outputs(waveforms):
            if isinstance(ids, BaseException):
                out.append(ids)
                continue
            words = decoding.word_timings(ids, len(ids), self.alphabet, self.frame_seconds, self.emission_delay)
            out.append((decoding.greedy_texts(ids[None], np.array([len(ids)]), self.alphabet)[0], words))
        return out

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

    def _too_short(self, num_samples: int) -> errors.AudioError | None:
        """An AudioError for audio too short to give the model one output frame."""
        frames = geometry.output_frames(geometry.num_frames(num_samples, self.window, self.hop), self.num_conv_layers)
        if frames >= 1:
            return None
        return errors.AudioError(
            f"too short: {1000 * num_samples / self.sample_rate:.0f} ms gives the model no output frame"
        )

    def frame_outputs(self, waveforms: list[np.ndarray]) -> list[np.ndarray | Exception]:
        """Per waveform: <int32>[T] greedy ids (or <float32>[T, 29] log-probs with a beam decoder)
        of its windows joined, or the error of a batch holding one of its windows."""
        pad = int(PAD_SECONDS * self.sample_rate)
        failed: dict[int, Exception] = {i: e for i, wav in enumerate(waveforms) if (e := self._too_short(len(wav)))}
        pieces = [(i, *w) for i, wav in enumerate(waveforms) if i not in failed for w in self.windows(len(wav))]
        order = sorted(range(len(pieces)), key=lambda p: pieces[p][2] - pieces[p][1])
        kept: list = [None] * len(pieces)
        key = "ids" if self.beam is None else "log_probs"
        for first in range(0, len(order), self.batch_size):
            rows = order[first : first + self.batch_size]
            try:
                samples = max(pad, -(-max(pieces[p][2] - pieces[p][1] for p in rows) // pad) * pad)
                audio = np.zeros((self.batch_size, samples), np.int16)
                lengths = np.zeros((self.batch_size,), np.int32)
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


class OnnxTranscriber(Transcriber):
    """A Transcriber of an exported model (ds2_jax.export), run by onnxruntime: no jax imported."""

    def __init__(self, path: str, decoder_cfg: settings.Decoding | None = None, batch_size: int = 8, threads: int = 0):
        from ds2_jax import onnx_model

        self.model = onnx_model.OnnxModel(path, threads)
        meta = self.model.meta
        self.alphabet, self.step = meta.alphabet, meta.step
        self.beam = decoding.make_beam_decoder(decoder_cfg or settings.Decoding(), self.alphabet)
        self.sample_rate, self.hop, self.window, self.num_conv_layers = (
            meta.sample_rate,
            meta.hop,
            meta.window,
            meta.num_conv_layers,
        )
        self.batch_size = batch_size
        self.emission_delay = meta.emission_delay_s
        self._forward = self.model.decoder_inputs


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_string("workdir", None, "A training workdir (config.json + checkpoints/); or --model.", flag_values=fv)
    flags.DEFINE_string(
        "model",
        None,
        "An exported model (python -m ds2_jax.export): run with onnxruntime, no jax; "
        "the decoding flags' defaults are settings.Decoding's.",
        flag_values=fv,
    )
    flags.DEFINE_integer("threads", 0, "With --model: onnxruntime's threads (0: all cores).", flag_values=fv)
    flags.DEFINE_string(
        "step",
        None,
        "Checkpoint step, or 'best' (the lowest in-training eval WER; keep_best_checkpoints); default: the latest.",
        flag_values=fv,
    )
    flags.DEFINE_string("lm", "", "KenLM ARPA/binary word LM: beam search with it.", flag_values=fv)
    flags.DEFINE_string(
        "lexicon",
        "",
        "Words the LM search may output, one per line (default: decoding.lexicon_path "
        "of the workdir's config with its LM, else the LM's unigrams).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "beam_width",
        None,
        "Beam search width; 0 = greedy (default: decoding.beam_width of the "
        f"workdir's config; {settings.LM_BEAM_WIDTH} with --lm if that is 0).",
        flag_values=fv,
    )
    flags.DEFINE_float("alpha", None, "LM weight (default: decoding.alpha of the workdir's config).", flag_values=fv)
    flags.DEFINE_float("beta", None, "Word bonus (default: decoding.beta of the workdir's config).", flag_values=fv)
    flags.DEFINE_integer("batch_size", 8, "Files per forward pass.", flag_values=fv)
    flags.DEFINE_boolean("ema_weights", True, settings.EMA_FLAG_HELP, flag_values=fv)
    flags.DEFINE_boolean(
        "timestamps",
        False,
        "Each word's start and end (seconds, from the greedy path's frames less the model's emission "
        "delay, measured once on the workdir's eval split into timing.json: ds2_jax.timing): a "
        "line '<TAB>start<TAB>end<TAB>word' per word after its file's line.",
        flag_values=fv,
    )
    flags.DEFINE_boolean(
        "stream",
        False,
        "Feed each file in --chunk_ms chunks to a unidirectional model "
        "(ds2_jax.streaming), greedy; 'partial:' lines on stderr as the text grows.",
        flag_values=fv,
    )
    flags.DEFINE_integer("chunk_ms", 320, "With --stream: milliseconds of audio per chunk.", flag_values=fv)
    flags.DEFINE_boolean(
        "json",
        False,
        "One JSON object per file and line: path, text (and words: word, start, end with --timestamps).",
        flag_values=fv,
    )


# Flags checked against the settings' ranges (settings.RANGES) before anything loads.
FLAG_RANGES = {"alpha": "decoding.alpha", "beta": "decoding.beta", "beam_width": "decoding.beam_width"}


def check_flags(args) -> None:
    """A usage error (exit 2) for a flag value the run cannot use, before the model loads."""
    from ds2_jax import cli

    for flag, key in FLAG_RANGES.items():
        value = getattr(args, flag)
        if value is not None and not settings.RANGES[key].holds(value):
            cli.usage_error(f"--{flag}={value}: must be {settings.RANGES[key].text()}")
    if args.batch_size < 1:
        cli.usage_error(f"--batch_size={args.batch_size}: must be >= 1")
    if (args.workdir is None) == (args.model is None):
        cli.usage_error("give one of --workdir (a training workdir) or --model (an exported ONNX model)")
    if args.model is not None and args.step is not None:
        cli.usage_error("--step reads a workdir's checkpoints; an exported --model holds one step")
    if args.threads < 0:
        cli.usage_error(f"--threads={args.threads}: must be >= 0")
    if args.stream and args.model is not None:
        cli.usage_error("--stream runs the JAX model of a --workdir, not an exported --model")
    if not 10 <= args.chunk_ms <= 60_000:
        cli.usage_error(f"--chunk_ms={args.chunk_ms}: must be 10..60000")


def decoder_settings(args, base: settings.Decoding) -> settings.Decoding:
    """The decoding settings of the flags over the workdir's (`base`): a flag given (0 too) wins; without
    --beam_width, the workdir's, or LM_BEAM_WIDTH with --lm when that is 0."""
    beam_width = (
        args.beam_width
        if args.beam_width is not None
        else (base.beam_width or (settings.LM_BEAM_WIDTH if args.lm else 0))
    )
    lm_path = args.lm if args.lm else (base.lm_path if beam_width else "")
    return dataclasses.replace(
        base,
        beam_width=beam_width,
        lm_path=lm_path,
        lexicon_path=args.lexicon or (base.lexicon_path if lm_path == base.lm_path else ""),
        alpha=base.alpha if args.alpha is None else args.alpha,
        beta=base.beta if args.beta is None else args.beta,
    )


def shown(path: str) -> str:
    """`path` for a 'path<TAB>text' line: backslash, tab and newline escaped, so the line splits at one tab."""
    return path.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def main(argv: list[str] | None = None) -> int:
    from ds2_jax import cli

    args, files = cli.parse_args(argv, define_flags, __doc__, positional="audio files")
    step = cli.checkpoint_step(args.step, "--step")  # None, a number or 'best'
    check_flags(args)

    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax's restore chatter
    try:
        if args.model is not None:
            transcriber = OnnxTranscriber(
                args.model, decoder_settings(args, settings.Decoding()), args.batch_size, args.threads
            )
        else:
            from ds2_jax import workdir_config

            config = workdir_config.load_config(args.workdir)  # read once: the Transcriber is handed it
            config = settings.choosing_weights(config, args.ema_weights)
            if args.stream:
                from ds2_jax import streaming

                streaming.refuse_bidirectional(config)
            transcriber = Transcriber(
                args.workdir,
                decoder_settings(args, config.decoding),
                step=step,
                batch_size=args.batch_size,
                config=config,
            )
    except ValueError as e:  # names decoding.* settings: say which flag
        raise ValueError(cli.in_flag_names(str(e), FLAG_OF_SETTING)) from e

    if (args.stream or args.timestamps) and transcriber.beam is not None:
        raise ValueError(
            f"--{'stream' if args.stream else 'timestamps'}: greedy decoding only (beam search's words "
            "have no frames here): drop --lm and use --beam_width=0"
        )
    if args.timestamps and args.workdir is not None:
        from ds2_jax import timing

        transcriber.emission_delay = timing.delay_of_workdir(args.workdir, transcriber)
    failed, done = 0, [0]  # done: files reported so far, counted line by line (a Ctrl-C may come between two)
    try:
        for first in range(0, len(files), args.batch_size):  # printed batch by batch: a pipe sees results as they come
            batch = files[first : first + args.batch_size]
            if args.stream:
                for path in batch:
                    done[0] += 1
                    failed += _stream_file(transcriber, path, args.chunk_ms, args.timestamps, args.json)
            else:
                failed += _transcribe_batch(transcriber, batch, done, args.timestamps, args.json)
    except KeyboardInterrupt:
        print(
            f"transcribe: interrupted after {done[0]} of {len(files)} files (their lines are above)",
            file=sys.stderr,
            flush=True,
        )
        return 130
    except BrokenPipeError:  # the reader stopped reading (| head -1): end quietly, as a shell tool does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's final flush of stdout must not fail again
        return 141  # 128 + SIGPIPE, as a tool the pipe's signal ended
    return 1 if failed else 0


def result_lines(path: str, text: str, words: list[decoding.TimedWord] | None, as_json: bool) -> str:
    """A file's output: 'path<TAB>text' (and a '<TAB>start<TAB>end<TAB>word' line per word), or one JSON line."""
    if as_json:
        record = {"path": path, "text": text}
        if words is not None:
            record["words"] = [{"word": w.word, "start": round(w.start, 3), "end": round(w.end, 3)} for w in words]
        return json.dumps(record)
    return "\n".join([f"{shown(path)}\t{text}", *(f"\t{w.start:.2f}\t{w.end:.2f}\t{w.word}" for w in words or [])])


def _stream_file(transcriber: Transcriber, path: str, chunk_ms: int, timestamps: bool, as_json: bool) -> int:
    """Streams one file through transcriber's model (ds2_jax.streaming), a 'partial:' line on stderr
    per chunk that changes the text (with the audio time and the chunk's compute time), then the
    file's line on stdout; returns 1 if it failed."""
    import time

    from ds2_jax import streaming

    try:
        audio = load_audio(path, transcriber.sample_rate)
    except Exception as e:  # noqa: BLE001  (any unreadable file: report it, go on)
        print(
            f"error: {path}: {e if isinstance(e, errors.AudioError) else f'{type(e).__name__}: {e}'}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    stream = streaming.Stream(transcriber.config, transcriber.state)
    chunk, frames, text = max(int(chunk_ms * transcriber.sample_rate / 1000), 1), [], ""
    for first in range(0, len(audio) + 1, chunk):
        start = time.perf_counter()
        last = first + chunk > len(audio)
        frames.append(stream.feed(audio[first : first + chunk]))
        if last:
            frames.append(stream.finish())
        ids = np.concatenate(frames).argmax(-1)
        now = decoding.greedy_texts(ids[None], np.array([len(ids)]), transcriber.alphabet)[0]
        if now != text and not last:
            print(
                f"partial: {shown(path)}: {now} ({min(first + chunk, len(audio)) / transcriber.sample_rate:.2f} s "
                f"of audio, {1000 * (time.perf_counter() - start):.0f} ms)",
                file=sys.stderr,
                flush=True,
            )
        text = now
        if last:
            break
    words = (
        decoding.word_timings(
            ids, len(ids), transcriber.alphabet, transcriber.frame_seconds, transcriber.emission_delay
        )
        if timestamps
        else None
    )
    print(result_lines(path, text, words, as_json), flush=True)
    return 0


def _transcribe_batch(
    transcriber: Transcriber, paths: list[str], done: list[int], timestamps: bool = False, as_json: bool = False
) -> int:
    """Prints each file's line (stdout) or error (stderr), counting it in done[0] just before;
    returns how many failed."""
    loaded, waveforms, failed = [], [], 0
    for path in paths:
        try:
            waveforms.append(load_audio(path, transcriber.sample_rate))
            loaded.append(path)
        except errors.AudioError as e:
            failed, done[0] = failed + 1, done[0] + 1
            print(f"error: {path}: {e}", file=sys.stderr, flush=True)
        except Exception as e:  # noqa: BLE001  (any unreadable file: report it, go on)
            failed, done[0] = failed + 1, done[0] + 1
            print(f"error: {path}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    run = transcriber.transcribe_timed if timestamps else transcriber.transcribe_each
    for path, t in zip(loaded, run(waveforms) if waveforms else []):
        done[0] += 1
        if isinstance(t, errors.AudioError):
            failed += 1
            print(f"error: {path}: {t}", file=sys.stderr, flush=True)
        elif isinstance(t, BaseException):
            failed += 1
            print(f"error: {path}: {type(t).__name__}: {errors.one_line(t)[:300]}", file=sys.stderr, flush=True)
        else:
            text, words = t if timestamps else (t, None)
            print(result_lines(path, text, words, as_json), flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
