"""The pure eval step (forward pass, CTC loss sums, decoder inputs) and the scoring of its texts.

The eval step is compiled and placed by `parallel.Parallel` like the train step (pmap,
jit over the mesh, or eager), so evaluating during training reads the train state on the
devices, where it is. It returns argmax ids, so greedy decoding moves only small ints to
the host; with a beam decoder configured it also returns the <float32>[B, T, 29]
log-probabilities, which flashlight-text searches on the host's cores (ds2_jax.decoding).
Transcription (ds2_jax.infer) runs ds2_jax.forward.infer, the same outputs without the loss.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp

from ds2_jax import ctc, metrics, parallel
from ds2_jax.batch_axis import psum
from ds2_jax.forward import decoder_inputs, forward
from ds2_jax.state import TrainState

NUM_WORST = 10  # Worst utterances (by CER) kept in the eval json.


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
      (decoder_inputs: {'ids', 'lengths', 'log_probs' (only with log_probs=True)},
       {'loss_sum', 'loss_count'} psum'd over `axis_name`).
    """
    logits, out_lengths = forward(
        state, batch["audio"], batch["audio_lengths"], model_cfg=model_cfg, feature_cfg=feature_cfg, axis_name=axis_name
    )
    loss, ok = ctc.per_utterance_loss(
        logits, out_lengths, batch["labels"], batch["label_lengths"], norm_by_times, ctc_impl
    )
    used = ok.astype(jnp.float32) * batch["weights"]
    sums = {"loss_sum": psum(jnp.sum(loss * used), axis_name), "loss_count": psum(jnp.sum(used), axis_name)}
    return decoder_inputs(logits, out_lengths, log_probs), sums


def eval_kwargs(step_kwargs: dict, log_probs: bool = False) -> dict:
    """The fixed (static) arguments of eval_step: the train step's (state.step_kwargs) model,
    features and loss."""
    return {
        "model_cfg": step_kwargs["model_cfg"],
        "feature_cfg": step_kwargs["feature_cfg"],
        "norm_by_times": step_kwargs["norm_by_times"],
        "ctc_impl": step_kwargs["ctc_impl"],
        "log_probs": log_probs,
    }


def compile_eval_step(par: parallel.Parallel, step_kwargs: dict, log_probs: bool = False) -> Callable:
    """eval_step(state, batch) compiled by `par` as the train step is (with its static arguments,
    `step_kwargs`), for the state `par` placed (put_replicated), which it reads and never
    donates; log_probs for beam search."""
    return par.compile(eval_step, eval_kwargs(step_kwargs, log_probs), donate=False)


def score(references: list[str], hypotheses: list[str], num_worst: int = NUM_WORST) -> dict:
    """Corpus WER/CER, the first pairs and the worst utterances by CER."""
    per_utt = [(metrics.error_rates([r], [h])["cer"], r, h) for r, h in zip(references, hypotheses)]
    worst = sorted(per_utt, key=lambda x: -x[0])[:num_worst]
    return {
        **metrics.error_rates(references, hypotheses),
        "examples": [{"reference": r, "hypothesis": h} for r, h in zip(references[:10], hypotheses[:10])],
        "worst": [{"cer": c, "reference": r, "hypothesis": h} for c, r, h in worst],
    }
