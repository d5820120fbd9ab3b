"""Every setting at a non-default value changes what its consumer does (issue 40, item 10).

Tests that keep a setting at its default cannot tell code that reads the setting from code that
reads the default (the CTC feasibility filter called without the run's window and hop, batch norm
with a hard-coded momentum, a checkpoint manager keeping 3 whatever keep_checkpoints says). Here
each leaf of the Settings schema gets a valid non-default value (`TABLE`), and each consumer it
names -- a function of the whole Settings that runs the real code that reads it (the model, the
features, the loss, the optimizer, the data sources and filters, parallel.make, the reporter, the
decoder's result name) -- must give a different observation than at the base settings. The
settings only the training loop reads are run once, all changed at once, in
`test_the_loops_settings_each_change_the_run`. `ALLOWED` lists the few that are not, and why.
"""

import dataclasses
import hashlib
import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ds2_jax import (
    checkpoint,
    ctc,
    decoding,
    evaluation,
    features,
    geometry,
    model,
    parallel,
    reporting,
    settings,
    train,
)
from ds2_jax import state as state_lib
from ds2_jax.pipeline import filters, loader, split_index
from ds2_jax.pipeline.source import DataSettings, make_source
from tests import librispeech_testdata as td
from tests.helpers import tiny_settings

SYNTH = {
    "model.rnn_size": 8,
    "model.conv_channels": 2,
    "dataset.synthetic_min_duration_s": 0.3,
    "dataset.synthetic_max_duration_s": 0.5,
    "dataset.synthetic_pool_size": 8,
    "dataset.synthetic_num_utterances": 64,
    "dataset.feature_stats_utterances": 8,
}
CORPUS = {
    "dataset.name": "librispeech_local",
    "dataset.train_splits": "train-clean-100",
    "dataset.eval_split": "test-clean",
    "dataset.min_duration_s": 0.0,
    "dataset.max_duration_s": 27.0,
    "dataset.num_workers": 0,
    "num_devices": 2,
    "per_device_batch_size": 1,
}

