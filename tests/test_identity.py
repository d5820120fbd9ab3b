"""Identity across runs, resumes and processes, as properties (issue 40, item 12).

A batch is a function of its step alone (a fresh source gives what one that served every earlier
step gives, over several epochs); a cache or result file is keyed by every input it depends on
(two configs differing in any of them never share one); a resume that changes a setting that shapes
the features is refused, one that shapes the data is recorded, and the settings a resume may change
silently (settings.Role.resume 'ignored') change no batch and no step argument.
"""

import dataclasses
import os

import numpy as np
import pytest

from ds2_jax import evaluation, features, layout, settings, workdir_config
from ds2_jax import state as state_lib
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import make_source
from tests import librispeech_testdata as td
from tests.helpers import tiny_settings


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    manual = str(root / "manual")
    td.write_durations_corpus(manual, "train-clean-100", list(np.linspace(0.5, 3.0, 10)))
    td.write_durations_corpus(manual, "test-clean", list(np.linspace(0.6, 2.5, 4)), first_speaker=50)
    return {
        "dataset.name": "librispeech_local",
        "dataset.manual_dir": manual,
        "dataset.data_dir": str(root / "tfds"),
        "dataset.train_splits": "train-clean-100",
        "dataset.eval_split": "test-clean",
        "dataset.num_buckets": 2,
        "dataset.min_duration_s": 0.0,
        "dataset.feature_stats_utterances": 4,
        "dataset.num_workers": 0,
        "num_devices": 2,
        "per_device_batch_size": 1,
    }


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("data", ["corpus", "synthetic"])
def test_a_batch_is_the_same_from_a_fresh_source_as_after_every_earlier_step_over_three_epochs(corpus, data):
    """The resume guarantee: step k's batch does not depend on the steps served before it (sortagrad's
    first epoch, the shuffles of later ones, the buckets, the pool)."""
    extra = (
        corpus
        if data == "corpus"
        else {
            "dataset.synthetic_pool_size": 3,
            "dataset.synthetic_min_duration_s": 0.3,
            "dataset.synthetic_max_duration_s": 0.6,
            "num_devices": 2,
            "per_device_batch_size": 1,
        }
    )
    config = tiny_settings(**extra)
    sharding = Sharding(2)
    served = make_source(config, sharding)
    epoch = 10 // 2 if data == "corpus" else 3
    steps = range(3 * epoch + 1)
    sequence = [served.train_batch(k) for k in steps]
    for k in steps:
        assert _same(make_source(config, sharding).train_batch(k), sequence[k]), k
    assert not all(_same(sequence[0], b) for b in sequence[1:])  # the steps differ: the check can fail


# Every input of the feature statistics (the utterances drawn and the spectrogram), one changed at a time.
STATS_INPUTS = {
    "seed": 1,
    "features.eps": 1e-3,
    "features.window_ms": 40.0,
    "features.hop_ms": 20.0,
    "dataset.min_duration_s": 1.0,
    "dataset.max_duration_s": 2.0,
    "dataset.feature_stats_utterances": 3,
    "dataset.train_splits": "train-clean-100+test-clean",
}


def test_cached_feature_statistics_are_never_another_configs(corpus):
    """Each config reads the statistics it would compute without any cache: a key omitting an input
    (the duration filters, eps) would hand it another run's."""
    base = tiny_settings(**corpus)
    data_dir = corpus["dataset.data_dir"]

    def stats(config):
        return make_source(config, Sharding(2)).feature_stats(features.spectrogram_stats)

    def cached_files():
        return {f for root, _, names in os.walk(data_dir) for f in names if f.startswith("feature_stats_")}

    stats(base)
    for key, value in STATS_INPUTS.items():
        config = tiny_settings(**{**corpus, key: value})
        before = cached_files()
        with_cache = stats(config)  # every other config's file is there
        assert len(cached_files() - before) == 1, f"{key}: read another config's statistics file"
        for root, _, names in os.walk(data_dir):
            for name in names:
                if name.startswith("feature_stats_"):
                    os.remove(os.path.join(root, name))
        fresh = stats(config)
        np.testing.assert_array_equal(with_cache[0], fresh[0], err_msg=key)
        stats(base)


def test_result_names_differ_in_every_input_of_the_decoder(tmp_path, monkeypatch):
    """Each decoding setting, the LM's folder (the same relative name from two folders), the split,
    the step and the subset: each its own eval result file."""
    import types

    def name(split="dev-clean", step=6, max_utterances=0, **changes):
        cfg = dataclasses.replace(settings.Decoding(beam_width=8, lm_path="lm.arpa"), **changes)
        beam = types.SimpleNamespace(cfg=cfg, alpha=cfg.alpha, beta=cfg.beta)
        return evaluation.result_path("w", split, step, beam, max_utterances)

    other = {
        "beam_width": 16,
        "lexicon_path": "words.txt",
        "alpha": 0.25,
        "beta": 2.0,
        "beam_prune_logp": -5.0,
        "token_min_logp": -3.0,
        "unk_score_offset": -7.0,
    }
    assert set(other) == {f.name for f in dataclasses.fields(settings.Decoding)} - {"lm_path"}
    names = [name(), name(split="test-clean"), name(step=7), name(max_utterances=5)]
    names += [name(**{k: v}) for k, v in other.items()]
    for folder in ("a", "b"):  # lm.arpa given relative to two working directories: two LMs
        os.makedirs(tmp_path / folder)
        monkeypatch.chdir(tmp_path / folder)
        names.append(name(alpha=0.75))
    assert len(set(names)) == len(names), names
    assert evaluation.lm_name("lm.arpa") != evaluation.lm_name(str(tmp_path / "a" / "lm.arpa"))


