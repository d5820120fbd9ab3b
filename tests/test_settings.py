"""ds2_jax.settings: the config's one schema (types, defaults, checks) and its round trips."""

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import typing

import ml_collections
import pytest

from configs import default, demo, ds2_8gpu, smoke
from ds2_jax import model, settings, workdir_config
from ds2_jax import state as state_lib

SECTIONS = ["faults", "dataset", "features", "waveform", "model", "loss", "optimizer", "eval", "decoding"]


def flat_keys(d: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        out |= flat_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
    return out


def with_key(key: str, value) -> ml_collections.ConfigDict:
    """configs/default.py's ConfigDict with one dotted key set (or added)."""
    config = default.get_config()
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
        node = node[p]
    with config.unlocked():
        node[leaf] = value
    return config


def test_default_py_keys_are_the_dataclass_fields_and_its_values_their_defaults():
    config = default.get_config()
    fields = flat_keys(dataclasses.asdict(settings.Settings()))
    assert flat_keys(config.to_dict()) == fields
    for variant in (smoke, demo, ds2_8gpu):  # variants override keys, never add one
        assert flat_keys(variant.get_config().to_dict()) == fields, variant.__name__
    assert settings.from_config_dict(config) == settings.Settings()
    hints = typing.get_type_hints(settings.Settings)
    assert [k for k, t in hints.items() if dataclasses.is_dataclass(t)] == SECTIONS


def test_a_key_in_default_py_but_not_in_the_dataclasses_fails():
    extra = default.get_config()
    with extra.unlocked():
        extra.model.new_knob = 1
    with pytest.raises(ValueError, match=r"unknown config key 'model.new_knob'"):
        settings.from_config_dict(extra)


@pytest.mark.parametrize("section", ["", *SECTIONS])
def test_every_section_is_frozen(section):
    s = settings.Settings()
    obj = getattr(s, section) if section else s
    name = dataclasses.fields(obj)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, name, getattr(obj, name))


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("num_train_steps", 0, r"num_train_steps=0: must be >= 1"),
        ("per_device_batch_size", 0, r"per_device_batch_size=0: must be >= 1"),
        ("log_every_steps", 0, r"log_every_steps=0"),
        ("checkpoint_every_steps", 0, r"checkpoint_every_steps=0"),
        ("keep_checkpoints", 0, r"keep_checkpoints=0"),
        ("eval_every_steps", -1, r"eval_every_steps=-1: must be >= 0"),
        ("num_devices", -1, r"num_devices=-1: must be >= 0"),
        ("parallelism", "shard", r"parallelism='shard': expected one of \['pmap', 'jit'\]"),
        ("faults.nan_at_steps", "5,x", r"faults.nan_at_steps='5,x'"),
        ("faults.kill_at", "later:3", r"faults.kill_at='later:3'.*'step', 'checkpoint', 'eval'"),
        (
            "dataset.name",
            "timit",
            r"dataset.name='timit': expected one of \['synthetic', 'librispeech_local', 'librispeech', 'manifest'\]",
        ),
        ("dataset.name", "manifest", r"dataset.name='manifest' needs dataset.manual_dir"),
        ("dataset.stereo", "left", r"dataset.stereo='left': expected one of \['downmix', 'skip'\]"),
        ("dataset.build_workers", -2, r"dataset.build_workers=-2"),
        (
            "dataset.vocabulary",
            "vocab.txt",
            r"dataset.vocabulary='vocab.txt' is read by dataset.name='manifest' builds only",
        ),
        ("model.alphabet", "abca", r"model.alphabet: alphabet 'abca' repeats \['a'\]"),
        ("dataset.min_duration_s", 30.0, r"dataset.min_duration_s=30.0 must be >= 0 and < dataset.max_duration_s"),
        ("dataset.num_buckets", 9, r"dataset.num_buckets=9: must be 1..8"),
        ("dataset.num_buckets", 0, r"dataset.num_buckets=0: must be 1..8"),
        ("dataset.name", "librispeech_local", r"needs dataset.manual_dir"),
        ("dataset.num_workers", -2, r"dataset.num_workers=-2"),
        ("features.sample_rate", 7999, r"features.sample_rate=7999: must be 8000..48000 \(manifest data"),
        ("features.freq_masks", -1, r"features.freq_masks=-1: must be >= 0"),
        ("features.time_mask_max_fraction", 1.5, r"features.time_mask_max_fraction=1.5"),
        ("model.num_conv_layers", 4, r"num_conv_layers"),
        ("model.rnn_cell", "transformer", r"model.rnn_cell='transformer': expected one of \['gru', 'lstm', 'simple'\]"),
        ("model.dtype", "float16", r"model.dtype='float16': expected one of \['float32', 'bfloat16'\]"),
        ("model.conv_impl", "fft", r"model.conv_impl='fft': expected one of \['direct', 'space_to_depth'\]"),
        ("model.rnn_impl", "cudnn", r"model.rnn_impl='cudnn': expected one of"),
        ("model.rnn_impl", "mosaic", r"model.rnn_impl='mosaic' computes in bfloat16"),
        ("model.rnn_size", 0, r"rnn_size"),
        ("model.scan_unroll", 0, r"model.scan_unroll=0: must be >= 1"),
        ("loss.ctc_impl", "warp", r"loss.ctc_impl='warp': expected one of \['auto', 'optax', 'pallas'\]"),
        (
            "optimizer.schedule",
            "linear",
            r"optimizer.schedule='linear': expected one of \['constant', 'cosine', 'exponential'\]",
        ),
        ("optimizer.learning_rate", 0.0, r"optimizer.learning_rate=0.0: must be > 0"),
        ("optimizer.max_consecutive_skips", 0, r"optimizer.max_consecutive_skips=0"),
        ("eval.max_utterances", -1, r"eval.max_utterances=-1"),
        ("decoding.beam_width", -1, r"decoding.beam_width=-1: must be >= 0"),
        ("decoding.lm_path", "lm.arpa", r"decoding.lm_path='lm.arpa' is used by beam search only"),
        ("keep_best_checkpoints", -1, r"keep_best_checkpoints=-1: must be >= 0"),
    ],
)
def test_a_bad_value_names_its_key_and_what_is_allowed(key, value, message):
    config = with_key(key, value)
    with pytest.raises(ValueError, match=message):
        settings.from_config_dict(config)
    with pytest.raises(ValueError, match=message):  # a Settings changed after building is checked again
        settings.override(settings.Settings(), {key: value})


