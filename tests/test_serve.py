"""ds2-serve (ds2_jax.serve) on a free loopback port: uploads and streams give the command line's
texts and word times; bad input, stalled clients and loads past each limit get a clear JSON error
and the server stays up; every limit setting reaches its effect."""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import time

import numpy as np
import pytest
import soundfile

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from ds2_jax import audio as audio_lib  # noqa: E402
from ds2_jax import settings, transcribe  # noqa: E402
from ds2_jax.infer import engine as engine_lib  # noqa: E402
from ds2_jax.infer import jax_backend  # noqa: E402
from ds2_jax.serve import app, limits, server  # noqa: E402
from tests.helpers import CORPUS, random_model_workdir  # noqa: E402
from tests.serving import serving  # noqa: E402

TEST_CLEAN = os.path.join(CORPUS, "LibriSpeech", "test-clean")
TWO_LAYERS = {"model.num_rnn_layers": 2}  # the served random models: tiny_settings with a second RNN layer
FLACS = sorted(os.path.join(r, f) for r, _, fs in os.walk(TEST_CLEAN) for f in fs if f.endswith(".flac"))[:4]


@pytest.fixture(scope="module")
def uni(tmp_path_factory) -> tuple[str, object]:
    workdir = random_model_workdir(
        str(tmp_path_factory.mktemp("serve") / "uni"), **TWO_LAYERS, **{"model.bidirectional": False}
    )
    return workdir, jax_backend.JaxEngine(workdir, settings.Decoding(beam_width=0))