# key -> (a valid non-default value, other settings it needs to matter, the consumers it must change)
TABLE = {
    "seed": (1, {}, ["synthetic_data"]),
    "num_train_steps": (5, {}, ["loop"]),
    "per_device_batch_size": (1, {}, ["parallel", "synthetic_data"]),
    "num_devices": (2, {}, ["parallel"]),
    "compile": (False, {}, ["parallel"]),
    "parallelism": ("jit", {}, ["parallel"]),
    "log_every_steps": (2, {}, ["loop"]),
    "eval_every_steps": (4, {}, ["loop"]),
    "checkpoint_every_steps": (2, {}, ["loop"]),
    "keep_checkpoints": (1, {}, ["loop"]),
    "input_wait_warn_fraction": (0.5, {}, ["reporter"]),
    "step_timeout_s": (60.0, {}, ["reporter"]),
    "faults.nan_at_steps": ("1", {}, ["step_function"]),
    "dataset.name": ("librispeech_local", {k: v for k, v in CORPUS.items() if k != "dataset.name"}, ["corpus_data"]),
    "dataset.min_duration_s": (1.0, CORPUS, ["corpus_data", "filter"]),
    "dataset.max_duration_s": (2.0, CORPUS, ["corpus_data", "filter"]),
    "dataset.num_buckets": (2, CORPUS, ["corpus_data"]),
    "dataset.sortagrad": (False, CORPUS, ["corpus_data"]),
    "dataset.feature_stats_utterances": (3, CORPUS, ["corpus_data"]),
    "dataset.train_splits": ("test-clean", CORPUS, ["corpus_data"]),
    "dataset.eval_split": ("train-clean-100", CORPUS, ["corpus_data"]),
    "dataset.num_workers": (3, {}, ["workers"]),
    "dataset.synthetic_min_duration_s": (0.4, {}, ["synthetic_data"]),
    "dataset.synthetic_max_duration_s": (0.45, {}, ["synthetic_data"]),
    "dataset.synthetic_chars_per_second": (5.0, {}, ["synthetic_data"]),
    "dataset.synthetic_pool_size": (4, {}, ["synthetic_data"]),
    "features.window_ms": (40.0, {}, ["features", "filter", "model"]),
    "features.hop_ms": (20.0, {}, ["features", "filter"]),
    "features.eps": (1e-3, {}, ["features"]),
    "features.freq_masks": (2, {}, ["augment"]),
    "features.freq_mask_width": (5, {"features.freq_masks": 1}, ["augment"]),
    "features.time_masks": (2, {}, ["augment"]),
    "features.time_mask_max_fraction": (0.5, {"features.time_masks": 4}, ["augment"]),
    "model.num_conv_layers": (1, {}, ["model"]),  # the 2nd and 3rd convs keep the frame count: no filter change
    "model.conv_channels": (3, {}, ["model"]),
    "model.num_rnn_layers": (2, {}, ["model"]),
    "model.rnn_size": (6, {}, ["model"]),
    "model.rnn_cell": ("gru", {}, ["model"]),
    "model.share_rnn_weights": (False, {}, ["model"]),
    "model.bidirectional": (False, {}, ["model"]),
    "model.row_conv_context": (3, {"model.bidirectional": False}, ["model"]),
    "model.dtype": ("bfloat16", {}, ["model"]),
    "model.sync_batch_norm": (False, {}, ["model"]),
    "model.batch_norm_momentum": (0.5, {}, ["model"]),
    "model.batch_norm_epsilon": (1.0, {}, ["model"]),
    "loss.norm_by_times": (True, {}, ["loss"]),
    "optimizer.learning_rate": (1e-2, {}, ["optimizer"]),
    "optimizer.b1": (0.5, {}, ["optimizer"]),
    "optimizer.b2": (0.5, {}, ["optimizer"]),
    "optimizer.eps": (1e-2, {}, ["optimizer"]),
    "optimizer.clip_global_norm": (1.0, {}, ["optimizer"]),
    "optimizer.warmup_steps": (2, {}, ["optimizer"]),
    "optimizer.schedule": ("cosine", {"optimizer.decay_steps": 3}, ["optimizer"]),
    "optimizer.decay_rate": (0.5, {"optimizer.schedule": "exponential", "optimizer.decay_steps": 2}, ["optimizer"]),
    "optimizer.decay_steps": (2, {"optimizer.schedule": "cosine"}, ["optimizer"]),
    "optimizer.max_consecutive_skips": (2, {}, ["divergence_stop"]),
    "optimizer.accumulate_steps": (2, {}, ["step_arguments", "update_rows"]),
    "optimizer.ema_decay": (0.9, {}, ["step_arguments", "initial_state"]),
    "eval.split": ("test-clean", {}, ["loop"]),
    "eval.max_utterances": (6, {}, ["loop"]),
    "eval.num_examples_to_print": (1, {}, ["loop"]),
    "decoding.beam_width": (4, {}, ["decoder"]),
    "decoding.lm_path": ("LM", {"decoding.beam_width": 4}, ["decoder"]),
    "decoding.lexicon_path": ("LEXICON", {"decoding.beam_width": 4, "decoding.lm_path": "LM"}, ["decoder"]),
    "decoding.alpha": (1.5, {"decoding.beam_width": 4, "decoding.lm_path": "LM"}, ["decoder"]),
    "decoding.beta": (0.0, {"decoding.beam_width": 4, "decoding.lm_path": "LM"}, ["decoder"]),
    "decoding.beam_prune_logp": (-3.0, {"decoding.beam_width": 4}, ["decoder"]),
    "decoding.token_min_logp": (-2.0, {"decoding.beam_width": 4}, ["decoder"]),
    "decoding.unk_score_offset": (-5.0, {"decoding.beam_width": 4, "decoding.lm_path": "LM"}, ["decoder"]),
    "model.alphabet": (" abcñ", {}, ["model"]),
    "init_output": ("fresh", {}, ["fine_tune_output"]),
    "dataset.lower_case": (False, {}, ["normalize"]),
    "dataset.strip_punctuation": (False, {}, ["normalize"]),
    "dataset.alphabet_min_count": (1, {}, ["derived_alphabet"]),
    "waveform.noise_prob": (1.0, {"waveform.noise_dir": "NOISE"}, ["synthetic_data"]),
    "waveform.noise_snr_db_min": (5.0, {"waveform.noise_prob": 1.0, "waveform.noise_dir": "NOISE"}, ["synthetic_data"]),
    "waveform.noise_snr_db_max": (
        10.0,
        {"waveform.noise_prob": 1.0, "waveform.noise_dir": "NOISE"},
        ["synthetic_data"],
    ),
    "waveform.rir_prob": (1.0, {"waveform.rir_dir": "NOISE"}, ["synthetic_data"]),
    "waveform.speed_prob": (1.0, {}, ["synthetic_data"]),
    "waveform.speed_min": (0.95, {"waveform.speed_prob": 1.0}, ["synthetic_data"]),
    "waveform.speed_max": (1.05, {"waveform.speed_prob": 1.0}, ["synthetic_data"]),
    "waveform.gain_prob": (1.0, {}, ["synthetic_data"]),
    "waveform.gain_db_min": (-3.0, {"waveform.gain_prob": 1.0}, ["synthetic_data"]),
    "waveform.gain_db_max": (3.0, {"waveform.gain_prob": 1.0}, ["synthetic_data"]),
}

