"""Load and bad input against ds2-serve on loopback, bounded: concurrent uploads against the engine
run offline on the same files, concurrent real-time streams (partial latency, finals against the
offline text), then every kind of bad input; the server's RSS sampled across the whole run.

    python -m benchmarks.serve_load --model=model.onnx --stream_model=uni.onnx \\
        --out=benchmarks/results/<date>-cpu-serve

--model serves the uploads (any export); --stream_model (or --stream_workdir) a unidirectional model
for the streams. The server runs in this process (uvicorn in a thread, a free 127.0.0.1 port), the
clients in asyncio; writes --results (results.json) into --out.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
from absl import app, flags

flags.DEFINE_string("model", None, "Exported model serving the uploads.", required=True)
flags.DEFINE_string("stream_model", None, "Exported unidirectional model serving the streams.")
flags.DEFINE_string("stream_workdir", None, "Or: a unidirectional workdir serving the streams (jax).")
flags.DEFINE_string("corpus", "corpora/tiny_librispeech/LibriSpeech/test-clean", "FLAC files to use.")
flags.DEFINE_integer("uploads", 32, "Concurrent uploads.")
flags.DEFINE_integer("streams", 16, "Concurrent real-time streams.")
flags.DEFINE_integer("chunk_ms", 100, "Stream chunk length (sent in real time).")
flags.DEFINE_integer("max_batch", 8, "The server's --max_batch.")
flags.DEFINE_float("batch_window_ms", 10.0, "The server's --batch_window_ms.")
flags.DEFINE_enum("http", "httptools", ["httptools", "h11"], "uvicorn's HTTP parser (ds2-serve: httptools).")
flags.DEFINE_integer("rounds", 7, "Upload rounds (each: the command's work, the engine, the server).")
flags.DEFINE_string("out", None, "Folder for the results.", required=True)
flags.DEFINE_string("results", "results.json", "The results' file name in --out.")
FLAGS = flags.FLAGS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """make_app(engine, limits) under uvicorn in a thread, on a free loopback port."""

    def __init__(self, engine, http: str = "httptools", **limits):
        import uvicorn

        from ds2_jax.serve import app as app_lib
        from ds2_jax.serve import limits as limits_lib
        from ds2_jax.serve import server as server_lib

        self.port = _free_port()
        checked = limits_lib.checked(**limits)
        config = server_lib.uvicorn_config(  # ds2-serve's own settings
            app_lib.make_app(engine, checked), checked, port=self.port, log_level="error", http=http
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


class Rss:
    """This process's resident memory, sampled every 0.25 s in a thread."""

    def __init__(self):
        import psutil

        self.proc, self.samples, self.running = psutil.Process(), [], True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while self.running:
            self.samples.append(self.proc.memory_info().rss / 2**20)
            time.sleep(0.25)

    def mark(self) -> float:
        return self.proc.memory_info().rss / 2**20

    def stop(self) -> dict:
        self.running = False
        self.thread.join()
        return {"min_mib": round(min(self.samples), 1), "max_mib": round(max(self.samples), 1)}


def _pct(values, q):
    return round(float(np.percentile(values, q)) * 1000, 1) if values else None


async def _uploads(url: str, bodies: list[bytes]) -> tuple[float, list[dict]]:
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        got = await asyncio.gather(*(client.post(f"{url}/v1/transcribe", content=b) for b in bodies))
        return time.perf_counter() - start, [g.json() for g in got]


async def _stream(url: str, samples: np.ndarray, chunk: int, rate: int) -> dict:
    """One real-time stream: a chunk every chunk/rate seconds; per chunk, the time to its partial."""
    import websockets

    latencies, start = [], time.perf_counter()
    async with websockets.connect(url.replace("http", "ws") + f"/v1/stream?rate={rate}", max_size=2**22) as ws:
        assert json.loads(await ws.recv())["type"] == "ready"
        t0 = time.perf_counter()
        for i, first in enumerate(range(0, len(samples), chunk)):
            await asyncio.sleep(max(t0 + i * chunk / rate - time.perf_counter(), 0))  # real time
            sent = time.perf_counter()
            await ws.send(samples[first : first + chunk].astype("<i2").tobytes())
            message = json.loads(await ws.recv())
            assert message["type"] == "partial", message
            latencies.append(time.perf_counter() - sent)
        await ws.send(json.dumps({"type": "end"}))
        final = json.loads(await ws.recv())
    return {"latencies": latencies, "final": final.get("text"), "seconds": time.perf_counter() - start}


