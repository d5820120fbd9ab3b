"""ds2_jax.infer.streaming and transcribe --stream: a unidirectional model fed in chunks gives the
whole-file forward pass's log-probs (to STREAM_TOLERANCE), each frame as soon as its lookahead
has arrived; a bidirectional model is refused with one error line."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from ds2_jax import audio as audio_lib
from ds2_jax import forward, transcribe
from ds2_jax import state as state_lib
from ds2_jax.infer import onnx_model, streaming
from tests.helpers import CORPUS, ROOT, repo_env, tiny_settings

# Streaming runs the same float32 ops per frame, in other shapes: measured max |difference| 7e-7.
STREAM_TOLERANCE = 1e-5
FLAC = os.path.join(CORPUS, "LibriSpeech", "test-clean", "118", "1180", "118-1180-0001.flac")


def _unidirectional(**overrides):
    """(settings, state) of a random-init unidirectional model whose batch-norm statistics and
    feature statistics are not the identity (so carrying them wrongly shows)."""
    config = tiny_settings(**{"model.bidirectional": False, "model.num_rnn_layers": 2, **overrides})
    rng = np.random.default_rng(0)
    bins = config.features.num_bins
    state = state_lib.create_state(
        config,
        jax.random.PRNGKey(0),
        rng.normal(-10, 1, bins).astype(np.float32),
        rng.uniform(1, 3, bins).astype(np.float32),
    )
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


def test_a_bidirectional_model_is_refused_with_one_error_line(tmp_path):
    from ds2_jax import workdir_config

    workdir = str(tmp_path / "bi")
    workdir_config.save_config(tiny_settings(), workdir)  # refused before any checkpoint is read
    proc = subprocess.run(
        [sys.executable, "-m", "ds2_jax.transcribe", f"--workdir={workdir}", "--stream", FLAC],
        cwd=ROOT,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = proc.stderr.strip()
    assert (
        proc.returncode == 1
        and err.startswith("error: --stream: streaming needs a unidirectional model")
        and "\n" not in err
    )
