"""A model's emission delay: how late its CTC outputs come after the sound, for word timings.

A CTC model emits a letter while or after it sounds, late by an amount its training does not fix
and each model learns its own (two small models on the same audio: ~1.3 and ~3.4 output frames).
Words within a file lag alike, so one number per model corrects them all. It is measured without
timed transcripts: on utterances whose speech begins after some silence, the first word's first
emission against the speech onset (the first sample at ONSET_FRACTION of the peak), median over
the utterances. Where it is measured: training's evals (ds2_jax.evaluation, on the eval split's
argmax paths), ds2_jax.timing (a workdir's eval split, by `transcribe --timestamps`, where no eval
recorded it), or export from the audio it is given (--delay_audio); it is recorded per checkpoint
in the workdir's layout.TIMING, and an export stores it in the model's metadata.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from ds2_jax import decoding, files, layout

ONSET_FRACTION = 0.02  # speech starts at the first sample above 2% of the utterance's peak
MIN_LEAD_IN_S = 0.02  # utterances whose speech starts sooner have no silence to measure from

log = logging.getLogger("ds2_jax")


def speech_onset(waveform: np.ndarray, sample_rate: int) -> float | None:
    """Seconds to the first sample above ONSET_FRACTION of the peak; None for silence."""
    magnitude = np.abs(waveform.astype(np.float32))
    peak = magnitude.max(initial=0.0)
    return float(np.argmax(magnitude > ONSET_FRACTION * peak)) / sample_rate if peak > 0 else None


def first_word_lag(wave: np.ndarray, ids: np.ndarray, sample_rate: int, alphabet, frame_seconds: float) -> float | None:
    """Seconds from `wave`'s speech onset to the first word's first emission in its <int32>[T]
    argmax path; None without a lead-in of silence or without a word."""
    onset = speech_onset(wave, sample_rate)
    if onset is None or onset < MIN_LEAD_IN_S:
        return None
    words = decoding.word_timings(ids, len(ids), alphabet, frame_seconds)
    return words[0].start - onset if words else None


def median_lag(lags: list[float | None]) -> tuple[float, int]:
    """(median of the measured lags, how many); (0.0, 0) with none (the caller says the delay is
    unmeasured: a count of 0 is never a delay)."""
    measured = [lag for lag in lags if lag is not None]
    return (float(np.median(measured)), len(measured)) if measured else (0.0, 0)


def emission_delay(engine, waveforms: list[np.ndarray]) -> tuple[float, int]:
    """(median seconds from speech onset to the first word's start, utterances measured) over the
    `waveforms` that have a lead-in of silence and a transcribed word, run by `engine`."""
    lags = [
        None
        if isinstance(ids, BaseException)
        else first_word_lag(wave, ids, engine.sample_rate, engine.alphabet, engine.frame_seconds)
        for wave, ids in zip(waveforms, engine.frame_outputs(waveforms))
    ]
    return median_lag(lags)


def recorded(workdir: str, step: int) -> float | None:
    """The delay layout.TIMING holds for checkpoint `step`, if any."""
    try:
        with open(os.path.join(workdir, layout.TIMING)) as f:
            entry = json.load(f).get(str(step))
    except (OSError, ValueError):
        return None
    return float(entry["emission_delay_s"]) if entry else None


def record(workdir: str, step: int, delay: float, count: int, source: str) -> None:
    """Adds checkpoint `step`'s delay (measured on `count` utterances of `source`) to layout.TIMING;
    a workdir that cannot be written is said on stderr, not an error."""
    path = os.path.join(workdir, layout.TIMING)
    try:
        table = {}
        if os.path.exists(path):
            with open(path) as f:
                table = json.load(f)
        table[str(step)] = {"emission_delay_s": delay, "utterances": count, "split": source}
        files.write_text(path, json.dumps(table, indent=1))
    except (OSError, ValueError) as e:
        log.warning("could not record the delay in %s (%s)", path, e)
