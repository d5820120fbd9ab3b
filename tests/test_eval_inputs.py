"""The decoder's input path at evaluate(), fast, on a tiny model (issue 40, item 13).

Non-slow beam tests fed hand-made log-probabilities; here the real eval step's are checked: each
row normalizes over the vocabulary, its length is the output frames of its audio, and beam search
without an LM at a width of at least the vocabulary agrees with greedy on a peaked model.
"""

import jax
import numpy as np
import pytest
from scipy.special import logsumexp

from ds2_jax import decoding, eval_step, evaluation, geometry, parallel, settings, text
from ds2_jax import state as state_lib
from tests.helpers import tiny_settings


def test_eval_log_probs_normalize_have_the_audios_output_frames_and_beam_agrees_with_greedy():
    pytest.importorskip("flashlight.lib.text")
    config = tiny_settings(
        num_devices=2,
        per_device_batch_size=2,
        **{"dataset.synthetic_min_duration_s": 0.3, "dataset.synthetic_max_duration_s": 0.7},
    )
    par = parallel.make(config)
    source = evaluation.make_source(config, par.batch_sharding(config.per_device_batch_size))
    state = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
    # A peaked model (the output layer scaled up): one labeling holds almost all the probability, so
    # the most probable labeling (beam) is the best path's (greedy).
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x * 40.0 if "output" in jax.tree_util.keystr(p) else x, state.params
    )
    state = state.replace(params=params)
    p_eval = eval_step.compile_eval_step(par, state_lib.step_kwargs(config), log_probs=True)
    out = evaluation.run_split(p_eval, par.put_replicated(state), source, "dev-clean", 7, par)

    lengths = [
        int(n) for b in source.eval_batches("dev-clean", 7) for n, w in zip(b["audio_lengths"], b["weights"]) if w > 0
    ]
    fc = config.features
    want = [
        int(geometry.output_frames(geometry.num_frames(n, fc.window, fc.hop), config.model.num_conv_layers))
        for n in lengths
    ]
    assert len(out.log_probs) == len(out.greedy) == len(lengths) == 7
    assert [lp.shape for lp in out.log_probs] == [(t, text.VOCAB_SIZE) for t in want]
    for lp in out.log_probs:
        np.testing.assert_allclose(logsumexp(lp, axis=-1), 0.0, atol=1e-4)
    assert all(len(set(lp.argmax(-1))) > 1 for lp in out.log_probs)  # not one token everywhere: texts to compare
    beam = decoding.make_beam_decoder(settings.Decoding(beam_width=text.VOCAB_SIZE + 3))
    assert beam.decode_all(out.log_probs) == out.greedy
    result = evaluation.evaluate(p_eval, par.put_replicated(state), source, "dev-clean", 7, par, beam)
    assert result["beam"]["wer"] == result["wer"] and result["beam"]["cer"] == result["cer"]