SCHEMA = [row["key"] for row in settings.describe(settings.defaults())]
SPECTROGRAM = {"features.window_ms": 40.0, "features.hop_ms": 20.0, "features.eps": 1e-3}
DATA = {
    "seed": 1,
    "per_device_batch_size": 1,
    "dataset.min_duration_s": 0.4,
    "dataset.max_duration_s": 20.0,
    "dataset.num_buckets": 2,
    "dataset.sortagrad": False,
    "dataset.train_splits": "train-clean-100",
    "dataset.feature_stats_utterances": 100,
    "dataset.synthetic_min_duration_s": 0.4,
    "dataset.synthetic_max_duration_s": 0.9,
    "dataset.synthetic_chars_per_second": 5.0,
    "dataset.synthetic_pool_size": 4,
    "features.freq_masks": 1,
    "features.time_masks": 1,
}


def test_a_resume_refuses_a_new_spectrogram_and_records_a_change_to_the_data(tmp_path):
    base = tiny_settings()
    w = str(tmp_path)
    workdir_config.save_config(base, w)
    for key, value in SPECTROGRAM.items():
        with pytest.raises(ValueError, match=key):
            workdir_config.refuse_fixed_changes(settings.override(base, {key: value}), w)
    for key, value in DATA.items():
        changed = settings.override(base, {key: value})
        workdir_config.refuse_fixed_changes(changed, w)  # not refused: a changed curriculum is allowed
        recorded = workdir_config.record_resume_changes(changed, w, 5)
        assert [k for k, _, _ in recorded] == [key], key
        os.remove(os.path.join(w, layout.CONFIG_CHANGES))


# The settings a resume may change silently (settings.Role.resume 'ignored'), fault drills aside.
NOT_TRAINING_KEYS = [k for k in SCHEMA if settings.roles()[k].resume == "ignored" and not k.startswith("faults.")]


def test_a_setting_a_resume_may_change_silently_changes_no_batch_and_no_step_argument():
    """A setting a resume ignores (settings.Role.resume): one that shaped the batches or the step
    would change what is trained without a record."""
    values = {
        "num_train_steps": 7,
        "log_every_steps": 3,
        "eval_every_steps": 3,
        "checkpoint_every_steps": 3,
        "keep_checkpoints": 1,
        "prefetch_batches": 5,
        "input_wait_warn_fraction": 0.5,
        "step_timeout_s": 9.0,
        "compilation_cache_dir": "",
        "dataset.num_workers": 2,
        "dataset.worker_buffer_size": 5,
        "eval.split": "test-clean",
        "eval.max_utterances": 3,
        "eval.num_examples_to_print": 1,
        "eval.ema_weights": False,
        "decoding.beam_width": 4,
        "decoding.alpha": 1.0,
        "decoding.beta": 0.0,
        "decoding.beam_prune_logp": -3.0,
        "decoding.token_min_logp": -2.0,
        "decoding.unk_score_offset": -5.0,
        "keep_best_checkpoints": 2,
        "init_from": "elsewhere",
        "init_output": "fresh",
    }
    needs = {"keep_best_checkpoints": {"eval_every_steps": 3}}  # (itself a key a resume may change)
    assert set(NOT_TRAINING_KEYS) - {"decoding.lm_path", "decoding.lexicon_path"} == set(values)
    small = {
        "dataset.synthetic_pool_size": 4,
        "dataset.synthetic_min_duration_s": 0.3,
        "dataset.synthetic_max_duration_s": 0.4,
    }
    base = tiny_settings(**small)

    def trained(config):
        source = make_source(config, Sharding(16))
        kw = dict(state_lib.step_kwargs(config))
        lr = kw.pop("learning_rate_fn")
        return [source.train_batch(k) for k in range(3)], repr(kw), [float(lr(k)) for k in (0, 5, 50)]

    want = trained(base)
    for key, value in values.items():
        got = trained(tiny_settings(**{**small, **needs.get(key, {}), key: value}))
        assert all(_same(a, b) for a, b in zip(got[0], want[0])) and got[1:] == want[1:], key


@pytest.mark.parametrize("damage", [b"", b"PK\x03\x04 torn", "nan"])
def test_a_torn_or_damaged_feature_statistics_cache_is_computed_again_with_a_warning(corpus, damage, caplog):
    """A kill while another tool copied it, a full disk, a hand edit: never a traceback, never NaN stats."""
    config = tiny_settings(**corpus)

    def stats():
        return make_source(config, Sharding(2)).feature_stats(features.spectrogram_stats)

    data_dir = corpus["dataset.data_dir"]
    for root, _, names in os.walk(data_dir):  # other tests' caches: this one's alone
        for name in names:
            if name.startswith("feature_stats_"):
                os.remove(os.path.join(root, name))
    want = stats()
    (path,) = [os.path.join(r, f) for r, _, names in os.walk(data_dir) for f in names if f.startswith("feature_stats_")]
    if damage == "nan":
        with open(path, "wb") as f:
            np.savez(f, mean=np.full_like(want[0], np.nan), std=want[1])
    else:
        with open(path, "wb") as f:
            f.write(damage)
    with caplog.at_level("WARNING"):
        got = stats()
    assert "feature statistics cache" in caplog.text and "is damaged" in caplog.text
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
