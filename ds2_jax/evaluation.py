"""Evaluations: WER/CER of a split (greedy and beam), over the splits of a checkpoint (--mode=eval).

    python launch.py --config=configs/demo.py --workdir=W --mode=eval \\
        [--config.eval.split=test-clean,dev-clean] \\
        [--config.decoding.beam_width=32 --config.decoding.lm_path=lm.arpa]

`evaluate` runs the eval step (ds2_jax.eval_step) over a split and scores it; during
training it reads the train state where it lives on the devices. --mode=eval restores a
checkpoint with the workdir's config.json (workdir_config.config_for_eval), places it once,
scores each listed split and writes one result file per split and decoder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable

import jax
import numpy as np

from ds2_jax import (
    checkpoint,
    decoding,
    eval_step,
    files,
    layout,
    memory,
    metrics,
    parallel,
    settings,
    text,
    workdir_config,
)
from ds2_jax.batch_axis import AXIS
from ds2_jax.infer import delay
from ds2_jax.pipeline.source import Source, make_source
from ds2_jax.state import TrainState, restore_state, step_kwargs

log = logging.getLogger("ds2_jax")


@dataclasses.dataclass
class SplitOutputs:
    """What the model said about one split, on the host."""

    references: list[str]
    greedy: list[str]
    log_probs: list[np.ndarray] | None  # per utterance <float32>[T_i, vocab]; None without beam
    loss: float
    lags: list[float | None] = dataclasses.field(default_factory=list)  # per utterance, with `lag_of`


def run_split(
    p_eval,
    state,
    source,
    split: str,
    max_utterances: int,
    par: parallel.Parallel,
    on_batch: Callable[[], None] | None = None,
    lag_of: Callable[[np.ndarray, np.ndarray], float | None] | None = None,
) -> SplitOutputs:
    """Runs `p_eval` (eval_step.compile_eval_step for `par`) on `state` (placed by `par`) over a split;
    keeps log-probs when the step returns them. `on_batch()` after each batch (the watchdog);
    `lag_of(<int16>[S] audio, <int32>[T] argmax path)`: each utterance's emission lag (infer.delay)."""
    refs, hyps, lps, sums, lags = [], [], [], [], []
    # Read and place ahead in a thread, so the next batches load while this one runs.
    with contextlib.closing(par.put_batches(source.eval_batches(split, max_utterances), 2, with_host=True)) as batches:
        for batch, inputs in batches:
            out, s = p_eval(state, inputs)
            out = par.get_rows(out)
            sums.append(par.get(s))
            rows = np.flatnonzero(batch["weights"] > 0)
            refs += [source.alphabet.decode(batch["labels"][i, : batch["label_lengths"][i]]) for i in rows]
            hyps += decoding.greedy_texts(out["ids"][rows], out["lengths"][rows], source.alphabet)
            if "log_probs" in out:
                lps += [out["log_probs"][i, : out["lengths"][i]] for i in rows]
            if lag_of is not None:
                audio, samples = batch["audio"], batch["audio_lengths"]
                lags += [lag_of(audio[i, : samples[i]], out["ids"][i, : out["lengths"][i]]) for i in rows]
            if on_batch is not None:
                on_batch()
    total = metrics.reduce_sums(sums)
    loss = total.get("loss_sum", 0.0) / max(total.get("loss_count", 0.0), 1.0)
    return SplitOutputs(refs, hyps, lps if lps else None, loss, lags)


def evaluate(
    p_eval,
    state,
    source,
    split: str,
    max_utterances: int,
    par: parallel.Parallel,
    beam: decoding.BeamSearchDecoder | None = None,
    on_batch: Callable[[], None] | None = None,
    lag_of: Callable[[np.ndarray, np.ndarray], float | None] | None = None,
) -> dict:
    """Greedy (and, with `beam` and a log-prob step, beam search) WER/CER and loss of a split.

    The top-level wer/cer/examples/worst are greedy's, as during training; beam search
    adds a 'beam' section with its own figures and settings. With `lag_of` (see run_split), the
    model's emission delay too: 'emission_delay_s' (median) over 'delay_utterances' (0: unmeasured).
    """
    out = run_split(p_eval, state, source, split, max_utterances, par, on_batch, lag_of)
    # With several processes each one decoded its own rows; every process scores them all.
    references, greedy = gather_texts(out.references), gather_texts(out.greedy)
    result = {**eval_step.score(references, greedy), "loss": out.loss, "utterances": len(references)}
    if beam is not None:
        if out.log_probs is None and out.references:
            raise ValueError("beam search needs eval_step.compile_eval_step(par, step_kwargs, log_probs=True)")
        beam_hyps = gather_texts(beam.decode_all(out.log_probs or []))
        result["beam"] = {**beam.describe(), **eval_step.score(references, beam_hyps)}
    if lag_of is not None:
        result["emission_delay_s"], result["delay_utterances"] = delay.median_lag(gather_texts(out.lags))
    return result