# ----------------------------------------------------------------------------- ranges (issue 40)

NUMERIC_KEYS = [row["key"] for row in settings.describe(settings.defaults()) if row["type"] in ("int", "float")]


def test_every_numeric_setting_has_a_row_in_the_one_range_table_and_its_default_is_in_it():
    assert NUMERIC_KEYS and set(NUMERIC_KEYS) == set(settings.RANGES)
    for row in settings.describe(settings.Settings()):
        if row["key"] in settings.RANGES:
            assert settings.RANGES[row["key"]].holds(row["default"]), row["key"]


def _just_outside(r: settings.Range, integer: bool) -> list:
    """Values next to each finite end of `r`, on its outside (the end itself when it is open)."""
    step = 1 if integer else 1e-6
    out = []
    if r.low != -float("inf"):
        out.append(r.low if r.open_low else r.low - step)
    if r.high != float("inf"):
        out.append(r.high if r.open_high else r.high + step)
    return out


@pytest.mark.parametrize("key", NUMERIC_KEYS)
def test_every_numeric_setting_refuses_nan_inf_and_values_past_its_range_naming_the_key(key):
    """The class of `x <= 0` checks that let NaN through: over the whole schema, not key by key.
    A float setting refuses NaN and both infinities (unless its row names one, e.g. -inf = none);
    every setting refuses the values just outside its range, through ConfigDict and override alike."""
    r = settings.RANGES[key]
    node = settings.defaults()
    for part in key.split("."):
        node = node[part]
    integer = isinstance(node, int)
    bad = _just_outside(r, integer)
    if not integer:
        bad += [float("nan")] + [v for v in (float("inf"), -float("inf")) if v not in r.also]
    assert bad, f"{key}: a range that refuses nothing"
    for value in bad:
        with pytest.raises(ValueError, match=rf"^{key.replace('.', '[.]')}=") as refused:
            settings.override(settings.Settings(), {key: value})
        assert "must be" in str(refused.value)
        with pytest.raises(ValueError, match=key.replace(".", "[.]")):
            settings.from_config_dict(with_key(key, value))
    for value in ([r.low] if r.low != -float("inf") and not r.open_low else []) + list(r.also):
        try:
            settings.override(settings.Settings(), {key: value})
        except ValueError as e:  # only a check relating two settings may refuse an end of the range
            assert not str(e).startswith(f"{key}="), e


