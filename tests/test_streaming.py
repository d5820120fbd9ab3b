"""ds2_jax.infer.streaming and transcribe --stream: a unidirectional model fed in chunks gives the
whole-file forward pass's log-probs (to STREAM_TOLERANCE), each frame as soon as its lookahead
has arrived; a bidirectional model's stream is re-decoded from the start, within its bounds."""

import os

import jax
import numpy as np
import pytest

from ds2_jax import audio as audio_lib
from ds2_jax import forward, transcribe
from ds2_jax import state as state_lib
from ds2_jax.infer import onnx_model, streaming
from tests.helpers import CORPUS, random_model_workdir, random_state, tiny_settings

# Streaming runs the same float32 ops per frame, in other shapes: measured max |difference| 7e-7.
STREAM_TOLERANCE = 1e-5
FLAC = os.path.join(CORPUS, "LibriSpeech", "test-clean", "118", "1180", "118-1180-0001.flac")


def _unidirectional(**overrides):
    """(settings, state) of a random-init unidirectional model whose batch-norm statistics and
    feature statistics are not the identity (so carrying them wrongly shows)."""
    config = tiny_settings(**{"model.bidirectional": False, "model.num_rnn_layers": 2, **overrides})
    rng = np.random.default_rng(0)
    state = random_state(config, 0, rng)
    stats = jax.tree_util.tree_map(lambda x: x + rng.uniform(0.1, 0.5, x.shape).astype(np.float32), state.batch_stats)
    return config, state.replace(batch_stats=stats)


@pytest.fixture(scope="module")
def unidirectional():
    """_unidirectional() at the default overrides, made once for the tests that take it."""
    return _unidirectional()


def _whole_file(config, state, audio) -> np.ndarray:
    kw = state_lib.step_kwargs(config)
    logits, n = forward.forward(
        state, audio[None], np.array([len(audio)]), model_cfg=kw["model_cfg"], feature_cfg=kw["feature_cfg"]
    )
    return np.asarray(jax.nn.log_softmax(logits[0, : int(n[0])], axis=-1))


@pytest.mark.parametrize(
    "overrides",
    [
        {"model.rnn_cell": "lstm", "model.num_conv_layers": 3},
        pytest.param({"model.rnn_cell": "gru", "model.row_conv_context": 0}, marks=pytest.mark.slow),
    ],
)
def test_chunks_of_any_size_give_the_whole_files_log_probs(overrides):
    config, state = _unidirectional(**overrides)
    audio = audio_lib.read(FLAC, 16_000)
    whole = _whole_file(config, state, audio)
    for chunk in (10240, 1237):  # 640 ms, and one that splits windows and conv strides
        stream = streaming.Stream(config, state)
        pieces = [stream.feed(audio[i : i + chunk]) for i in range(0, len(audio), chunk)] + [stream.finish()]
        got = np.concatenate(pieces)
        assert got.shape == whole.shape, chunk
        assert np.abs(got - whole).max() < STREAM_TOLERANCE, chunk
        assert (got.argmax(-1) == whole.argmax(-1)).all()


@pytest.mark.xdist_group("streaming")  # one worker builds the shared model
@pytest.mark.slow
def test_each_frame_comes_once_its_lookahead_has_arrived(unidirectional):
    """Frame j needs the samples up to its own hop plus onnx_model.lookahead_seconds: no earlier (the
    whole-file values could not be known), no later (latency)."""
    config, state = unidirectional
    fc = config.features.spectrogram
    stride = 3  # geometry.FIRST_CONV's time stride
    lookahead = round(onnx_model.lookahead_seconds(config) * fc.sample_rate)
    assert lookahead == (5 + 5 * stride + config.model.row_conv_context * stride) * fc.hop + fc.window - fc.hop
    audio = audio_lib.read(FLAC, 16_000)
    stream, emitted = streaming.Stream(config, state), 0
    for fed in range(800, 16_000, 800):
        emitted += len(stream.feed(audio[fed - 800 : fed]))
        ready = sum(1 for j in range(fed) if stride * j * fc.hop + fc.hop + lookahead <= fed)
        assert emitted == ready, fed