def gather_texts(texts: list) -> list:
    """Concatenates every process's list of texts (or other JSON values), in process order; the list
    itself with one process.

    The gather is a pmap'd all_gather over all devices, the same collective group as the
    train and eval steps, so no new communicator is set up.
    """
    if jax.process_count() == 1:
        return texts
    n_local = jax.local_device_count()
    gather = jax.pmap(lambda x: jax.lax.all_gather(x, AXIS), axis_name=AXIS)

    def all_rows(row: np.ndarray) -> np.ndarray:
        local = np.zeros((n_local,) + row.shape, row.dtype)
        local[0] = row  # one row per process; the other local devices send zeros
        return np.asarray(gather(local)[0])

    blob = np.frombuffer(json.dumps(texts).encode(), np.uint8)
    sizes = all_rows(np.array([blob.size], np.int32)).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: blob.size] = blob
    blobs = all_rows(padded)
    return [t for b, n in zip(blobs, sizes) if n for t in json.loads(bytes(b[:n]).decode())]


@dataclasses.dataclass
class EvalRun:
    """A restored checkpoint, placed once, ready for run_split / evaluate."""

    p_eval: Callable
    state: TrainState  # placed by `par` (put_replicated)
    source: Source
    par: parallel.Parallel
    step: int


def prepare(config: settings.Settings, workdir: str, step: int | str | None = None, log_probs: bool = False) -> EvalRun:
    """Restores checkpoint `step` (default: latest; 'best': state.restore_state), places it on the devices as
    config.parallelism says, and builds the source (this process's rows) and the eval step."""
    par = parallel.make(config)
    sharding = par.batch_sharding(config.per_device_batch_size)
    source = make_source(config, sharding)
    check_alphabet(config, source, workdir)
    memory.check_host_memory(config, sharding.local_batch, source.shapes(), 3)  # 2 read ahead, 1 in the step
    state, step = restore_state(config, workdir, step)
    p_eval = eval_step.compile_eval_step(par, step_kwargs(config), log_probs)
    return EvalRun(p_eval, par.put_replicated(state), source, par, step)


def check_alphabet(config: settings.Settings, source: Source, workdir: str) -> None:
    """A ValueError naming both alphabets when the model's (config.model.alphabet, from the
    workdir's config.json) is not the one of the data it is scored on."""
    trained = text.Alphabet.of_setting(config.model.alphabet)
    if trained != source.alphabet:
        raise ValueError(
            f"the model in {workdir} emits the alphabet {trained.describe()} (model.alphabet in its config.json), but "
            f"dataset.name={config.dataset.name!r} "
            f"({config.dataset.manual_dir or config.dataset.data_dir or 'synthetic'})"
            f" holds the alphabet {source.alphabet.describe()}: evaluate on data prepared with the model's alphabet "
            "(dataset.vocabulary, or the data it was trained on)"
        )


def split_list(spec: str) -> list[str]:
    """'test-clean, test-other' -> ['test-clean', 'test-other'] (each scored on its own)."""
    splits = [s.strip() for s in spec.split(",") if s.strip()]
    if not splits:
        raise ValueError(f"no split in eval.split={spec!r}")
    return splits