def test_the_values_that_trained_nan_or_never_learned_are_refused():
    """issue 40's cases: each was accepted and trained a NaN or a silently wrong model."""
    for key, value in [
        ("optimizer.learning_rate", float("nan")),
        ("optimizer.eps", 0.0),
        ("optimizer.b2", 1.0),
        ("optimizer.clip_global_norm", -1.0),
        ("optimizer.clip_global_norm", 0.0),
        ("model.batch_norm_momentum", 1.0),
        ("features.eps", 0.0),
        ("features.hop_ms", 0.0),
        ("dataset.max_duration_s", float("inf")),
        ("step_timeout_s", float("nan")),
    ]:
        with pytest.raises(ValueError, match=rf"{key.replace('.', '[.]')}={value!r}: must be"):
            settings.override(settings.Settings(), {key: value})
    # A window the spectrogram cannot frame in hops failed at the first step, deep in features.py.
    for changes in ({"features.window_ms": 25.0}, {"features.hop_ms": 0.01}):
        with pytest.raises(ValueError, match=r"features.window_ms=.* must (be|each be)"):
            settings.override(settings.Settings(), changes)
    assert settings.override(settings.Settings(), {"features.window_ms": 40.0, "features.hop_ms": 20.0})


# ----------------------------------------------------------------------------- boundaries

TINY = 1e-9  # "just below" / "just above" a float limit


def _at_least(key, minimum, step=1):
    """A `key >= minimum` check: refused just below, accepted at and just above."""
    return [(key, minimum - step, False, {}), (key, minimum, True, {}), (key, minimum + step, True, {})]


