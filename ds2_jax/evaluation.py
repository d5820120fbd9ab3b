"""Evaluation: the pure eval step, greedy WER/CER over a split, --mode=eval."""

from __future__ import annotations

import functools
import json
import logging
import os
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import jax_utils

from ds2_jax import checkpoint, ctc, input_pipeline, metrics, model, text, train
from ds2_jax.config_validation import validate

log = logging.getLogger("ds2_jax")


def eval_step(state: "train.TrainState", batch, *, model_cfg, feature_cfg, norm_by_times: bool, axis_name: str | None = "batch"):
    """Forward pass with running statistics: argmax paths, output lengths, loss sums."""
    net = model.DeepSpeech2(model_cfg, axis_name=axis_name)
    feats, frames = train.features_of(state, batch, feature_cfg)
    logits, out_lengths = net.apply({"params": state.params, "batch_stats": state.batch_stats}, feats, frames, train=False)
    loss, ok = ctc.per_utterance_loss(logits, out_lengths, batch["labels"], batch["label_lengths"], norm_by_times)
    used = ok.astype(jnp.float32) * batch["weights"]
    sums = {"loss_sum": train.psum(jnp.sum(loss * used), axis_name), "loss_count": train.psum(jnp.sum(used), axis_name)}
    return ctc.greedy_ids(logits), out_lengths, sums


def compile_eval_step(config) -> Callable:
    kw = train.step_kwargs(config)
    kwargs = dict(model_cfg=kw["model_cfg"], feature_cfg=kw["feature_cfg"], norm_by_times=kw["norm_by_times"])
    if config.compile:
        return jax.pmap(functools.partial(eval_step, **kwargs, axis_name=train.AXIS), axis_name=train.AXIS)
    return functools.partial(eval_step, **kwargs, axis_name=None)


def evaluate(p_eval, state, source, split: str, max_utterances: int, num_devices: int, replicated: bool) -> dict:
    """Greedy WER/CER and loss of `state` on a split; returns figures and worst utterances."""
    refs, hyps, sums = [], [], []
    for batch in source.eval_batches(split, max_utterances):
        inputs = input_pipeline.shard_for_devices(batch, num_devices) if replicated else batch
        ids, lengths, s = p_eval(state, inputs)
        ids, lengths = np.asarray(ids).reshape(-1, ids.shape[-1]), np.asarray(lengths).reshape(-1)
        sums.append(jax.device_get(s))
        for i in np.flatnonzero(batch["weights"] > 0):
            refs.append(text.decode(batch["labels"][i, : batch["label_lengths"][i]]))
            hyps.append(text.decode(ctc.collapse(ids[i], lengths[i])))
    total = metrics.reduce_sums(sums)
    rates = metrics.error_rates(refs, hyps)
    per_utt = [(metrics.error_rates([r], [h])["cer"], r, h) for r, h in zip(refs, hyps)]
    worst = sorted(per_utt, key=lambda x: -x[0])[:10]
    return {
        **rates,
        "loss": total.get("loss_sum", 0.0) / max(total.get("loss_count", 0.0), 1.0),
        "utterances": len(refs),
        "examples": [{"reference": r, "hypothesis": h} for r, h in zip(refs[:10], hyps[:10])],
        "worst": [{"cer": c, "reference": r, "hypothesis": h} for c, r, h in worst],
    }


def evaluate_checkpoint(config, workdir: str, split: str = "", step: int | None = None) -> dict:
    """--mode=eval: restores a checkpoint and writes workdir/eval-<split>-<step>.json."""
    validate(config)
    devices = train.local_devices(config)
    sharding = input_pipeline.Sharding(config.per_device_batch_size * len(devices))
    source = input_pipeline.make_source(config, sharding)
    template = train.initial_state(config, source, jax.random.PRNGKey(config.seed))
    mgr = checkpoint.manager(workdir, config.keep_checkpoints)
    step = mgr.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no checkpoint in {os.path.join(workdir, 'checkpoints')}: train first")
    state = mgr.restore(step, args=checkpoint.ocp.args.StandardRestore(template))
    split = split or config.eval.split or config.dataset.eval_split
    p_eval = compile_eval_step(config)
    if config.compile:
        state = jax_utils.replicate(state, devices, axis_name=train.AXIS)
    result = evaluate(p_eval, state, source, split, config.eval.max_utterances, len(devices), config.compile)
    result.update(split=split, step=int(step))
    path = os.path.join(workdir, f"eval-{split}-{step}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    log.info("eval %s at step %d: WER %.4f CER %.4f over %d utterances -> %s", split, step, result["wer"], result["cer"], result["utterances"], path)
    return result


def report(writer, step: int, result: dict, num_examples: int) -> None:
    writer.write(step, {"wer": result["wer"], "cer": result["cer"], "loss": result["loss"]}, prefix="eval_")
    log.info("eval at step %d: WER %.4f CER %.4f loss %.4f (%d utterances)", step, result["wer"], result["cer"], result["loss"], result["utterances"])
    for ex in result["examples"][:num_examples]:
        log.info("  REF: %s", ex["reference"])
        log.info("  HYP: %s", ex["hypothesis"])