async def _streams(url: str, waves: list[np.ndarray], chunk: int, rate: int) -> list[dict]:
    return await asyncio.gather(*(_stream(url, w, chunk, rate) for w in waves))


async def _bad_inputs(url: str, good: bytes, limit: int) -> dict:
    """Each kind of bad upload once: what came back."""
    import httpx

    out = {}
    async with httpx.AsyncClient(timeout=60) as client:
        for name, body in {
            "garbage_bytes": os.urandom(20_000),
            "empty": b"",
            "truncated_wav": _wav_bytes(good)[:30_000],
            "oversize": b"\0" * (limit + 1),
        }.items():
            r = await client.post(f"{url}/v1/transcribe", content=body)
            out[name] = {"status": r.status_code, "code": r.json().get("error", {}).get("code")}
    return out


async def _bad_streams(url: str) -> dict:
    """Each kind of bad stream once: what came back."""
    import websockets

    out = {}
    ws = url.replace("http", "ws") + "/v1/stream"
    for name, query in {"missing_rate": "", "wrong_rate": "?rate=3"}.items():
        try:
            async with websockets.connect(ws + query):
                out[name] = "opened"
        except websockets.exceptions.InvalidStatus as e:
            out[name] = {"status": e.response.status_code, "code": json.loads(e.response.body)["error"]["code"]}
    async with websockets.connect(ws + "?rate=16000") as c:  # stalls: sends nothing after one chunk
        await c.recv()
        await c.send(np.zeros(1600, np.int16).tobytes())
        await c.recv()
        start = time.perf_counter()
        message = json.loads(await c.recv())
        out["stalled_client"] = {"code": message.get("code"), "closed_after_s": round(time.perf_counter() - start, 2)}
    c = await websockets.connect(ws + "?rate=16000")  # vanishes mid-stream
    await c.recv()
    await c.send(np.zeros(1600, np.int16).tobytes())
    c.transport.abort()
    out["vanished_client"] = "aborted"
    return out