# Every check in settings.py at, just below and just above its boundary:
# (dotted key, value, accepted, other keys set with it).
BOUNDARIES = [
    *[
        row
        for key in (
            "num_train_steps",
            "per_device_batch_size",
            "log_every_steps",
            "checkpoint_every_steps",
            "keep_checkpoints",
        )
        for row in _at_least(key, 1)
    ],
    *_at_least("eval_every_steps", 0),  # 0 = never
    *_at_least("num_devices", 0),  # 0 = all
    ("faults.nan_at_steps", "", True, {}),
    ("faults.nan_at_steps", "0", True, {}),
    ("faults.nan_at_steps", "-1", False, {}),
    ("faults.nan_at_steps", "5-5", True, {}),
    ("faults.nan_at_steps", "5-4", False, {}),  # an empty range: a typo, not "no steps"
    ("faults.kill_at", "step:0", True, {}),
    ("faults.kill_at", "step:", False, {}),
    ("faults.kill_at", "step:-1", False, {}),
    # 0 <= min_duration_s < max_duration_s (27 by default)
    ("dataset.min_duration_s", -TINY, False, {}),
    ("dataset.min_duration_s", 0.0, True, {}),
    ("dataset.min_duration_s", 27.0 - 1e-6, True, {}),
    ("dataset.min_duration_s", 27.0, False, {}),
    ("dataset.min_duration_s", 27.0 + 1e-6, False, {}),
    ("dataset.max_duration_s", 2.0 - 1e-6, False, {"dataset.min_duration_s": 2.0}),
    ("dataset.max_duration_s", 2.0, False, {"dataset.min_duration_s": 2.0}),
    ("dataset.max_duration_s", 2.0 + 1e-6, True, {"dataset.min_duration_s": 2.0}),
    *_at_least("dataset.num_buckets", 1),
    ("dataset.num_buckets", settings.MAX_BUCKETS - 1, True, {}),
    ("dataset.num_buckets", settings.MAX_BUCKETS, True, {}),
    ("dataset.num_buckets", settings.MAX_BUCKETS + 1, False, {}),
    *_at_least("dataset.num_workers", -1),  # -1 = auto
    ("dataset.manual_dir", "", False, {"dataset.name": "librispeech_local"}),
    ("dataset.manual_dir", "x", True, {"dataset.name": "librispeech_local"}),
    ("dataset.data_dir", "x", True, {"dataset.name": "librispeech_local"}),
    ("features.sample_rate", 7_999, False, {}),
    ("features.sample_rate", 8_000, True, {}),
    ("features.sample_rate", 48_000, True, {}),
    ("features.sample_rate", 48_001, False, {}),
    ("features.sample_rate", 8_000, False, {"dataset.name": "librispeech_local", "dataset.manual_dir": "x"}),
    ("features.sample_rate", 16_000, True, {"dataset.name": "librispeech_local", "dataset.manual_dir": "x"}),
    *_at_least("dataset.build_workers", -1),  # -1 = the cores
    ("dataset.manual_dir", "", False, {"dataset.name": "manifest"}),
    ("dataset.manual_dir", "x", True, {"dataset.name": "manifest"}),
    ("dataset.vocabulary", "v.txt", True, {"dataset.name": "manifest", "dataset.manual_dir": "x"}),
    *[
        row
        for key in ("features.freq_masks", "features.freq_mask_width", "features.time_masks")
        for row in _at_least(key, 0)
    ],
    ("features.time_mask_max_fraction", -TINY, False, {}),
    ("features.time_mask_max_fraction", 0.0, True, {}),
    ("features.time_mask_max_fraction", TINY, True, {}),
    ("features.time_mask_max_fraction", 1.0 - TINY, True, {}),
    ("features.time_mask_max_fraction", 1.0, True, {}),
    ("features.time_mask_max_fraction", 1.0 + TINY, False, {}),
    *_at_least("model.num_conv_layers", 1),
    ("model.num_conv_layers", 3, True, {}),
    ("model.num_conv_layers", 4, False, {}),
    *[
        row
        for key in ("model.num_rnn_layers", "model.rnn_size", "model.conv_channels", "model.scan_unroll")
        for row in _at_least(key, 1)
    ],
    *[(k, v, ok, {"model.bidirectional": False}) for k, v, ok, _ in _at_least("model.row_conv_context", 0)],
    ("optimizer.learning_rate", -TINY, False, {}),
    ("optimizer.learning_rate", 0.0, False, {}),
    ("optimizer.learning_rate", TINY, True, {}),
    *_at_least("optimizer.max_consecutive_skips", 1),
    *_at_least("optimizer.accumulate_steps", 1),
    ("optimizer.ema_decay", -TINY, False, {}),
    ("optimizer.ema_decay", 0.0, True, {}),
    ("optimizer.ema_decay", 1.0 - TINY, True, {}),
    ("optimizer.ema_decay", 1.0, False, {}),
    *_at_least("optimizer.decay_steps", 0),  # 0 = to the last step (for 'cosine')
    *[(k, v, ok, {"optimizer.schedule": "exponential"}) for k, v, ok, _ in _at_least("optimizer.decay_steps", 1)],
    *_at_least("eval.max_utterances", 0),
    *_at_least("eval.num_examples_to_print", 0),
    *_at_least("decoding.beam_width", 0),  # 0 = greedy only
    ("decoding.lm_path", "lm.arpa", False, {"decoding.beam_width": 0}),
    ("decoding.lm_path", "lm.arpa", True, {"decoding.beam_width": 1}),
    ("decoding.lexicon_path", "words.txt", False, {"decoding.beam_width": 1}),
    ("decoding.lexicon_path", "words.txt", True, {"decoding.beam_width": 1, "decoding.lm_path": "lm.arpa"}),
    ("decoding.alpha", -TINY, False, {}),
    ("decoding.alpha", 0.0, True, {}),
    ("decoding.alpha", TINY, True, {}),
    *[
        row
        for key in ("decoding.beam_prune_logp", "decoding.token_min_logp")
        for row in [(key, -TINY, True, {}), (key, 0.0, False, {}), (key, TINY, False, {})]
    ],
    *_at_least("keep_best_checkpoints", 0),  # 0 = the newest only
    ("keep_best_checkpoints", 1, False, {"eval_every_steps": 0}),  # ranked by the in-training eval
    ("keep_best_checkpoints", 0, True, {"eval_every_steps": 0}),
]


@pytest.mark.parametrize(
    "key,value,accepted,others",
    BOUNDARIES,
    ids=[f"{k}={v!r}{'+' + ','.join(o) if o else ''}" for k, v, _, o in BOUNDARIES],
)
def test_every_check_holds_at_its_boundary(key, value, accepted, others):
    """A check that moved its boundary by one (< for <=, < 0 for < 1) fails here."""
    changes = {**others, key: value}
    if accepted:
        built = settings.override(settings.Settings(), changes)
        node = built
        for part in key.split("."):
            node = getattr(node, part)
        assert node == value
    else:
        with pytest.raises(ValueError) as refused:
            settings.override(settings.Settings(), changes)
        assert key.split(".")[-1] in str(refused.value)  # the message names the setting