@pytest.mark.xdist_group("streaming")
@pytest.mark.slow  # 15 s or more on 2 cores (2026-12-06 durations): make test runs it, test-fast does not
def test_transcribe_stream_prints_partials_and_the_whole_files_line(tmp_path, capsys, unidirectional):
    from ds2_jax import checkpoint, workdir_config

    config, state = unidirectional
    workdir = str(tmp_path / "w")
    with checkpoint.managed(workdir) as mgr:
        checkpoint.save(mgr, 0, jax.device_get(state), wait=True)
    workdir_config.save_config(config, workdir)
    assert transcribe.main([f"--workdir={workdir}", FLAC]) == 0
    whole = capsys.readouterr().out
    assert transcribe.main([f"--workdir={workdir}", "--stream", "--chunk_ms=160", FLAC]) == 0
    out, err = capsys.readouterr()
    assert out == whole and err.count("partial: ") >= 2, err


def test_a_bidirectional_models_stream_is_redecoded_within_its_bounds_and_ends_with_the_files_text(
    tmp_path, capsys, monkeypatch
):
    """A bidirectional model streams by decoding all the audio so far again: every partial is the text
    of the audio received so far in order, at most max(REDECODE_SECONDS, REDECODE_SHARE of it) old;
    the decodes together stay within the compute bound engine.py states (not one per chunk); the
    final is the whole file's text and words, and transcribe --stream prints the whole file's line."""
    from ds2_jax import settings
    from ds2_jax.infer import engine as engine_lib
    from ds2_jax.infer import jax_backend

    # REDECODE_SECONDS 0.1 (as the default 1 s over a stream 10 times as long): decoding every 0.1 s, or
    # every chunk, would cover ~700 s of this 12 s stream's audio; the bound is ~120 s.
    monkeypatch.setattr(engine_lib, "REDECODE_SECONDS", 0.1)
    # Windows of 4 s (1 s of context each side): a pass holds several windows, as a long stream's does
    monkeypatch.setattr(engine_lib, "WINDOW_SECONDS", 4.0)
    monkeypatch.setattr(engine_lib, "CONTEXT_SECONDS", 1.0)
    workdir = random_model_workdir(str(tmp_path / "bi"), **{"model.num_rnn_layers": 2})
    engine = jax_backend.JaxEngine(workdir, settings.Decoding(beam_width=0))
    rate, chunk = engine.sample_rate, 1_600
    one = audio_lib.read(FLAC, rate)
    audio = np.concatenate([one] * (-(-12 * rate // len(one))))[: 12 * rate]  # 12 s: past the first phase's 8
    want_text, want_words = engine.transcribe_timed([audio])[0]
    assert want_text  # noise from a random model, but some: equal empty texts would prove nothing
    decodes, rows = [], []  # (samples decoded, their greedy text); the windows per pass each decode asked for
    frame_outputs = engine.frame_outputs

    def recorded(waveforms, batch_size=None):
        out = frame_outputs(waveforms, batch_size)
        assert len(waveforms) == 1 and np.array_equal(waveforms[0], audio[: len(waveforms[0])])  # what came, in order
        decodes.append((len(waveforms[0]), engine_lib.greedy_text(out[0], engine.alphabet)))
        rows.append(batch_size)
        return out

    engine.frame_outputs = recorded
    utterance = engine.stream()
    for first in range(0, len(audio), chunk):
        text = utterance.feed(audio[first : first + chunk])
        received = min(first + chunk, len(audio))
        newest = decodes[-1] if decodes else (0, "")  # nothing decoded in the first REDECODE_SECONDS
        assert text == newest[1], received
        assert received - newest[0] < max(engine_lib.REDECODE_SECONDS * rate, engine_lib.REDECODE_SHARE * received)
    assert utterance.finish() == want_text and utterance.words() == want_words
    assert decodes[-1][0] == len(audio)
    assert rows[-1] is None  # the final as transcribe runs it; partials: one pass, no padding rows
    assert rows[:-1] == [min(len(engine.windows(n)), engine.batch_size) for n, _ in decodes[:-1]]
    early = engine_lib.REDECODE_SECONDS / engine_lib.REDECODE_SHARE  # seconds decoded once a second
    bound = (2 + 1 / engine_lib.REDECODE_SHARE) * len(audio) + early * (early + 1) / 2 * rate
    assert sum(n for n, _ in decodes) <= bound, decodes  # linear in the stream's length, not quadratic
    engine.frame_outputs = frame_outputs
    capsys.readouterr()
    assert transcribe.main([f"--workdir={workdir}", FLAC]) == 0
    whole = capsys.readouterr().out
    assert transcribe.main([f"--workdir={workdir}", "--stream", "--chunk_ms=160", FLAC]) == 0
    out, err = capsys.readouterr()
    assert out == whole and err.count("partial: ") >= 1, err