# Not in TABLE, with the reason (each is exercised at a non-default value elsewhere, named).
ALLOWED = {
    "features.sample_rate": "manifest data only (LibriSpeech is 16 kHz): test_manifest.py builds and trains at 8 kHz",
    "model.conv_impl": "an implementation choice with the same sums: test_space_to_depth.py holds them equal",
    "model.rnn_impl": "an implementation choice with the same numbers: test_recurrence.py, test_dispatch.py",
    "model.scan_unroll": "lax.scan's unroll: the same numbers by construction",
    "loss.ctc_impl": "an implementation choice with the same numbers: test_ctc.py",
    "deterministic": "a GPU XLA flag: test_determinism.py",
    "compilation_cache_dir": "JAX's process-wide cache setting: test_train.py / conftest.py use it",
    "prefetch_batches": "the staging queue's depth, no other output: test_loader.py stages batches",
    "dataset.worker_buffer_size": "handed to grain's MultiprocessingOptions as is: test_loader.py runs workers",
    "dataset.manual_dir": "every corpus test sets it (test_tfds_source.py, test_datasets.py, test_faults.py)",
    "dataset.data_dir": "every corpus test sets it (test_tfds_source.py, test_datasets.py)",
    "faults.kill_at": "a kill -9 drill: test_faults.py::test_kill_9_*",
    "faults.hang_at_step": "a watchdog drill: test_faults.py::test_hung_step_*",
    "faults.kill_input_worker_at_step": "a dead worker drill: test_loader.py::test_a_dead_worker_*",
    "dataset.synthetic_num_utterances": "read by nothing (SyntheticSource stores it, no code uses it): a dead setting",
    "waveform.noise_dir": "needs noise_prob > 0 on both sides: test_augment.py draws from a folder and a list",
    "waveform.rir_dir": "needs rir_prob > 0 on both sides: test_augment.py reverberates from a folder",
    "dataset.vocabulary": "the manifest builder's: test_manifest.py (a fixed vocabulary, unknown characters counted)",
    "dataset.path_column": "the manifest builder's: test_manifest.py reads a CSV by its columns",
    "dataset.text_column": "the manifest builder's: test_manifest.py reads a CSV by its columns",
    "dataset.manifest_splits": "the manifest builder's: test_manifest.py builds named splits",
    "dataset.stereo": "the build's downmix or skip: test_manifest.py",
    "dataset.build_workers": "build processes, the same examples: test_manifest.py, benchmarks/manifest_build.py",
    "init_from": "a whole second run: test_finetune.py",
    "freeze": "needs init_from: test_finetune.py::test_frozen_parts_keep_the_sources_values_and_the_rest_trains",
    "keep_best_checkpoints": "needs evals with WERs: test_best_checkpoint.py",
    "eval.ema_weights": "needs a trained EMA: test_ema.py::test_eval_transcribe_and_export_take_the_average_*",
}


