"""Audio files -> text with a trained workdir or its export (--model): one 'path<TAB>text' line
per file on stdout, printed as each batch of --batch_size files is done (a tab, newline or backslash in a path is
written \\t, \\n, \\\\, so each line splits at its one tab).

    python -m ds2_jax.transcribe --workdir=W a.flac b.wav ...                 # greedy
    python -m ds2_jax.transcribe --workdir=W --lm=lm.arpa [--beam_width=32 \\
        --alpha=0.5 --beta=1.0] a.flac ...                                  # beam + LM
    python -m ds2_jax.transcribe --model=model.onnx a.flac ...              # an export: onnxruntime, no jax
    python -m ds2_jax.transcribe --workdir=W --timestamps [--json] a.flac   # word start/end seconds
    python -m ds2_jax.transcribe --workdir=W --stream [--chunk_ms=320] a.flac  # chunk by chunk, partials

A thin command over the inference wing (ds2_jax.infer) and the one audio loader (ds2_jax.audio).
Restores the latest checkpoint of W (or --step=N, or --step=best: the lowest in-training eval
WER) with the config W was trained with (W/config.json) and the feature statistics stored in
its state. Reads anything libsndfile reads (WAV, FLAC, OGG, ...) at any sample rate and channel
count: channels are averaged, other rates resampled with soxr to the model's
(features.sample_rate; a lower rate with a warning). The model's sample rate and alphabet
(model.alphabet) come from W/config.json (or the export's metadata). A missing, empty or undecodable file gets
an 'error: <path>: <reason>' line on stderr and the rest still run; the exit code is 1
if any file failed. Long files run in overlapping windows (infer.engine.WINDOW_SECONDS), so memory is
bounded by the window, not by the file. Flags are checked before the model loads (exit 2);
Ctrl-C keeps the lines printed and says how far it got (exit 130); a reader that stops
reading (`| head -1`) ends it quietly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from ds2_jax import audio, decoding, errors, settings
from ds2_jax.infer import engine as engine_lib

# Errors name decoding.* settings; here they are these flags.
FLAG_OF_SETTING = {
    "decoding.lm_path": "--lm",
    "decoding.lexicon_path": "--lexicon",
    "decoding.beam_width": "--beam_width",
    "decoding.alpha": "--alpha",
    "decoding.beta": "--beta",
}


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
        "Feed each file in --chunk_ms chunks (ds2_jax.infer's stream), greedy; 'partial:' lines on "
        "stderr as the text changes. A unidirectional model's text grows frame by frame; a "
        "bidirectional model's is re-decoded from the start (every second or so) and may change.",
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
            from ds2_jax.infer import onnx_backend

            transcriber = onnx_backend.OnnxEngine(
                args.model, decoder_settings(args, settings.Decoding()), args.batch_size, args.threads
            )
        else:
            from ds2_jax import workdir_config
            from ds2_jax.infer import jax_backend

            config = workdir_config.load_config(args.workdir)  # read once: the engine is handed it
            config = settings.choosing_weights(config, args.ema_weights)
            transcriber = jax_backend.JaxEngine(
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
    if args.timestamps and args.workdir is not None and transcriber.emission_delay is None:
        from ds2_jax import timing

        transcriber.emission_delay = timing.delay_of_workdir(args.workdir, transcriber)
    elif args.timestamps and transcriber.emission_delay is None:
        print(
            f"warning: {args.model} does not know its emission delay (its export could not measure it): "
            "word times are uncorrected, a few frames late; export it again with --delay_audio",
            file=sys.stderr,
            flush=True,
        )
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


def _stream_file(transcriber: engine_lib.Engine, path: str, chunk_ms: int, timestamps: bool, as_json: bool) -> int:
    """Streams one file through transcriber's model (engine.stream), a 'partial:' line on stderr
    per chunk that changes the text (with the audio time and the chunk's compute time), then the
    file's line on stdout; returns 1 if it failed."""
    import time

    try:
        samples = audio.read(path, transcriber.sample_rate)
    except Exception as e:  # noqa: BLE001  (any unreadable file: report it, go on)
        print(
            f"error: {path}: {e if isinstance(e, errors.AudioError) else f'{type(e).__name__}: {e}'}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    utterance = transcriber.stream()
    chunk, text = max(int(chunk_ms * transcriber.sample_rate / 1000), 1), ""
    for first in range(0, len(samples), chunk):
        start = time.perf_counter()
        now = utterance.feed(samples[first : first + chunk])
        if now != text:
            print(
                f"partial: {shown(path)}: {now} ({min(first + chunk, len(samples)) / transcriber.sample_rate:.2f} s "
                f"of audio, {1000 * (time.perf_counter() - start):.0f} ms)",
                file=sys.stderr,
                flush=True,
            )
        text = now
    text = utterance.finish()
    print(result_lines(path, text, utterance.words() if timestamps else None, as_json), flush=True)
    return 0


def _transcribe_batch(
    transcriber: engine_lib.Engine, paths: list[str], done: list[int], timestamps: bool = False, as_json: bool = False
) -> int:
    """Prints each file's line (stdout) or error (stderr), counting it in done[0] just before;
    returns how many failed."""
    loaded, waveforms, failed = [], [], 0
    for path in paths:
        try:
            waveforms.append(audio.read(path, transcriber.sample_rate))
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