def test_a_kernel_for_the_simple_cell_only_is_refused_for_gru():
    config = with_key("model.rnn_cell", "gru")
    config.model.rnn_impl = "scan_vjp"
    with pytest.raises(ValueError, match=r"model.rnn_impl='scan_vjp' supports rnn_cell='simple' only"):
        settings.from_config_dict(config)
    assert settings.override(settings.Settings(), {"model.rnn_cell": "gru"}).model.rnn_impl == "auto"


def test_unsynchronized_batch_norm_is_refused_under_jit_where_it_would_do_nothing():
    message = r"model.sync_batch_norm=False with parallelism='jit'"
    with pytest.raises(ValueError, match=message):
        settings.override(settings.Settings(), {"parallelism": "jit", "model.sync_batch_norm": False})
    config = with_key("model.sync_batch_norm", False)
    config.parallelism = "jit"
    with pytest.raises(ValueError, match=message):
        settings.from_config_dict(config)
    for parallelism, sync in (("pmap", False), ("jit", True), ("pmap", True)):  # the rest stand
        s = settings.override(settings.Settings(), {"parallelism": parallelism, "model.sync_batch_norm": sync})
        assert (s.parallelism, s.model.sync_batch_norm) == (parallelism, sync)


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("model.rnn_size", "big", r"model.rnn_size='big': expected int, got str"),
        ("model.rnn_size", 2048.0, r"model.rnn_size=2048.0: expected int, got float"),
        ("model.bidirectional", 1, r"model.bidirectional=1: expected bool, got int"),
        ("compile", "yes", r"compile='yes': expected bool"),
        ("num_train_steps", True, r"num_train_steps=True: expected int, got bool"),
        ("dataset.name", 3, r"dataset.name=3: expected str"),
        ("model", 3, r"model: expected a section of settings"),
    ],
)
def test_a_wrong_type_names_its_key(key, value, message):
    config = json.loads(default.get_config().to_json())  # as config.json: any type can be written
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
    with pytest.raises(ValueError, match=message):
        settings.from_config_dict(config)


def test_an_int_is_taken_as_a_float():
    config = json.loads(default.get_config().to_json())
    config["optimizer"]["learning_rate"] = 1
    lr = settings.from_config_dict(config).optimizer.learning_rate
    assert lr == 1.0 and isinstance(lr, float)


@pytest.mark.parametrize(
    "key,message",
    [
        ("model.rnn_sise", r"unknown config key 'model.rnn_sise': did you mean model.rnn_size\b"),
        ("per_device_batch", r"unknown config key 'per_device_batch': did you mean per_device_batch_size\b"),
        ("optimiser.schedule", r"unknown config key 'optimiser': did you mean optimizer\?"),
    ],
)
def test_an_unknown_key_is_named_with_the_close_ones(key, message):
    config = json.loads(default.get_config().to_json())
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = 1
    with pytest.raises(ValueError, match=message):
        settings.from_config_dict(config)
    with pytest.raises(ValueError, match=message):
        settings.override(settings.Settings(), {key: 1})


@pytest.mark.parametrize("get_config", [default.get_config, smoke.get_config, demo.get_config, ds2_8gpu.get_config])
def test_config_json_round_trip_is_byte_for_byte_and_loads_equal(get_config, tmp_path):
    config = get_config()
    config.dataset.manual_dir = config.dataset.manual_dir or "LibriSpeech"  # ds2_8gpu's comes from a flag
    built = settings.from_config_dict(config)
    workdir_config.save_config(built, str(tmp_path))
    text = (tmp_path / "config.json").read_text()
    assert text == config.to_json(indent=2)  # the file as written before the dataclasses
    assert workdir_config.load_config(str(tmp_path)) == built
    assert settings.from_config_dict(settings.to_config_dict(built)) == built


def test_an_older_config_json_without_a_newer_key_loads_with_its_default(tmp_path):
    old = json.loads(smoke.get_config().to_json())
    del old["model"]["conv_impl"], old["compilation_cache_dir"]
    (tmp_path / "config.json").write_text(json.dumps(old))
    loaded = workdir_config.load_config(str(tmp_path))
    assert loaded.model.conv_impl == settings.Model().conv_impl and loaded.model.rnn_size == 32
    assert loaded.compilation_cache_dir == settings.Settings().compilation_cache_dir