def _cli_lines(workdir: str, paths: list[str], capsys) -> list[dict]:
    capsys.readouterr()
    assert transcribe.main(["--workdir", workdir, "--timestamps", "--json", *paths]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _stream(url: str, samples: np.ndarray, rate: int = 16_000, chunk: int = 1600, words: bool = True):
    """(partial messages, final message) of streaming `samples` to /v1/stream."""
    ws_url = url.replace("http", "ws") + f"/v1/stream?rate={rate}" + ("&words=true" if words else "")
    partials = []
    with connect(ws_url, open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "ready"
        for i in range(0, len(samples), chunk):
            ws.send(samples[i : i + chunk].astype("<i2").tobytes())
            partials.append(json.loads(ws.recv(timeout=60)))
        ws.send(json.dumps({"type": "end"}))
        final = json.loads(ws.recv(timeout=60))
    return partials, final


def test_uploads_and_streams_give_the_command_lines_texts_and_word_times(uni, capsys):
    """POST /v1/transcribe?words=true and a stream of the same file: transcribe --json --timestamps's
    text and words (a random-init model: its texts are noise, but the same noise by every path)."""
    workdir, engine = uni
    want = _cli_lines(workdir, FLACS, capsys)
    assert any(w["text"] for w in want)  # noise, but some: equal empty texts would prove nothing
    with serving(engine) as url:
        with httpx.Client(timeout=120) as client:
            for path, line in zip(FLACS, want):
                got = client.post(f"{url}/v1/transcribe?words=true", content=open(path, "rb").read())
                assert got.status_code == 200, got.text
                assert got.json()["text"] == line["text"] and got.json()["words"] == line["words"]
            assert "words" not in client.post(f"{url}/v1/transcribe", content=open(FLACS[0], "rb").read()).json()
        samples = audio_lib.read(FLACS[1], 16_000)
        partials, final = _stream(url, samples)
        assert final == {
            "type": "final",
            "text": want[1]["text"],
            "words": want[1]["words"],
            "audio_s": final["audio_s"],
        }
        assert final["audio_s"] == pytest.approx(len(samples) / 16_000, abs=1e-3)
        assert [p["type"] for p in partials] == ["partial"] * len(partials)
        texts = [p["text"] for p in partials]
        assert all(want[1]["text"].startswith(t.rstrip()) for t in texts)  # partials only grow toward the final
        health = httpx.get(f"{url}/healthz").json()
        assert health["status"] == "ok" and health["model"]["streaming"] and health["model"]["sample_rate"] == 16_000
        metrics = httpx.get(f"{url}/metrics").text
        assert 'ds2_requests_total{endpoint="transcribe"} 5.0' in metrics
        assert 'ds2_requests_total{endpoint="stream"} 1.0' in metrics
        assert "ds2_active_streams 0.0" in metrics and "ds2_audio_seconds_total" in metrics


def test_a_stream_at_another_rate_is_resampled(uni, tmp_path):
    """PCM declared at 48 kHz is resampled to the model's rate: the final has the audio's length and
    the text of the same audio at 16 kHz within a character or two (soxr's stream vs. whole file)."""
    _, engine = uni
    import soxr

    samples = audio_lib.read(FLACS[0], 16_000)
    high = soxr.resample(samples, 16_000, 48_000)
    with serving(engine) as url:
        _, final = _stream(url, high, rate=48_000, chunk=4800, words=False)
        _, same = _stream(url, samples, words=False)
    assert final["audio_s"] == pytest.approx(len(samples) / 16_000, abs=1e-3)
    from ds2_jax import metrics

    assert metrics.error_rates([same["text"]], [final["text"]])["cer"] <= 0.2


def _error(response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_bad_uploads_get_a_clear_json_error_and_the_server_stays_up(uni, tmp_path):
    _, engine = uni
    raw = open(FLACS[0], "rb").read()
    wav = str(tmp_path / "a.wav")
    soundfile.write(wav, audio_lib.read(FLACS[0], 16_000), 16_000, subtype="PCM_16")
    cut = open(wav, "rb").read()
    limit = max(len(raw), len(cut) // 2) + 10
    over = raw + b"\0" * (limit - len(raw) + 1)
    with serving(engine, max_upload_bytes=limit) as url, httpx.Client(timeout=60) as client:
        post = lambda body: client.post(f"{url}/v1/transcribe", content=body)  # noqa: E731
        assert _error(post(b"")) == (400, "empty_audio")
        assert _error(post(os.urandom(5000))) == (400, "corrupt_audio")
        assert _error(post(cut[: len(cut) // 2])) == (400, "truncated_audio")
        assert _error(post(np.zeros(100, np.int16).tobytes())) == (400, "corrupt_audio")  # raw PCM, no header
        short = str(tmp_path / "short.wav")
        soundfile.write(short, np.zeros(80, np.int16), 16_000)
        assert _error(post(open(short, "rb").read())) == (400, "too_short")
        assert _error(post(over)) == (413, "too_large")  # max_upload_bytes reaches its effect
        assert post(raw).status_code == 200
        chunked = client.post(f"{url}/v1/transcribe", content=iter([raw, over[len(raw) :]]))  # no Content-Length
        assert _error(chunked) == (413, "too_large")
        assert client.get(f"{url}/healthz").status_code == 200
        assert 'ds2_errors_total{code="too_large",endpoint="transcribe"} 2.0' in client.get(f"{url}/metrics").text


def test_bad_streams_get_a_clear_json_error_and_close(uni, tmp_path):
    """A missing or wrong rate (refused before the socket opens: a 400 with the JSON error), an odd
    byte count, a text message other than 'end', a stream past max_stream_seconds, a client that
    stalls past idle_timeout_s or vanishes: each ends that stream only."""
    _, engine = uni
    with serving(engine, idle_timeout_s=0.5, max_stream_seconds=2.0) as url:
        ws = url.replace("http", "ws") + "/v1/stream"
        for query in ("", "?rate=1000", "?rate=abc"):
            with pytest.raises(InvalidStatus) as refused:
                connect(ws + query, open_timeout=10)
            assert refused.value.response.status_code == 400
            assert json.loads(refused.value.response.body)["error"]["code"] == "bad_rate"

        def ends_with(messages: list, want_code: str) -> None:
            with connect(ws + "?rate=16000", open_timeout=10) as c:
                assert json.loads(c.recv(timeout=10))["type"] == "ready"
                for m in messages:
                    c.send(m)
                got = None
                with pytest.raises(ConnectionClosed):
                    while True:
                        got = json.loads(c.recv(timeout=10))
                assert got["type"] == "error" and got["code"] == want_code, got

        ends_with([b"\x00\x01\x02"], "bad_pcm")
        ends_with(['{"type": "stop"}'], "bad_message")
        ends_with([np.zeros(16_000, np.int16).tobytes()] * 3, "too_long")  # max_stream_seconds=2
        started = time.monotonic()
        ends_with([np.zeros(1600, np.int16).tobytes()], "idle")  # then silence: idle_timeout_s=0.5
        assert time.monotonic() - started < 5
        c = connect(ws + "?rate=16000", open_timeout=10)
        c.send(np.zeros(1600, np.int16).tobytes())
        c.close()  # vanishes mid-stream
        time.sleep(0.3)
        health = httpx.get(f"{url}/healthz").json()
        assert health["status"] == "ok" and health["active_streams"] == 0


def test_a_bidirectional_models_stream_is_redecoded_and_ends_with_the_uploads_text(tmp_path):
    """A bidirectional model's stream: partials re-decoded from the start (each the text of a prefix of
    what was sent), the final and its words those of an upload of the same audio; /healthz says so."""
    engine = jax_backend.JaxEngine(
        random_model_workdir(str(tmp_path / "bi"), **TWO_LAYERS), settings.Decoding(beam_width=0)
    )
    samples = audio_lib.read(FLACS[1], 16_000)
    wav = str(tmp_path / "sent.wav")
    soundfile.write(wav, samples, 16_000, subtype="PCM_16")
    with serving(engine) as url:
        partials, final = _stream(url, samples, chunk=4_000)
        upload = httpx.post(f"{url}/v1/transcribe?words=true", content=open(wav, "rb").read(), timeout=60).json()
        model = httpx.get(f"{url}/healthz").json()["model"]
    assert upload["text"]  # noise from a random model, but some
    assert final["text"] == upload["text"] and final["words"] == upload["words"]
    ends = range(4_000, len(samples) + 4_000, 4_000)  # the partials' decodes: one window a pass
    prefixes = {
        engine_lib.greedy_text(o, engine.alphabet) for o in engine.frame_outputs([samples[:n] for n in ends], 1)
    }
    assert {p["text"] for p in partials} - {""} <= prefixes and partials[-1]["text"], partials
    assert (model["bidirectional"], model["streaming"], model["partials"]) == (True, False, "redecoded")


def test_streams_and_connections_past_their_limits_get_a_503(uni):
    """max_streams open sockets, then one more: a 503 before it opens; max_connections requests in
    flight (one held open by a body that never ends), then one more: a 503 JSON error."""
    _, engine = uni
    with serving(engine, max_streams=1, max_connections=1) as url:
        ws = url.replace("http", "ws") + "/v1/stream?rate=16000"
        with connect(ws, open_timeout=10) as first:
            assert json.loads(first.recv(timeout=10))["type"] == "ready"
            with pytest.raises(InvalidStatus) as refused:
                connect(ws, open_timeout=10)
            assert refused.value.response.status_code == 503
            assert json.loads(refused.value.response.body)["error"]["code"] == "busy"
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as held:  # a request whose body is still coming
            held.sendall(b"POST /v1/transcribe HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"\0" * 100)
            time.sleep(0.3)
            busy = httpx.get(f"{url}/healthz", timeout=10)
            assert busy.status_code == 503 and busy.json()["error"]["code"] == "busy"
        time.sleep(0.3)
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200


@pytest.fixture(scope="module")
def uni_onnx(uni, tmp_path_factory):
    """The `uni` checkpoint exported (ds2_jax.export), as the ONNX engine ds2-serve --model runs."""
    pytest.importorskip("jax2onnx")
    from ds2_jax import export
    from ds2_jax.infer import onnx_backend

    out = str(tmp_path_factory.mktemp("serve_onnx") / "uni.onnx")
    assert export.main(["--workdir", uni[0], "--out", out]) == 0
    return onnx_backend.OnnxEngine(out, settings.Decoding(beam_width=0))


@pytest.mark.parametrize("backend", ["jax", "onnx"])
def test_uploads_that_arrive_together_run_as_one_batch(backend, uni, request, monkeypatch):
    """With max_batch=8 and a 300 ms window, 8 uploads at once share forward passes of the model
    (counted at the backend: at most 4, and the batch-size histogram's count too) and each gets
    its own file's text; with max_batch=1, 8 passes. Both backends: an exported model batches too."""
    engine = uni[1] if backend == "jax" else request.getfixturevalue("uni_onnx")
    bodies = [open(p, "rb").read() for p in FLACS] * 2
    want = [engine.transcribe([audio_lib.read(p, 16_000)])[0] for p in FLACS] * 2
    passes = []
    forward = engine._forward
    monkeypatch.setattr(engine, "_forward", lambda audio, lengths: passes.append(len(audio)) or forward(audio, lengths))
    for max_batch, window, most in ((8, 300.0, 4), (1, 0.0, 8)):
        passes.clear()
        with serving(engine, max_batch=max_batch, batch_window_ms=window, max_connections=16) as url:
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                got = list(pool.map(lambda b: httpx.post(f"{url}/v1/transcribe", content=b, timeout=120), bodies))
            assert [g.json()["text"] for g in got] == want
            batches = float(
                next(
                    line.split()[-1]
                    for line in httpx.get(f"{url}/metrics").text.splitlines()
                    if line.startswith("ds2_batch_size_count")
                )
            )
        if max_batch > 1:
            assert batches <= most and len(passes) <= most, (batches, passes)
        else:
            assert batches == len(passes) == 8, (batches, passes)


@pytest.mark.parametrize(
    "flags, says",
    [
        ([], "give one of --model"),
        (["--model=m.onnx", "--workdir=w"], "give one of --model"),
        (["--model=m.onnx", "--step=3"], "--step reads a workdir"),
        (["--model=m.onnx", "--max_streams=0"], "--max_streams=0: must be"),
        (["--model=m.onnx", "--idle_timeout_s=nan"], "--idle_timeout_s=nan: must be"),
        (["--model=m.onnx", "--port=70000"], "--port=70000: must be"),
    ],
)
def test_serve_flags_are_checked_before_the_model_loads(flags, says, capsys):
    with pytest.raises(SystemExit) as exited:
        server.main(flags)
    assert exited.value.code == 2 and says in capsys.readouterr().err


def test_the_command_binds_loopback_by_default_and_every_limit_is_a_flag():
    import subprocess
    import sys

    from tests.helpers import ROOT, repo_env

    proc = subprocess.run(
        [sys.executable, "-m", "ds2_jax.serve", "--helpfull"], cwd=ROOT, env=repo_env(), capture_output=True, text=True
    )
    assert "127.0.0.1" in proc.stdout
    assert all(f"--{name}" in proc.stdout for name in limits.HELP)
    assert set(limits.HELP) == set(limits.RANGES) == {f.name for f in __import__("dataclasses").fields(limits.Limits)}
    with pytest.raises(ValueError, match="beam_width=0"):
        app.make_app(type("Beam", (), {"beam": object()})())
