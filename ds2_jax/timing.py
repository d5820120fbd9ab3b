"""A model's emission delay: how late its CTC outputs come after the sound, for word timings.

A CTC model emits a letter while or after it sounds, late by an amount its training does not fix
and each model learns its own (two small models on the same audio: ~1.3 and ~3.4 output frames).
Words within a file lag alike, so one number per model corrects them all. It is measured without
timed transcripts: on held-out utterances whose speech begins after some silence, the first word's
first emission against the speech onset (the first sample at ONSET_FRACTION of the peak), median
over the utterances. `transcribe --timestamps` subtracts it from every word (decoding.word_timings),
measuring it once per checkpoint on the workdir's eval split into timing.json (layout.TIMING); `export` stores it
in the model's metadata.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from ds2_jax import files, layout

ONSET_FRACTION = 0.02  # speech starts at the first sample above 2% of the utterance's peak
MIN_LEAD_IN_S = 0.02  # utterances whose speech starts sooner have no silence to measure from
MAX_UTTERANCES = 200

log = logging.getLogger("ds2_jax")


def speech_onset(waveform: np.ndarray, sample_rate: int) -> float | None:
    """Seconds to the first sample above ONSET_FRACTION of the peak; None for silence."""
    magnitude = np.abs(waveform.astype(np.float32))
    peak = magnitude.max(initial=0.0)
    return float(np.argmax(magnitude > ONSET_FRACTION * peak)) / sample_rate if peak > 0 else None


def emission_delay(transcriber, waveforms: list[np.ndarray]) -> tuple[float, int]:
    """(median seconds from speech onset to the first word's start, utterances measured) over the
    `waveforms` that have a lead-in of silence and a transcribed word; (0.0, 0) with none."""
    from ds2_jax import decoding

    lags = []
    for wave, ids in zip(waveforms, transcriber.frame_outputs(waveforms)):
        onset = speech_onset(wave, transcriber.sample_rate)
        if isinstance(ids, BaseException) or onset is None or onset < MIN_LEAD_IN_S:
            continue
        words = decoding.word_timings(ids, len(ids), transcriber.alphabet, transcriber.frame_seconds)
        if words:
            lags.append(words[0].start - onset)
    return (float(np.median(lags)), len(lags)) if lags else (0.0, 0)


def eval_split_waveforms(config, max_utterances: int = MAX_UTTERANCES) -> tuple[str, list[np.ndarray]]:
    """(split, up to `max_utterances` int16 waveforms) of the run's eval split, read as evaluation does."""
    from ds2_jax.pipeline.batch import Sharding
    from ds2_jax.pipeline.source import make_source

    source = make_source(config, Sharding(global_batch=16))
    split = config.dataset.eval_split
    waves = []
    for batch in source.eval_batches(split, max_utterances):
        for audio, length, weight in zip(batch["audio"], batch["audio_lengths"], batch["weights"]):
            if weight:
                waves.append(np.asarray(audio[:length]))
    return split, waves


def recorded(workdir: str, step: int) -> float | None:
    """The delay timing.json (layout.TIMING) holds for checkpoint `step`, if any."""
    try:
        with open(os.path.join(workdir, layout.TIMING)) as f:
            entry = json.load(f).get(str(step))
    except (OSError, ValueError):
        return None
    return float(entry["emission_delay_s"]) if entry else None


def delay_of_workdir(workdir: str, transcriber) -> float:
    """The emission delay of the transcriber's checkpoint: recorded in the workdir's timing.json, or
    measured on its eval split and recorded there; 0 (uncorrected, said on stderr) where the eval
    split cannot be read or gives no word."""
    known = recorded(workdir, transcriber.step)
    if known is not None:
        return known
    try:
        split, waves = eval_split_waveforms(transcriber.config)
    except Exception as e:  # noqa: BLE001  (a workdir moved without its data: times stay uncorrected)
        log.warning("word timings uncorrected: the eval split to measure the model's delay on is unreadable (%s)", e)
        return 0.0
    delay, count = emission_delay(transcriber, waves)
    if not count:
        log.warning("word timings uncorrected: no utterance of %s gave a word after a lead-in of silence", split)
        return 0.0
    log.warning(
        "word timings: this model emits %.3f s after the sound (median of %d utterances of %s); "
        "subtracted from every word, recorded in %s",
        delay,
        count,
        split,
        layout.TIMING,
    )
    try:
        path = os.path.join(workdir, layout.TIMING)
        table = {}
        if os.path.exists(path):
            with open(path) as f:
                table = json.load(f)
        table[str(transcriber.step)] = {"emission_delay_s": delay, "utterances": count, "split": split}
        files.write_text(path, json.dumps(table, indent=1))
    except (OSError, ValueError) as e:
        log.warning("could not record the delay in %s (%s)", layout.TIMING, e)
    return delay