def test_a_bad_config_json_names_the_file(tmp_path):
    bad = json.loads(smoke.get_config().to_json())
    bad["dataset"]["num_buckets"] = 20
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"config.json: dataset.num_buckets=20"):
        workdir_config.load_config(str(tmp_path))


def test_from_config_dict_is_idempotent_and_reads_like_the_config_dict():
    config = demo.get_config()
    built = settings.from_config_dict(config)
    assert settings.from_config_dict(built) is built
    for key in flat_keys(config.to_dict()):
        a, b = config, built
        for part in key.split("."):
            a, b = getattr(a, part), getattr(b, part)
        assert a == b and type(a) is type(b), key


def test_the_step_arguments_are_the_settings_sections_parts():
    config = settings.override(settings.from_config_dict(smoke.get_config()), {"features.freq_masks": 2})
    kw = state_lib.step_kwargs(config)
    assert kw["augment"] == settings.SpecAugment(
        freq_masks=2, freq_mask_width=27, time_masks=0, time_mask_max_fraction=0.05
    )
    assert type(kw["augment"]) is settings.SpecAugment and kw["augment"].enabled
    assert kw["feature_cfg"] == settings.Spectrogram()  # the step's static argument, no SpecAugment
    assert type(kw["feature_cfg"]) is settings.Spectrogram
    assert kw["model_cfg"] == model.ModelConfig.of(config.model) and kw["model_cfg"].num_bins == 161
    assert (kw["norm_by_times"], kw["ctc_impl"]) == (False, config.loss.ctc_impl) and "nan_steps" not in kw
    # Features holds the two parts' fields once, the spectrogram's first (config.json's order).
    names = [f.name for f in dataclasses.fields(settings.Features)]
    assert names == [f.name for f in dataclasses.fields(settings.Spectrogram)] + [
        f.name for f in dataclasses.fields(settings.SpecAugment)
    ]


def test_model_config_takes_the_model_section_and_keeps_its_checks():
    section = settings.from_config_dict(smoke.get_config()).model
    cfg = model.ModelConfig.of(section, num_bins=81)
    assert cfg.rnn_size == 32 and cfg.num_bins == 81
    assert {f.name: getattr(cfg, f.name) for f in dataclasses.fields(settings.Model)} == dataclasses.asdict(section)
    with pytest.raises(ValueError, match=r"model.rnn_cell='transformer'"):
        model.ModelConfig(rnn_cell="transformer")


def test_unpickling_settings_imports_no_jax():
    """Grain and beam-search workers unpickle Settings: that must not import jax."""
    blob = pickle.dumps(settings.from_config_dict(demo.get_config()))
    code = (
        "import sys, pickle; s = pickle.loads(sys.stdin.buffer.read()); assert s.model.rnn_cell == 'gru'; "
        "print(sorted(m for m in ('jax', 'flax', 'optax', 'ml_collections') if m in sys.modules))"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, input=blob, capture_output=True, check=True)
    assert out.stdout.decode().strip() == "[]"


def test_a_cosine_decay_of_0_steps_ends_at_the_last_step_whatever_num_train_steps_is():
    from ds2_jax import state

    cosine = {"optimizer.schedule": "cosine", "optimizer.decay_steps": 0, "optimizer.warmup_steps": 20}
    for steps in (500, 800):  # raising num_train_steps (a resume) stretches it
        built = settings.override(settings.Settings(), {**cosine, "num_train_steps": steps})
        assert built.optimizer.decay_steps == 0  # the setting as given (config.json too)
        opt = state.run_optimizer(built)
        assert opt.decay_steps == steps - 20 and opt == dataclasses.replace(built.optimizer, decay_steps=steps - 20)
        lr = state.learning_rate_schedule(opt)
        assert float(lr(steps)) == 0.0 and float(lr(steps - 5)) > 0.0
        assert state.idle_steps_warning(opt, 0, steps) is None
    given = settings.override(settings.Settings(), {**cosine, "optimizer.decay_steps": 100})
    assert state.run_optimizer(given) == given.optimizer  # a given length stays
    constant = settings.override(settings.Settings(), {"optimizer.decay_steps": 0})
    assert state.run_optimizer(constant) == constant.optimizer


def test_every_setting_has_its_help_as_field_metadata():
    """--print_config's meaning column comes from each field's metadata (settings.setting), so a
    field declared without it (a bare default and a comment) would print no meaning."""
    sections = {
        f.name: f.default_factory
        for f in dataclasses.fields(settings.Settings)
        if f.default_factory is not dataclasses.MISSING
    }  # Settings' own fields that are sections
    assert len(sections) >= 9
    for cls in [settings.Settings, *sections.values()]:
        missing = [name for name, text in settings.field_help(cls).items() if not text and name not in sections]
        assert not missing, f"{cls.__name__}: {missing} have no help: declare them with settings.setting(default, help)"


