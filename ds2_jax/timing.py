"""A workdir's emission delay measured on its eval split (the measurement itself, and the
record of it per checkpoint, are ds2_jax.infer.delay's; this module reads the split through the
input pipeline, which the inference wing never imports)."""

from __future__ import annotations

import logging

import numpy as np

from ds2_jax import layout
from ds2_jax.infer import delay as delay_lib

MAX_UTTERANCES = 200

log = logging.getLogger("ds2_jax")


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


def delay_of_workdir(workdir: str, engine) -> float | None:
    """The emission delay of the (JAX) engine's checkpoint: recorded in the workdir's timing.json (layout.TIMING),
    or measured on its eval split and recorded there; None (word times uncorrected, said on stderr)
    where the eval split cannot be read or gives no word."""
    known = delay_lib.recorded(workdir, engine.step)
    if known is not None:
        return known
    try:
        split, waves = eval_split_waveforms(engine.config)
    except Exception as e:  # noqa: BLE001  (a workdir moved without its data: times stay uncorrected)
        log.warning("word timings uncorrected: the eval split to measure the model's delay on is unreadable (%s)", e)
        return None
    delay, count = delay_lib.emission_delay(engine, waves)
    if not count:
        log.warning("word timings uncorrected: no utterance of %s gave a word after a lead-in of silence", split)
        return None
    log.warning(
        "word timings: this model emits %.3f s after the sound (median of %d utterances of %s); "
        "subtracted from every word, recorded in %s",
        delay,
        count,
        split,
        layout.TIMING,
    )
    delay_lib.record(workdir, engine.step, delay, count, split)
    return delay
