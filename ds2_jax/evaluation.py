"""Evaluation: the pure eval step, WER/CER over a split (greedy and beam), --mode=eval.

    python launch.py --config=configs/demo.py --workdir=W --mode=eval \\
        [--config.eval.split=test-clean,dev-clean] \\
        [--config.decoding.beam_width=32 --config.decoding.lm_path=lm.arpa]

The eval step is compiled and placed by `parallel.Parallel` like the train step (pmap,
jit over the mesh, or eager), so evaluating during training reads the train state on the
devices, where it is, and --mode=eval places the restored state once. It runs over the
source's fixed bucket shapes and returns argmax ids, so greedy decoding moves only small
ints to the host; with a beam decoder configured it also returns the <float32>[B, T, 29]
log-probabilities, which flashlight-text searches on the host's cores (ds2_jax.decoding).
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
import jax.numpy as jnp
import numpy as np

from ds2_jax import (checkpoint, ctc, decoding, errors, features, files, metrics, model, parallel,
                     resilience, settings, text)
from ds2_jax.data.source import Source, make_source
from ds2_jax.batch_axis import AXIS, psum
from ds2_jax.state import TrainState, create_state, step_kwargs

log = logging.getLogger("ds2_jax")
NUM_WORST = 10  # Worst utterances (by CER) kept in the eval json.


def forward(state: TrainState, audio, audio_lengths, *, model_cfg, feature_cfg, axis_name: str | None = None):
    """Inference forward pass with running batch-norm statistics.

    Args:
      audio: <int16>[B, S] zero-padded waveforms; audio_lengths: <int32>[B].
    Returns:
      (<float32>[B, T, 29] logits, <int32>[B] valid output frames).
    """
    net = model.DeepSpeech2(model_cfg, axis_name=axis_name)
    feats, frames = features.featurize(audio, audio_lengths, state.feature_mean, state.feature_std, feature_cfg)
    logits, out_lengths = net.apply({"params": state.params, "batch_stats": state.batch_stats}, feats, frames, train=False)
    return logits.astype(jnp.float32), out_lengths


def eval_step(
    state: TrainState,
    batch,
    *,
    model_cfg,
    feature_cfg,
    norm_by_times: bool,
    ctc_impl: str = "auto",
    log_probs: bool = False,
    axis_name: str | None = "batch",
):
    """Forward pass, CTC loss sums and decoder inputs of one (per-device) batch.

    Returns:
      ({'ids': <int32>[B, T] argmax path, 'lengths': <int32>[B] valid frames,
        'log_probs': <float32>[B, T, 29] (only with log_probs=True)},
       {'loss_sum', 'loss_count'} psum'd over `axis_name`).
    """
    logits, out_lengths = forward(state, batch["audio"], batch["audio_lengths"], model_cfg=model_cfg, feature_cfg=feature_cfg, axis_name=axis_name)
    loss, ok = ctc.per_utterance_loss(logits, out_lengths, batch["labels"], batch["label_lengths"], norm_by_times,
                                      ctc_impl)
    used = ok.astype(jnp.float32) * batch["weights"]
    sums = {"loss_sum": psum(jnp.sum(loss * used), axis_name), "loss_count": psum(jnp.sum(used), axis_name)}
    outputs = {"ids": ctc.greedy_ids(logits), "lengths": out_lengths}
    if log_probs:
        outputs["log_probs"] = jax.nn.log_softmax(logits, axis=-1)
    return outputs, sums


def eval_kwargs(config, log_probs: bool = False) -> dict:
    """The fixed (static) arguments of eval_step: the train step's model, features and loss."""
    kw = step_kwargs(config)
    return {"model_cfg": kw["model_cfg"], "feature_cfg": kw["feature_cfg"], "norm_by_times": kw["norm_by_times"],
            "ctc_impl": kw["ctc_impl"], "log_probs": log_probs}


def compile_eval_step(config, par: parallel.Parallel, log_probs: bool = False) -> Callable:
    """eval_step(state, batch) compiled by `par` as the train step is, for the state `par`
    placed (put_replicated), which it reads and never donates; log_probs for beam search."""
    return par.compile(eval_step, eval_kwargs(config, log_probs), donate=False)


@dataclasses.dataclass
class SplitOutputs:
    """What the model said about one split, on the host."""

    references: list[str]
    greedy: list[str]
    log_probs: list[np.ndarray] | None  # per utterance <float32>[T_i, 29]; None without beam
    loss: float


def run_split(p_eval, state, source, split: str, max_utterances: int, par: parallel.Parallel,
              on_batch: Callable[[], None] | None = None) -> SplitOutputs:
    """Runs `p_eval` (compile_eval_step for `par`) on `state` (placed by `par`) over a split;
    keeps log-probs when the step returns them. `on_batch()` after each batch (the watchdog)."""
    refs, hyps, lps, sums = [], [], [], []
    # Read and place ahead in a thread, so the next batches load while this one runs.
    with contextlib.closing(par.put_batches(source.eval_batches(split, max_utterances), 2, with_host=True)) as batches:
        for batch, inputs in batches:
            out, s = p_eval(state, inputs)
            out = par.get_rows(out)
            sums.append(par.get(s))
            rows = np.flatnonzero(batch["weights"] > 0)
            refs += [text.decode(batch["labels"][i, : batch["label_lengths"][i]]) for i in rows]
            hyps += decoding.greedy_texts(out["ids"][rows], out["lengths"][rows])
            if "log_probs" in out:
                lps += [out["log_probs"][i, : out["lengths"][i]] for i in rows]
            if on_batch is not None:
                on_batch()
    total = metrics.reduce_sums(sums)
    loss = total.get("loss_sum", 0.0) / max(total.get("loss_count", 0.0), 1.0)
    return SplitOutputs(refs, hyps, lps if lps else None, loss)


def score(references: list[str], hypotheses: list[str], num_worst: int = NUM_WORST) -> dict:
    """Corpus WER/CER, the first pairs and the worst utterances by CER."""
    per_utt = [(metrics.error_rates([r], [h])["cer"], r, h) for r, h in zip(references, hypotheses)]
    worst = sorted(per_utt, key=lambda x: -x[0])[:num_worst]
    return {
        **metrics.error_rates(references, hypotheses),
        "examples": [{"reference": r, "hypothesis": h} for r, h in zip(references[:10], hypotheses[:10])],
        "worst": [{"cer": c, "reference": r, "hypothesis": h} for c, r, h in worst],
    }


def evaluate(
    p_eval,
    state,
    source,
    split: str,
    max_utterances: int,
    par: parallel.Parallel,
    beam: decoding.BeamSearchDecoder | None = None,
    on_batch: Callable[[], None] | None = None,
) -> dict:
    """Greedy (and, with `beam` and a log-prob step, beam search) WER/CER and loss of a split.

    The top-level wer/cer/examples/worst are greedy's, as during training; beam search
    adds a 'beam' section with its own figures and settings.
    """
    out = run_split(p_eval, state, source, split, max_utterances, par, on_batch)
    # With several processes each one decoded its own rows; every process scores them all.
    references, greedy = gather_texts(out.references), gather_texts(out.greedy)
    result = {**score(references, greedy), "loss": out.loss, "utterances": len(references)}
    if beam is not None:
        if out.log_probs is None and out.references:
            raise ValueError("beam search needs compile_eval_step(config, par, log_probs=True)")
        beam_hyps = gather_texts(beam.decode_all(out.log_probs or []))
        result["beam"] = {**beam.describe(), **score(references, beam_hyps)}
    return result


def gather_texts(texts: list[str]) -> list[str]:
    """Concatenates every process's list (in process order); the list itself with one process.

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


def restore_state(config, workdir: str, step: int | None = None) -> tuple[TrainState, int]:
    """(unreplicated state, step) of checkpoint `step` (default: latest) of `workdir`.

    The template's feature statistics are placeholders: the checkpoint's replace them,
    so no dataset is needed.
    """
    num_bins = features.FeatureConfig.from_config(config.features).num_bins
    template = create_state(config, jax.random.PRNGKey(0), np.zeros(num_bins, np.float32), np.ones(num_bins, np.float32))
    mgr = checkpoint.manager(workdir, config.keep_checkpoints)
    if step is None:
        state, step = checkpoint.restore_latest(mgr, template)  # skips a damaged newest one
        if state is None:
            raise FileNotFoundError(f"no checkpoint in {os.path.join(workdir, 'checkpoints')}: train first")
    elif step in mgr.all_steps():
        if (missing := checkpoint.unfinished(mgr, step)) is not None:
            raise errors.CheckpointError(f"checkpoint {step} in {mgr.directory} was never finished (no {missing}); "
                                         f"choose another step of {sorted(mgr.all_steps())}")
        try:
            state = mgr.restore(step, args=checkpoint.ocp.args.StandardRestore(template))
        except Exception as e:  # noqa: BLE001  (orbax raises many types)
            raise errors.CheckpointError(
                f"checkpoint {step} in {mgr.directory} does not restore into this model "
                f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); if the model settings differ from "
                f"{os.path.join(workdir, 'config.json')}, use those, or choose another step"
            ) from e
    else:
        raise FileNotFoundError(f"no checkpoint at step {step} in {mgr.directory} (it has {sorted(mgr.all_steps())})")
    return state.replace(apply_fn=template.apply_fn, tx=template.tx), int(step)


@dataclasses.dataclass
class EvalRun:
    """A restored checkpoint, placed once, ready for run_split / evaluate."""

    p_eval: Callable
    state: "TrainState"  # placed by `par` (put_replicated)
    source: Source
    par: parallel.Parallel
    step: int


def prepare(config, workdir: str, step: int | None = None, log_probs: bool = False) -> EvalRun:
    """Restores checkpoint `step` (default: latest), places it on the devices as
    config.parallelism says, and builds the source (this process's rows) and the eval step."""
    par = parallel.make(config)
    sharding = par.batch_sharding(config.per_device_batch_size)
    source = make_source(config, sharding)
    resilience.check_host_memory(config, sharding.local_batch, source.shapes(), 3)  # 2 read ahead, 1 in the step
    state, step = restore_state(config, workdir, step)
    return EvalRun(compile_eval_step(config, par, log_probs), par.put_replicated(state), source, par, step)


def split_list(spec: str) -> list[str]:
    """'test-clean, test-other' -> ['test-clean', 'test-other'] (each scored on its own)."""
    splits = [s.strip() for s in spec.split(",") if s.strip()]
    if not splits:
        raise ValueError(f"no split in eval.split={spec!r}")
    return splits


# What an evaluation sets itself; every other setting (model, features, loss, optimizer,
# ...) comes from the workdir's config.json, so the restored model is the one trained.
EVAL_SETTINGS = ("eval", "decoding", "dataset", "per_device_batch_size", "num_devices", "compile", "parallelism",
                 "keep_checkpoints", "prefetch_batches")


def differing_keys(trained: dict, given: dict) -> list[tuple[str, object, object]]:
    """(dotted key, trained value, given value) of the training settings both have that differ."""
    a, b = checkpoint.flat(trained), checkpoint.flat(given)
    return [(k, a[k], b[k]) for k in sorted(set(a) & set(b)) if k.split(".")[0] not in EVAL_SETTINGS and a[k] != b[k]]


def _overlay(base: dict, top: dict) -> dict:
    """base with top's values, section by section (keys only base has are kept)."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _overlay(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def config_for_eval(config, workdir: str) -> settings.Settings:
    """The workdir's config.json with `config`'s EVAL_SETTINGS, checked; warns naming every
    training setting of `config` that differs from the one the checkpoints were trained with."""
    if not os.path.exists(os.path.join(workdir, "config.json")):
        log.warning("%s has no config.json: evaluating with --config as given", workdir)
        return settings.from_config_dict(config)
    trained = checkpoint.read_config_json(workdir)
    given = settings.to_dict(config)
    diff = differing_keys(trained, given)
    if diff:
        shown = ", ".join(f"{k} (trained {a!r}, --config {b!r})" for k, a, b in diff[:12])
        more = f" and {len(diff) - 12} more" if len(diff) > 12 else ""
        log.warning("eval restores with %s: %d setting(s) of --config differ and are taken from it: %s%s",
                    os.path.join(workdir, "config.json"), len(diff), shown, more)
    # Knobs newer than the workdir keep --config's value (their default when it was trained).
    try:
        return settings.from_config_dict(_overlay(given, {k: v for k, v in trained.items() if k not in EVAL_SETTINGS}))
    except ValueError as e:  # --config was checked before: the workdir's file holds the bad value
        raise ValueError(f"{os.path.join(workdir, 'config.json')}: {e}") from e


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
    rest = lambda c: {k: os.path.abspath(v) if k.endswith("_path") and v else v  # noqa: E731
                      for k, v in dataclasses.asdict(c).items() if k not in ("beam_width", "alpha", "beta")}
    if rest(cfg) != rest(settings.Decoding()):
        tag += "-" + hashlib.sha256(json.dumps(rest(cfg), sort_keys=True).encode()).hexdigest()[:8]
    return tag


def result_path(workdir: str, split: str, step: int, beam: decoding.BeamSearchDecoder | None) -> str:
    return os.path.join(workdir, f"eval-{split}-{step}-{decoding_tag(beam)}.json")


def evaluate_splits(config, workdir: str, split: str = "", step: int | None = None) -> dict[str, dict]:
    """Restores a checkpoint once (with the workdir's config.json, see config_for_eval),
    scores each comma-listed split on its own, logs each result, then writes it to
    workdir/eval-<split>-<step>-<decoder>.json (result_path); returns {split: result}.
    An unwritable workdir is an error after every result has been logged."""
    config = config_for_eval(config, workdir)
    beam = decoding.make_beam_decoder(config.decoding)  # before compiling: a missing LM fails fast
    run = prepare(config, workdir, step, log_probs=beam is not None)
    step = run.step
    results, unwritten = {}, []
    for name in split_list(split or config.eval.split or config.dataset.eval_split):
        result = evaluate(run.p_eval, run.state, run.source, name, config.eval.max_utterances, run.par, beam)
        result.update(split=name, step=step)
        path = result_path(workdir, name, step, beam)
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
        err = OSError(f"could not write {'; '.join(unwritten)}: the results are in the log above. Make {workdir} "
                      "writable (or copy it somewhere writable) and rerun --mode=eval to keep them")
        err.results = results  # for callers of the Python API
        raise err
    return results


def evaluate_checkpoint(config, workdir: str, split: str = "", step: int | None = None) -> dict:
    """--mode=eval: evaluate_splits, returning the first listed split's result."""
    return next(iter(evaluate_splits(config, workdir, split, step).values()))


def report(writer, step: int, result: dict, num_examples: int) -> None:
    writer.write(step, {"wer": result["wer"], "cer": result["cer"], "loss": result["loss"]}, prefix="eval_")
    log.info("eval at step %d: WER %.4f CER %.4f loss %.4f (%d utterances)", step, result["wer"], result["cer"], result["loss"], result["utterances"])
    for ex in result["examples"][:num_examples]:
        log.info("  REF: %s", ex["reference"])
        log.info("  HYP: %s", ex["hypothesis"])