def _wav_bytes(flac: bytes) -> bytes:
    import io

    import soundfile

    from ds2_jax import audio

    buf = io.BytesIO()
    soundfile.write(buf, audio.read(flac, 16_000), 16_000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


async def _past_limits(url: str, max_streams: int) -> dict:
    import websockets

    ws = url.replace("http", "ws") + "/v1/stream?rate=16000"
    held = [await websockets.connect(ws) for _ in range(max_streams)]
    try:
        async with websockets.connect(ws):
            refused = "opened"
    except websockets.exceptions.InvalidStatus as e:
        refused = {"status": e.response.status_code, "code": json.loads(e.response.body)["error"]["code"]}
    for h in held:
        await h.close()
    return {"stream_past_max_streams": refused}


def _command_work(engine, bodies: list[bytes]) -> tuple[float, list[str]]:
    """(seconds, texts) of what `transcribe --model` does once its model is loaded: each batch of 8
    files decoded (ds2_jax.audio), then run."""
    from ds2_jax import audio

    start = time.perf_counter()
    texts = []
    for i in range(0, len(bodies), 8):
        texts += engine.transcribe([audio.read(b, engine.sample_rate) for b in bodies[i : i + 8]])
    return time.perf_counter() - start, texts


def main(argv):
    del argv
    from ds2_jax import audio, settings
    from ds2_jax.infer import load

    files = sorted(glob.glob(os.path.join(FLAGS.corpus, "**", "*.flac"), recursive=True))
    files = (files * (FLAGS.uploads // len(files) + 1))[: FLAGS.uploads]
    bodies = [open(f, "rb").read() for f in files]
    rss = Rss()
    result = {"machine": f"{os.cpu_count()} cores, shared with other agents' jobs", "rss_start_mib": rss.mark()}
    greedy = settings.Decoding(beam_width=0)

    # offline: the engine on the same files: the work of `transcribe --model` once its model is
    # loaded (decode each file, batches of 8), the engine alone on decoded audio, and the command
    engine = load.open_engine(model=FLAGS.model, decoder=greedy, batch_size=FLAGS.max_batch)
    waves = [audio.read(f, engine.sample_rate) for f in files]
    engine.transcribe(waves[:8])  # warm
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "ds2_jax.transcribe", f"--model={FLAGS.model}", *files], capture_output=True, text=True
    )
    command_s = time.perf_counter() - start
    cli = [line.split("\t", 1)[1] for line in proc.stdout.splitlines()]

    limit = 4 * 2**20
    server = Server(
        engine,
        http=FLAGS.http,
        max_batch=FLAGS.max_batch,
        batch_window_ms=FLAGS.batch_window_ms,
        max_connections=256,
        max_upload_bytes=limit,
    )
    asyncio.run(_uploads(server.url, bodies[:8]))  # warm
    # Rounds in turn (the command's work, the engine alone, the server), so that the other jobs on
    # the shared cores weigh on all three alike; medians and each round's ratio.
    # CPU seconds of this process too (all its threads), which the other jobs on the cores sway less
    # than walls; the server's rounds include the client's (asyncio, httpx: this thread's CPU).
    rounds = {k: [] for k in ("command_work_s", "engine_offline_s", "server_wall_s")}
    cpu = {k: [] for k in ("command_work_cpu_s", "server_cpu_s", "client_cpu_s")}
    for _ in range(FLAGS.rounds):
        started = time.process_time()
        work_s, offline = _command_work(engine, bodies)
        cpu["command_work_cpu_s"].append(time.process_time() - started)
        rounds["command_work_s"].append(work_s)
        start = time.perf_counter()
        alone = [t for i in range(0, len(waves), 8) for t in engine.transcribe(waves[i : i + 8])]
        rounds["engine_offline_s"].append(time.perf_counter() - start)
        started, client = time.process_time(), time.thread_time()
        upload_s, answers = asyncio.run(_uploads(server.url, bodies))
        cpu["client_cpu_s"].append(time.thread_time() - client)
        cpu["server_cpu_s"].append(time.process_time() - started - cpu["client_cpu_s"][-1])
        rounds["server_wall_s"].append(upload_s)
        assert alone == offline
    audio_s = sum(len(w) for w in waves) / engine.sample_rate
    median = {k: statistics.median(v) for k, v in rounds.items()}
    result["uploads"] = {
        "concurrent": len(bodies),
        "max_batch": FLAGS.max_batch,
        "batch_window_ms": FLAGS.batch_window_ms,
        "audio_s": round(audio_s, 1),
        "rounds": {k: [round(x, 3) for x in v] for k, v in rounds.items()},
        **{k: round(v, 3) for k, v in median.items()},
        "transcribe_command_s": round(command_s, 3),
        "server_overhead_vs_command_work": round(median["server_wall_s"] / median["command_work_s"] - 1, 3),
        "server_overhead_vs_command_work_per_round": [
            round(s / w - 1, 3) for s, w in zip(rounds["server_wall_s"], rounds["command_work_s"])
        ],
        "cpu_s_median": {k: round(statistics.median(v), 3) for k, v in cpu.items()},
        "server_cpu_overhead_vs_command_work": round(
            statistics.median(cpu["server_cpu_s"]) / statistics.median(cpu["command_work_cpu_s"]) - 1, 3
        ),
        "http": FLAGS.http,
        "server_overhead_vs_engine": round(median["server_wall_s"] / median["engine_offline_s"] - 1, 3),
        "server_overhead_vs_command": round(median["server_wall_s"] / command_s - 1, 3),
        "texts_equal_offline": [a.get("text") for a in answers] == offline,
        "texts_equal_command": [a.get("text") for a in answers] == cli,
        "errors": sum("error" in a for a in answers),
    }
    print(json.dumps(result["uploads"]), flush=True)
    marks = {"after_uploads": rss.mark()}
    # the same uploads one forward pass each (max_batch=1): whether batching measures faster here
    single = load.open_engine(model=FLAGS.model, decoder=greedy, batch_size=1)
    alone = Server(
        single, http=FLAGS.http, max_batch=1, batch_window_ms=0.0, max_connections=256, max_upload_bytes=limit
    )
    asyncio.run(_uploads(alone.url, bodies[:8]))  # warm
    result["uploads"]["server_wall_s_unbatched"] = round(asyncio.run(_uploads(alone.url, bodies))[0], 3)
    alone.stop()
    upload_s2, _ = asyncio.run(_uploads(server.url, bodies))  # again: memory must not grow per round
    marks["after_second_uploads"] = rss.mark()
    result["uploads"]["server_wall_s_second_round"] = round(upload_s2, 3)
    result["bad_input"] = asyncio.run(_bad_inputs(server.url, bodies[0], limit))
    marks["after_bad_input"] = rss.mark()
    result["healthz_after_bad_input"] = __import__("httpx").get(f"{server.url}/healthz").json()["status"]
    server.stop()

    if FLAGS.stream_model or FLAGS.stream_workdir:
        streamer = load.open_engine(model=FLAGS.stream_model, workdir=FLAGS.stream_workdir, decoder=greedy)
        uni = [audio.read(f, streamer.sample_rate) for f in files[: FLAGS.streams]]
        want = streamer.transcribe(uni)
        server = Server(streamer, max_streams=FLAGS.streams, idle_timeout_s=5.0)
        chunk = FLAGS.chunk_ms * streamer.sample_rate // 1000
        asyncio.run(_streams(server.url, uni[:1], chunk, streamer.sample_rate))  # warm
        got = asyncio.run(_streams(server.url, uni, chunk, streamer.sample_rate))
        marks["after_streams"] = rss.mark()
        again = asyncio.run(_streams(server.url, uni, chunk, streamer.sample_rate))  # shapes compiled now
        marks["after_second_streams"] = rss.mark()
        lat2 = [x for g in again for x in g["latencies"]]
        lat = [x for g in got for x in g["latencies"]]
        result["streams"] = {
            "concurrent": len(uni),
            "chunk_ms": FLAGS.chunk_ms,
            "backend": type(streamer).__name__,
            "lookahead_s": round(streamer.lookahead_seconds, 3),
            "partial_latency_ms": {"p50": _pct(lat, 50), "p95": _pct(lat, 95), "max": _pct(lat, 100)},
            "realtime_factor_worst": round(
                max(g["seconds"] / (len(w) / streamer.sample_rate) for g, w in zip(got, uni)), 3
            ),
            "finals_equal_offline": [g["final"] for g in got] == want,
            "second_round": {
                "partial_latency_ms": {"p50": _pct(lat2, 50), "p95": _pct(lat2, 95), "max": _pct(lat2, 100)},
                "realtime_factor_worst": round(
                    max(g["seconds"] / (len(w) / streamer.sample_rate) for g, w in zip(again, uni)), 3
                ),
                "finals_equal_offline": [g["final"] for g in again] == want,
            },
            "mean_audio_s": round(statistics.mean(len(w) / streamer.sample_rate for w in uni), 2),
        }
        print(json.dumps(result["streams"]), flush=True)
        result["past_limits"] = asyncio.run(_past_limits(server.url, FLAGS.streams))
        result["bad_streams"] = asyncio.run(_bad_streams(server.url))
        result["healthz_after_bad_streams"] = __import__("httpx").get(f"{server.url}/healthz").json()
        server.stop()
    result["rss"] = {**rss.stop(), "end_mib": round(rss.mark(), 1), **{k: round(v, 1) for k, v in marks.items()}}
    os.makedirs(FLAGS.out, exist_ok=True)
    with open(os.path.join(FLAGS.out, FLAGS.results), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    app.run(main)