def _stem(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", os.path.basename(path).split(".")[0]) or "lm"


def lm_name(path: str) -> str:
    """'<file stem>-<hash of its absolute path>': two LMs named lm.arpa in two folders differ."""
    return f"{_stem(path)}-{hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:8]}"


def decoding_tag(beam: decoding.BeamSearchDecoder | None) -> str:
    """'greedy', 'beam32', or with an LM 'beam32-lm-<lm file stem>-a0.5-b1-<hash>': eval results
    of different decoders never share a file. The hash covers every other decoding setting
    (the LM's and lexicon's full paths, the pruning), and appears when any differs from its default."""
    if beam is None:
        return "greedy"
    cfg = beam.cfg
    tag = f"beam{cfg.beam_width}"
    if cfg.lm_path:
        tag += f"-lm-{_stem(cfg.lm_path)}-a{beam.alpha:g}-b{beam.beta:g}"
    rest = lambda c: {  # noqa: E731
        k: os.path.abspath(v) if k.endswith("_path") and v else v
        for k, v in dataclasses.asdict(c).items()
        if k not in ("beam_width", "alpha", "beta")
    }
    if rest(cfg) != rest(settings.Decoding()):
        tag += "-" + hashlib.sha256(json.dumps(rest(cfg), sort_keys=True).encode()).hexdigest()[:8]
    return tag


def result_path(
    workdir: str, split: str, step: int, beam: decoding.BeamSearchDecoder | None, max_utterances: int = 0
) -> str:
    """workdir/eval-<split>-<step>-<decoder>[-max<N>].json: a result over at most N utterances
    (eval.max_utterances) has a name of its own, so it never replaces the whole split's."""
    return os.path.join(workdir, layout.eval_result(split, step, decoding_tag(beam), max_utterances))


def evaluate_splits(
    config, workdir: str, split: str = "", step: int | str | None = None, overrides=None
) -> dict[str, dict]:
    """Restores a checkpoint once (with the workdir's config.json, see workdir_config.config_for_eval),
    scores each comma-listed split on its own, logs each result, then writes it to
    workdir/eval-<split>-<step>-<decoder>[-max<N>].json (result_path); returns {split: result}.
    An unwritable workdir is an error after every result has been logged. `overrides`: the keys the
    command line set (the dataset.* settings it did not set come from config.json)."""
    config = workdir_config.config_for_eval(config, workdir, overrides)
    beam = decoding.make_beam_decoder(config.decoding, text.Alphabet.of_setting(config.model.alphabet))  # fails fast
    run = prepare(config, workdir, step, log_probs=beam is not None)
    step = run.step
    best = checkpoint.best(checkpoint.manager(workdir))  # (step, its in-training WER/CER) or None
    if best is not None:
        log.info(
            "the best checkpoint by in-training eval WER is step %d (WER %.4f)%s",
            best[0],
            best[1]["wer"],
            "; evaluating it" if best[0] == step else f"; evaluating step {step}",
        )
    results, unwritten = {}, []
    for name in split_list(split or config.eval.split or config.dataset.eval_split):
        result = evaluate(run.p_eval, run.state, run.source, name, config.eval.max_utterances, run.par, beam)
        result.update(split=name, step=step, max_utterances=config.eval.max_utterances)
        if best is not None:  # which step was best in training (keep_best_checkpoints), and by what
            result["best_checkpoint"] = {"step": best[0], **best[1]}
        path = result_path(workdir, name, step, beam, config.eval.max_utterances)
        line = f"eval {name} at step {step}: greedy WER {result['wer']:.4f} CER {result['cer']:.4f}"
        if beam is not None:
            line += f"; beam WER {result['beam']['wer']:.4f} CER {result['beam']['cer']:.4f}"
        log.info("%s over %d utterances -> %s", line, result["utterances"], path)
        try:
            with files.replacing(path) as f:  # atomic: a kill leaves the old result or the new one
                json.dump(result, f, indent=2)
        except OSError as e:
            unwritten.append(f"{path} ({e.strerror or e})")
        results[name] = result
    if unwritten:
        err = OSError(
            f"could not write {'; '.join(unwritten)}: the results are in the log above. Make {workdir} "
            "writable (or copy it somewhere writable) and rerun --mode=eval to keep them"
        )
        err.results = results  # for callers of the Python API
        raise err
    return results


def evaluate_checkpoint(config, workdir: str, split: str = "", step: int | str | None = None, overrides=None) -> dict:
    """--mode=eval: evaluate_splits, returning the first listed split's result."""
    return next(iter(evaluate_splits(config, workdir, split, step, overrides).values()))
