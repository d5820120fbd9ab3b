"""ds2_jax.timing: the emission delay measured from speech onsets, and word times moved by it.

The end to end check, a trained model against audio of known word boundaries, is
tests/test_word_timings.py; here the measurement's rules, on hand-made argmax paths."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ds2_jax import decoding, export, layout, settings, text, timing
from ds2_jax.infer import delay as delay_lib
from ds2_jax.infer import onnx_model

RATE = 16_000
FRAME = 0.03


def _wave(lead_in_s: float, seconds: float = 0.5) -> np.ndarray:
    """Silence for lead_in_s, then a tone."""
    tone = (3000 * np.sin(2 * np.pi * 440 * np.arange(int(seconds * RATE)) / RATE)).astype(np.int16)
    return np.concatenate([np.zeros(int(lead_in_s * RATE), np.int16), tone])


def _path(spelled: str) -> np.ndarray:
    """'_' is the blank, any other character its LibriSpeech label."""
    return np.array([text.BLANK if c == "_" else text.LIBRISPEECH.symbols.index(c) + 1 for c in spelled], np.int32)


class _Paths:
    """What emission_delay reads of a Transcriber, with given argmax paths (or errors) as its outputs."""

    sample_rate, alphabet, frame_seconds = RATE, text.LIBRISPEECH, FRAME

    def __init__(self, outputs):
        self.outputs = outputs

    def frame_outputs(self, waveforms):
        assert len(waveforms) == len(self.outputs)
        return self.outputs


def test_speech_onset_is_the_first_sample_above_two_percent_of_the_peak():
    assert delay_lib.speech_onset(_wave(0.25), RATE) == pytest.approx(0.25, abs=2 / RATE)
    quiet = _wave(0.1)
    quiet[800] = 50  # under 2% of the 3000 peak: not speech
    assert delay_lib.speech_onset(quiet, RATE) == pytest.approx(0.1, abs=2 / RATE)
    assert delay_lib.speech_onset(np.zeros(RATE, np.int16), RATE) is None


def test_delay_is_the_median_lag_of_first_words_after_a_lead_in_of_silence():
    """Counted: utterances with a lead-in and a word. Left out: speech from the first sample (no
    silence to measure from), silence, no word, a failed file. Later words never count."""
    waves = [_wave(0.2), _wave(0.1), _wave(0.15), _wave(0.0), np.zeros(RATE, np.int16), _wave(0.2), _wave(0.2)]
    outputs = [
        _path("_" * 10 + "ab _" + "_" * 19 + "c"),  # first word at frame 10: 0.30 - 0.20 = 0.10 s late
        _path("_" * 8 + "a"),  # 0.24 - 0.10 = 0.14
        _path("_" * 12 + "a _" + "b"),  # 0.36 - 0.15 = 0.21 (the second word does not count)
        _path("__a"),  # no lead-in: left out
        _path("__a"),  # silence: left out
        _path("_" * 12),  # no word: left out
        RuntimeError("a failed batch"),
    ]
    delay, count = delay_lib.emission_delay(_Paths(outputs), waves)
    assert count == 3 and delay == pytest.approx(0.14, abs=2 / RATE)  # the median (the mean: 0.15); onsets to a sample
    assert delay_lib.emission_delay(_Paths([_path("__")]), [_wave(0.2)]) == (0.0, 0)


def test_word_times_move_earlier_by_the_delay_and_never_before_zero():
    path = _path("__ab__ _c_")
    plain = decoding.word_timings(path, len(path), text.LIBRISPEECH, FRAME)
    moved = decoding.word_timings(path, len(path), text.LIBRISPEECH, FRAME, delay=0.07)
    assert [w.word for w in moved] == [w.word for w in plain] == ["ab", "c"]
    for p, m in zip(plain, moved):
        assert m.start == pytest.approx(max(p.start - 0.07, 0.0)) and m.end == pytest.approx(max(p.end - 0.07, 0.0))
    early = decoding.word_timings(path, len(path), text.LIBRISPEECH, FRAME, delay=1.0)
    assert all(w.start == 0.0 and w.end == 0.0 for w in early)


def test_the_export_carries_the_delay_and_an_unmeasured_or_older_export_reads_as_none():
    """A delay the export could not measure is written 'unmeasured', never 0: a runner reads None
    (word times uncorrected, and it says so), as it does for an export from before the key."""
    props = export.metadata(settings.Settings(), 7, emission_delay_s=0.0625)
    assert onnx_model.MetaData.of(props, "x.onnx").emission_delay_s == 0.0625
    assert onnx_model.MetaData.of(props, "x.onnx").props() == props  # one spelling of the keys, both ways
    unmeasured = export.metadata(settings.Settings(), 7, emission_delay_s=None)
    assert unmeasured["ds2_jax.emission_delay_s"] == onnx_model.UNMEASURED
    assert onnx_model.MetaData.of(unmeasured, "x.onnx").emission_delay_s is None
    older = {k: v for k, v in props.items() if k != "ds2_jax.emission_delay_s"}
    assert onnx_model.MetaData.of(older, "x.onnx").emission_delay_s is None


def test_a_recorded_delay_is_per_checkpoint_step(tmp_path):
    (tmp_path / layout.TIMING).write_text('{"120": {"emission_delay_s": 0.09, "utterances": 5, "split": "dev"}}')
    assert delay_lib.recorded(str(tmp_path), 120) == 0.09
    assert delay_lib.recorded(str(tmp_path), 160) is None  # another checkpoint: measured again
    assert delay_lib.recorded(str(tmp_path / "elsewhere"), 120) is None


def test_two_checkpoints_delays_both_survive_in_timing_json(tmp_path, monkeypatch):
    """timing.json is read, changed and written: a second checkpoint's delay joins the first's, which
    stays, and each reads back as its own."""
    from types import SimpleNamespace

    delays = {120: 0.09, 160: 0.06}
    monkeypatch.setattr(timing, "eval_split_waveforms", lambda config: ("dev", ["w"] * 5))
    monkeypatch.setattr(delay_lib, "emission_delay", lambda engine, waves: (delays[engine.step], len(waves)))
    for step in delays:
        assert timing.delay_of_workdir(str(tmp_path), SimpleNamespace(step=step, config=None)) == delays[step]
    table = json.loads((tmp_path / layout.TIMING).read_text())
    assert table == {str(s): {"emission_delay_s": d, "utterances": 5, "split": "dev"} for s, d in delays.items()}
    assert [delay_lib.recorded(str(tmp_path), s) for s in delays] == list(delays.values())


@pytest.mark.parametrize(
    "changes, step, delay, same_as_default",
    [
        (
            {
                "model.alphabet": " abcdeñ'",
                "features.sample_rate": 8000,
                "features.window_ms": 37.5,
                "features.hop_ms": 12.5,
                "features.eps": 1e-10,
                "model.num_conv_layers": 1,
                "model.bidirectional": False,
                "model.row_conv_context": 7,
            },
            12345,
            0.0875,
            set(),
        ),
        (
            {"model.num_conv_layers": 3, "model.bidirectional": False, "model.row_conv_context": 0},
            1,
            0.25,
            {"alphabet", "sample_rate", "hop", "window", "eps", "frame_seconds"},
        ),
    ],
)
def test_every_export_metadata_field_round_trips_at_non_default_values(changes, step, delay, same_as_default):
    """export.metadata -> onnx_model.MetaData.of gives back every field, each set away from its
    default (the alphabet, the spectrogram, the conv stack, a unidirectional model's lookahead with
    and without a row convolution, the step, the delay)."""
    import dataclasses

    from ds2_jax import geometry

    config = settings.override(settings.Settings(), changes)
    got = onnx_model.MetaData.of(export.metadata(config, step, emission_delay_s=delay), "x.onnx")
    spec, mc = config.features.spectrogram, config.model
    want = {
        "alphabet": text.Alphabet.of_setting(mc.alphabet),
        "sample_rate": spec.sample_rate,
        "hop": spec.hop,
        "window": spec.window,
        "eps": spec.eps,
        "num_conv_layers": mc.num_conv_layers,
        "frame_seconds": spec.hop * geometry.FIRST_CONV.strides[0] / spec.sample_rate,
        "bidirectional": mc.bidirectional,
        "lookahead_seconds": onnx_model.lookahead_seconds(config),
        "step": step,
        "emission_delay_s": delay,
    }
    assert sorted(want) == sorted(f.name for f in dataclasses.fields(onnx_model.MetaData))
    assert {f: getattr(got, f) for f in want} == want
    default = onnx_model.MetaData.of(export.metadata(settings.Settings(), 0), "x.onnx")
    assert {
        f for f in want if getattr(default, f) == want[f]
    } == same_as_default  # the values tested are not the defaults