# The roles as workdir_config listed them beside the schema before they moved onto the fields
# (settings.Role): the fields must keep saying the same.
_FIXED_ON_RESUME = {
    *(
        f"model.{k}"
        for k in (
            "num_conv_layers",
            "conv_channels",
            "num_rnn_layers",
            "rnn_size",
            "rnn_cell",
            "share_rnn_weights",
            "bidirectional",
            "row_conv_context",
            "alphabet",
        )
    ),
    *("features.sample_rate", "features.window_ms", "features.hop_ms", "features.eps"),
    "freeze",
}
_NOT_TRAINING = (  # prefixes
    *("faults.", "eval.", "decoding.", "num_train_steps", "log_every_steps", "eval_every_steps"),
    *("checkpoint_every_steps", "keep_checkpoints", "prefetch_batches", "input_wait_warn_fraction"),
    *("step_timeout_s", "compilation_cache_dir", "dataset.num_workers", "dataset.worker_buffer_size"),
    *("keep_best_checkpoints", "init_from", "init_output"),
)
_EVAL_SETTINGS = {  # top-level keys
    *("eval", "decoding", "dataset", "per_device_batch_size", "num_devices", "compile", "parallelism"),
    *("keep_checkpoints", "prefetch_batches", "keep_best_checkpoints", "init_from", "init_output"),
}


def test_every_setting_has_a_role_on_its_field_and_the_roles_are_the_old_lists():
    """settings.roles(): each key's Role comes from its field (or its section's ROLE), and says what
    the lists beside the schema said: refused on resume, never a change, set by an evaluation,
    set by training."""
    roles = settings.roles()
    schema = [row["key"] for row in settings.describe(settings.defaults())]
    assert sorted(roles) == sorted(schema) and len(schema) > 100
    assert all(isinstance(r, settings.Role) for r in roles.values())
    assert {k for k, r in roles.items() if r.resume == "fixed"} == _FIXED_ON_RESUME
    assert {k for k, r in roles.items() if r.resume == "ignored"} == {k for k in roles if k.startswith(_NOT_TRAINING)}
    assert {k for k, r in roles.items() if r.eval == "given"} == {k for k in roles if k.split(".")[0] in _EVAL_SETTINGS}
    assert {k for k, r in roles.items() if r.set_by_training} == {"model.alphabet"}


def test_a_setting_without_a_role_is_refused_and_a_role_takes_its_values_only():
    @dataclasses.dataclass(frozen=True)
    class Section:
        a: int = settings.setting(1, "has one", role=settings.FIXED)
        b: int = settings.setting(2, "has none")

    @dataclasses.dataclass(frozen=True)
    class WithDefault(Section):
        ROLE: typing.ClassVar[settings.Role] = settings.TRAINS

    with pytest.raises(TypeError, match="b has no role"):
        settings.roles(Section, "s.")
    assert settings.roles(WithDefault, "s.") == {"s.a": settings.FIXED, "s.b": settings.TRAINS}
    with pytest.raises(ValueError, match="Role.resume"):
        settings.Role("kept", "trained")


def test_an_evaluation_takes_what_its_role_says_from_config_json_and_a_removed_key_follows_its_section():
    trained = {
        "seed": 3,
        "per_device_batch_size": 8,
        "dataset": {"name": "manifest", "a_removed_setting": 1},
        "model": {"rnn_size": 5, "a_removed_setting": 2},
        "features": {"hop_ms": 5.0, "time_masks": 2},
        "eval": {"split": "x"},
    }
    assert workdir_config._trained_part(trained) == {  # dataset and eval: given whole, as before
        "seed": 3,
        "model": {"rnn_size": 5, "a_removed_setting": 2},  # refused by from_config_dict, naming it
        "features": {"hop_ms": 5.0, "time_masks": 2},
    }
    given = settings.to_dict(settings.override(settings.Settings(), {"model.alphabet": ""}))
    trained = settings.to_dict(settings.override(settings.Settings(), {"model.alphabet": "ab '"}))
    assert workdir_config.differing_keys(trained, given) == []  # set by training: '' differs in nothing
    given = settings.to_dict(settings.override(settings.Settings(), {"model.alphabet": "ab"}))
    assert [k for k, _, _ in workdir_config.differing_keys(trained, given)] == ["model.alphabet"]