def digest(*parts) -> str:
    """A short hash of arrays, numbers and strings (the observation a consumer gives)."""
    h = hashlib.sha256()
    for part in jax.tree_util.tree_leaves(parts):
        a = np.asarray(part)
        h.update(str((a.dtype, a.shape)).encode() + a.tobytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- consumers


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("reach")
    manual = str(root / "manual")
    td.write_durations_corpus(manual, "train-clean-100", list(np.linspace(0.5, 3.0, 12)))
    td.write_durations_corpus(manual, "test-clean", list(np.linspace(0.6, 2.5, 7)), first_speaker=50)
    return {"dataset.manual_dir": manual, "dataset.data_dir": str(root / "tfds")}


@pytest.fixture(scope="module")
def lm_files(tmp_path_factory):
    from ds2_jax.tools import build_lm

    root = tmp_path_factory.mktemp("reach_lm")
    probs, backoffs = build_lm.estimate([["a", "b"], ["b", "c"]], 2)
    build_lm.write_arpa(probs, backoffs, str(root / "lm.arpa"))
    (root / "words.txt").write_text("a\nb\n")
    import soundfile

    (root / "noise").mkdir()  # a noise recording / impulse response for the waveform settings
    soundfile.write(str(root / "noise" / "n.wav"), np.random.default_rng(0).normal(0, 0.1, 4000), 16_000)
    return {"LM": str(root / "lm.arpa"), "LEXICON": str(root / "words.txt"), "NOISE": str(root / "noise")}


def _parallel(s):
    p = parallel.make(s)
    return p.kind, len(p.devices), p.batch_sharding(s.per_device_batch_size).global_batch


def _data(s):
    sharding = parallel.make(s).batch_sharding(s.per_device_batch_size)
    source = make_source(s, sharding)
    if hasattr(source, "check_eval_split"):
        source.check_eval_split(s.dataset.eval_split)
    evals = list(source.eval_batches(s.dataset.eval_split))
    return digest(
        source.shapes(),
        [source.train_batch(i) for i in range(3)],
        evals,
        source.feature_stats(features.spectrogram_stats),
    )


AUDIO = (np.sin(np.arange(2 * 6000) / 7.0).reshape(2, 6000) * 3000).astype(np.int16)
AUDIO[1, 4000:] = 0  # a silent tail (eps) and a shorter row
LENGTHS = np.array([6000, 5000], np.int32)


def _features(s):
    fc = s.features.spectrogram
    bins = fc.num_bins
    return digest(features.featurize(jnp.asarray(AUDIO), jnp.asarray(LENGTHS), jnp.zeros(bins), jnp.ones(bins), fc))


def _augment(s):
    feats = jnp.ones((2, 60, 161))
    return digest(
        features.spec_augment(
            feats, jnp.array([60, 40]), jax.random.PRNGKey(3), **dataclasses.asdict(s.features.augment)
        )
    )


def _loss(s):
    logits = jax.random.normal(jax.random.PRNGKey(0), (2, 12, 29))
    loss, ok = ctc.per_utterance_loss(
        logits,
        jnp.array([12, 9]),
        jnp.array([[1, 2, 3, 0], [4, 5, 0, 0]]),
        jnp.array([3, 2]),
        s.loss.norm_by_times,
        s.loss.ctc_impl,
    )
    return digest(loss, ok)


def _optimizer(s):
    tx = state_lib.make_optimizer(state_lib.run_optimizer(s))
    params = {"w": jnp.array([1.0, -2.0, 0.5, 3.0])}
    opt = tx.init(params)
    for g in ([3.0, 0.0, 1e-9, -4.0], [1e-9, 2.0, 0.0, 0.5], [0.1, 0.1, 0.1, 0.1], [5.0, -5.0, 0.0, 0.0]):
        updates, opt = tx.update({"w": jnp.array(g)}, opt, params)
        params = jax.tree_util.tree_map(lambda p, u: p + u, params, updates)
    return digest(params)


def _step_arguments(s):
    kw = dict(state_lib.step_kwargs(s))
    lr = kw.pop("learning_rate_fn")
    return repr(kw) + digest([lr(i) for i in (0, 1, 3, 10, 1000)])


def _model(s):
    """The model on two devices in train mode: outputs and new batch-norm statistics."""
    cfg = model.ModelConfig.of(s.model, num_bins=s.features.num_bins)
    net = model.DeepSpeech2(cfg, axis_name="batch")
    frames = 24
    # numpy's draw: jax.random would compile its sampler for each row's number of bins
    x = np.random.default_rng(1).standard_normal((2, 2, frames, cfg.num_bins)).astype(np.float32)
    x = jnp.asarray(x * np.array([1.0, 3.0], np.float32)[:, None, None, None])
    lengths = jnp.array([[frames, 20], [18, frames]])
    variables = net.init(jax.random.PRNGKey(0), x[0], lengths[0], train=False)

    def run(x, lengths):
        (out, out_lengths), updates = net.apply(variables, x, lengths, train=True, mutable=["batch_stats"])
        return out.astype(jnp.float32), out_lengths, updates["batch_stats"]

    return digest(jax.pmap(run, axis_name="batch", devices=jax.devices()[:2])(x, lengths))


def _filter(s):
    """Utterances whose labels need exactly the frames the base settings give them (and one more):
    any change to the frame count or the duration bounds changes which are kept."""
    seconds = np.linspace(0.1, 4.0, 40)
    frames = [geometry.output_frames(geometry.num_frames(int(t * 16_000), 320, 160), 2) for t in seconds]
    texts = [("ab" * n)[: n + i % 2] for i, n in enumerate(frames)]  # no repeats: need = length
    idx = split_index.SplitIndex.from_flat(
        *split_index.flat_index([(int(t * 16_000), text) for t, text in zip(seconds, texts)], len(seconds))
    )
    return digest(filters.Filter(DataSettings.of(s)).kept(idx, "reach"))


def _reporter(s, tmp_path):
    with reporting.Reporter(s, str(tmp_path / "r"), 0, is_chief=False) as r:
        return r.watchdog.timeout_s, r.input_wait.warn_fraction


def _divergence_stop(s, tmp_path):
    """The smallest run of consecutive skipped steps that stops training."""
    mgr = checkpoint.manager(str(tmp_path / "d"))
    for k in range(1, 40):
        try:
            train._stop_if_diverged(type("S", (), {"consecutive_skips": np.int32(k)})(), k, s, mgr)
        except FloatingPointError:
            return k
    return None


def _decoder(s, lm_files):
    cfg = dataclasses.replace(
        s.decoding,
        lm_path=lm_files.get(s.decoding.lm_path, s.decoding.lm_path),
        lexicon_path=lm_files.get(s.decoding.lexicon_path, s.decoding.lexicon_path),
    )
    beam = decoding.make_beam_decoder(cfg)
    return os.path.basename(evaluation.result_path("w", "dev-clean", 1, beam))


# ----------------------------------------------------------------------------- the table


def _normalize(s):
    """The one text normalization (build, eval, LM, transcribe) with the run's settings."""
    from ds2_jax import text

    return text.normalize("¿Qué TAL, Señor?", s.dataset.lower_case, s.dataset.strip_punctuation)


def _fine_tune_output(s):
    """Whether a fine-tune onto the source's own alphabet starts its output layer afresh (what it
    does then: test_finetune.py::test_init_output_decides_*)."""
    from ds2_jax import finetune, text

    return finetune.output_afresh(s.init_output, (text.LIBRISPEECH.symbols, text.LIBRISPEECH.symbols))


def _derived_alphabet(s):
    """A manifest build's derived alphabet (and the characters left out) with the run's settings."""
    from ds2_jax.datasets import manifest

    options = manifest.Options(alphabet_min_count=s.dataset.alphabet_min_count)
    entries = [manifest.Entry(i, str(i), "a.wav", t, normalized=t) for i, t in enumerate(["el niño", "la niña", "ß"])]
    alphabet, _, rare = manifest.make_alphabet({"train": manifest.Manifest("train", "t.tsv", entries, [])}, options)
    return alphabet.symbols, rare


def test_the_table_covers_the_whole_schema_with_a_short_justified_allowlist():
    keys = [row["key"] for row in settings.describe(settings.defaults())]
    assert set(TABLE) | set(ALLOWED) == set(keys) and not set(TABLE) & set(ALLOWED)
    assert len(ALLOWED) <= len(keys) // 4 and all(ALLOWED.values())
    for key, (value, _, consumers) in TABLE.items():
        node = settings.defaults()
        for part in key.split("."):
            node = node[part]
        assert value != node, f"{key}: {value!r} is its default"
        assert consumers, key


def _settings(key, value, others, corpus, lm_files):
    base = {
        **SYNTH,
        **(
            corpus
            if any(k.startswith("dataset.") and v == "librispeech_local" for k, v in {**others, key: value}.items())
            else {}
        ),
        **others,
    }
    changes = {**base, key: value}
    for name, path in lm_files.items():  # placeholders: the test's own files
        changes = {k: path if v == name else v for k, v in changes.items()}
        base = {k: path if v == name else v for k, v in base.items()}
    return tiny_settings(**base), tiny_settings(**changes)


# Consumers whose observation is a function of the settings alone (each compiles a program): the
# base settings' one is computed once per distinct base (most rows share SYNTH), not once a row.
_PURE = {"model", "loss", "features", "augment"}
_BASE_OBSERVED: dict = {}

CONSUMER_KEYS = [(k, c) for k, (_, _, cs) in TABLE.items() for c in cs if c != "loop"]


@pytest.mark.parametrize("key,consumer", CONSUMER_KEYS, ids=[f"{k}->{c}" for k, c in CONSUMER_KEYS])
def test_a_non_default_value_changes_what_its_consumer_does(key, consumer, corpus, lm_files, tmp_path):
    value, others, _ = TABLE[key]
    base, changed = _settings(key, value, others, corpus, lm_files)
    observe = {
        "parallel": _parallel,
        "synthetic_data": _data,
        "corpus_data": _data,
        "features": _features,
        "augment": _augment,
        "loss": _loss,
        "optimizer": _optimizer,
        "step_arguments": _step_arguments,
        "step_function": lambda s: train.step_function(s) is train.train_step,
        "update_rows": lambda s: train._devices_and_data(s)[1].global_batch,
        "initial_state": lambda s: jax.tree_util.tree_structure(
            state_lib.create_state(s, jax.random.PRNGKey(0), np.zeros(161, np.float32), np.ones(161, np.float32))
        ),
        "model": _model,
        "filter": _filter,
        "workers": lambda s: loader.resolve_num_workers(s.dataset),
        "reporter": lambda s: _reporter(s, tmp_path),
        "divergence_stop": lambda s: _divergence_stop(s, tmp_path),
        "decoder": lambda s: _decoder(s, lm_files),
        "normalize": _normalize,
        "derived_alphabet": _derived_alphabet,
        "fine_tune_output": _fine_tune_output,
    }[consumer]
    if consumer in _PURE:  # the base settings' observation, computed once for the rows that share them
        seen = (consumer, base)
        if seen not in _BASE_OBSERVED:
            _BASE_OBSERVED[seen] = observe(base)
        assert observe(changed) != _BASE_OBSERVED[seen], f"{key}={value!r} does not reach {consumer}"
        return
    assert observe(changed) != observe(base), f"{key}={value!r} does not reach {consumer}"


@pytest.mark.slow  # 15 s or more on 2 cores (2026-12-06 durations): make test runs it, test-fast does not
def test_the_loops_settings_each_change_the_run(tmp_path, caplog):
    """The settings only the training loop reads, all at their TABLE values in one short run."""
    loop = {k: v for k, (v, _, cs) in TABLE.items() if "loop" in cs}
    config = tiny_settings(**{**SYNTH, "model.num_conv_layers": 1, **loop})  # one conv block: a shorter compile
    w = str(tmp_path / "w")
    with caplog.at_level(logging.INFO, logger="ds2_jax"):
        final = train.train_and_evaluate(config, w)
        evaluation.evaluate_splits(config, w)
    assert int(final.step) == loop["num_train_steps"] == 5
    records = [json.loads(line) for line in open(os.path.join(w, "metrics.jsonl"))]
    assert [r["step"] for r in records if "loss" in r] == [2, 4, 5]  # log_every_steps, and the last step
    assert [r["step"] for r in records if "eval_wer" in r] == [4]  # eval_every_steps
    assert sorted(checkpoint.manager(w).all_steps()) == [5]  # keep_checkpoints=1 of 2, 4, 5 (checkpoint_every_steps)
    assert "(6 utterances)" in caplog.text  # eval.max_utterances in training's eval
    assert caplog.text.count("REF:") == 1  # eval.num_examples_to_print
    assert os.path.exists(os.path.join(w, "eval-test-clean-5-greedy-max6.json"))  # eval.split, --mode=eval