# ----------------------------------------------------------------------------- resume, field by field

# A valid other value for the settings whose type alone does not give one.
_OTHER_VALUE = {
    "parallelism": "jit",
    "init_output": "fresh",
    "faults.kill_at": "step:3",
    "dataset.name": "librispeech",
    "dataset.vocabulary": "vocab.txt",
    "dataset.stereo": "skip",
    "model.dtype": "bfloat16",
    "model.conv_impl": "direct",
    "model.rnn_impl": "scan",
    "loss.ctc_impl": "optax",
    "decoding.lm_path": "lm.arpa",
    "decoding.lexicon_path": "words.txt",
    "waveform.speed_min": 0.8,  # 0.9 * 2 is past speed_max, 0.45 below the range
}


# The settings a key is read with (it is refused where they are off): the trained run has them too.
_CONTEXT = {
    "dataset.vocabulary": {"dataset.name": "manifest", "dataset.manual_dir": "m"},
    "decoding.lm_path": {"decoding.beam_width": 8},
    "decoding.lexicon_path": {"decoding.beam_width": 8, "decoding.lm_path": "lm.arpa"},
    "waveform.noise_prob": {"waveform.noise_dir": "noise"},
    "waveform.rir_prob": {"waveform.rir_dir": "rirs"},
}


def _other_value(key: str, value, base: settings.Settings):
    """A value of `key` other than `value` that settings.override accepts alone over `base`."""
    if key in _OTHER_VALUE:
        candidates = [_OTHER_VALUE[key]]
    elif isinstance(value, bool):
        candidates = [not value]
    elif isinstance(value, int):
        candidates = [value + 1, value * 2, value - 1, 1, 0]
    elif isinstance(value, float):
        candidates = [value * 2 if value else 0.5, value + 0.5, value / 2, 0.1]
    else:
        candidates = [value + "x", "x", "gru", "cosine", "1"]
    for c in candidates:
        if c == value:
            continue
        try:
            settings.override(base, {key: c})
            return c
        except ValueError:
            continue
    raise AssertionError(f"no other valid value for {key}: add one to _OTHER_VALUE")


@pytest.mark.parametrize("key", sorted(flat_keys(settings.to_dict(settings.Settings()))))
def test_a_resume_that_changes_one_setting_alone_refuses_it_by_name_or_records_it_as_its_role_says(key, tmp_path):
    """Every setting, changed alone on a resume: a 'fixed' one is refused naming it (trained and
    --config values) and no other; a 'recorded' one is accepted and recorded in config_changes.jsonl
    as the one change; an 'ignored' one is accepted and recorded nowhere."""
    trained = settings.override(settings.Settings(), _CONTEXT.get(key, {}))
    workdir_config.save_config(trained, str(tmp_path))
    was = workdir_config.flat(settings.to_dict(trained))[key]
    value = _other_value(key, was, trained)
    resumed = settings.override(trained, {key: value})
    now = workdir_config.flat(settings.to_dict(resumed))[key]
    role = settings.roles()[key].resume
    if role == "fixed":
        with pytest.raises(ValueError) as e:
            workdir_config.refuse_fixed_changes(resumed, str(tmp_path))
        named = str(e.value).split("; a resumed run")[0].split("--config: ")[1]
        assert named == f"{key} (trained {was!r}, --config {now!r})", named
        return
    workdir_config.refuse_fixed_changes(resumed, str(tmp_path))
    changes = workdir_config.record_resume_changes(resumed, str(tmp_path), step=5)
    assert changes == ([] if role == "ignored" else [(key, was, now)])


@pytest.mark.parametrize("key", sorted(flat_keys(settings.to_dict(settings.Settings()))))
def test_the_workdirs_config_round_trips_each_setting_at_a_non_default_value(key, tmp_path):
    """config.json written by a run and read back (workdir_config.save_config / load_config) gives
    the same Settings, each setting in turn at a value other than its default."""
    base = settings.override(settings.Settings(), _CONTEXT.get(key, {}))
    was = workdir_config.flat(settings.to_dict(base))[key]
    config = settings.override(base, {key: _other_value(key, was, base)})
    workdir_config.save_config(config, str(tmp_path))
    assert workdir_config.load_config(str(tmp_path)) == config
