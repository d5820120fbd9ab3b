"""The speech server's ASGI app (Starlette): one inference engine behind HTTP and a WebSocket.

    GET  /                 the page (static/index.html): microphone -> /v1/stream, or a file upload
    POST /v1/transcribe    body: an audio file (any format and rate ds2_jax.audio reads);
                           ?words=true adds word times -> {"text", "duration_s", "words"?}
    WS   /v1/stream?rate=R binary messages of int16 little-endian mono PCM at R Hz, then the text
                           message {"type": "end"} -> {"type": "partial"} per message, one "final"
    GET  /healthz          {"status": "ok", "model": {...}}
    GET  /metrics          Prometheus text format
Errors are JSON, {"error": {"code", "message"}} over HTTP and {"type": "error", "code", "message"}
on the socket, and never stop the server. The schemas: docs/serving.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from importlib import resources

import anyio
import numpy as np
import prometheus_client as prom
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from ds2_jax import audio
from ds2_jax.infer import engine as engine_lib
from ds2_jax.serve.limits import Limits

log = logging.getLogger("ds2_jax")

MIN_RATE, MAX_RATE = 8_000, 48_000  # stream rates accepted (resampled to the model's with soxr)
STATIC = {"/": ("index.html", "text/html"), "/worklet.js": ("worklet.js", "text/javascript")}


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


class Metrics:
    """The server's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self):
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.requests = prom.Counter("ds2_requests", "Requests served", ["endpoint"], registry=r)
        self.errors = prom.Counter("ds2_errors", "Requests answered with an error", ["endpoint", "code"], registry=r)
        self.latency = prom.Histogram(
            "ds2_request_seconds",
            "Upload latency, and stream partial latency (message in -> partial out)",
            ["endpoint"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.active_streams = prom.Gauge("ds2_active_streams", "Open /v1/stream sockets", registry=r)
        self.audio_seconds = prom.Counter("ds2_audio_seconds", "Seconds of audio transcribed", ["endpoint"], registry=r)
        self.batch_size = prom.Histogram(
            "ds2_batch_size", "Uploads per forward pass", buckets=(1, 2, 4, 8, 16, 32, 64), registry=r
        )


class Batcher:
    """Uploads that arrive together run as one forward pass (engine.frame_outputs batches them by length)."""

    def __init__(self, engine: engine_lib.Engine, limits: Limits, limiter: anyio.CapacityLimiter, metrics: Metrics):
        self.engine, self.limits, self.limiter, self.metrics = engine, limits, limiter, metrics
        self.queue: asyncio.Queue = asyncio.Queue()

    async def ids(self, waveform: np.ndarray) -> np.ndarray:
        """The <int32>[T] greedy path of one waveform, run with the others waiting now."""
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((waveform, future))
        return await future

    async def run(self) -> None:
        """The batching loop (a task for the app's lifetime)."""
        while True:
            batch = [await self.queue.get()]
            deadline = time.monotonic() + self.limits.batch_window_ms / 1000
            while len(batch) < self.limits.max_batch:
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), max(deadline - time.monotonic(), 0)))
                except TimeoutError:
                    break
            self.metrics.batch_size.observe(len(batch))
            waves = [w for w, _ in batch]
            try:
                outputs = await anyio.to_thread.run_sync(self.engine.frame_outputs, waves, limiter=self.limiter)
            except Exception as e:  # noqa: BLE001  (each waiting request gets the error, the loop goes on)
                outputs = [e] * len(batch)
            for (_, future), out in zip(batch, outputs):
                if future.done():
                    continue  # its client has gone
                if isinstance(out, BaseException):
                    future.set_exception(out)
                else:
                    future.set_result(out)


class ConnectionLimit:
    """ASGI middleware: HTTP requests past `limit` in flight get a 503 JSON error at once."""

    def __init__(self, app, limit: int, metrics: Metrics):
        self.app, self.limit, self.metrics, self.active = app, limit, metrics, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.active >= self.limit:
            self.metrics.errors.labels(scope["path"][:32], "busy").inc()
            busy = error(503, "busy", f"{self.limit} requests in flight (--max_connections): try again shortly")
            return await busy(scope, receive, send)
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1


def _words(engine: engine_lib.Engine, ids: np.ndarray) -> list[dict]:
    return [{"word": w.word, "start": round(w.start, 3), "end": round(w.end, 3)} for w in engine.words(ids)]


def _flag(request_or_socket, name: str) -> bool:
    return request_or_socket.query_params.get(name, "").lower() in ("1", "true", "yes")


def make_app(engine: engine_lib.Engine, limits: Limits = Limits()):
    """The ASGI app serving `engine` (greedy decoding) within `limits`."""
    if engine.beam is not None:
        raise ValueError("the server decodes greedily (word times, streaming): build its engine with beam_width=0")
    metrics = Metrics()
    limiter = anyio.CapacityLimiter(limits.workers)
    state = {"streams": 0}
    pages = {
        route: (resources.files("ds2_jax.serve").joinpath("static", name).read_text(), kind)
        for route, (name, kind) in STATIC.items()
    }
    model_info = {
        "sample_rate": engine.sample_rate,
        "step": engine.step,
        "bidirectional": engine.bidirectional,
        "streaming": not engine.bidirectional,  # frame by frame (lookahead_s); else the stream is re-decoded
        "partials": "redecoded" if engine.bidirectional else "growing",
        "lookahead_s": round(engine.lookahead_seconds, 4),
        "frame_s": engine.frame_seconds,
        "emission_delay_s": engine.emission_delay,
        "backend": type(engine).__name__,
    }

    async def page(request: Request) -> Response:
        text, kind = pages[request.url.path]
        return HTMLResponse(text) if kind == "text/html" else Response(text, media_type=kind)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": model_info, "active_streams": state["streams"]})

    async def metrics_page(request: Request) -> Response:
        return Response(prom.generate_latest(metrics.registry), media_type=prom.CONTENT_TYPE_LATEST)

    async def transcribe(request: Request) -> Response:
        endpoint = "transcribe"
        metrics.requests.labels(endpoint).inc()
        started = time.perf_counter()

        def fail(status: int, code: str, message: str) -> Response:
            metrics.errors.labels(endpoint, code).inc()
            return error(status, code, message)

        too_big = f"the upload is over {limits.max_upload_bytes} bytes (--max_upload_bytes)"
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_upload_bytes:
            return fail(413, "too_large", too_big)
        body = bytearray()
        try:
            async for part in request.stream():
                body += part
                if len(body) > limits.max_upload_bytes:
                    return fail(413, "too_large", too_big)
        except Exception as e:  # noqa: BLE001  (the client went away mid-upload: starlette's ClientDisconnect)
            return fail(400, "truncated", f"the upload ended early ({type(e).__name__})")
        if not body:
            return fail(400, "empty_audio", "no audio: POST the bytes of an audio file as the request body")
        try:
            waveform = await anyio.to_thread.run_sync(audio.read, bytes(body), engine.sample_rate, "downmix", "upload")
        except audio.Unreadable as e:
            return fail(400, e.reason, f"the upload gives no audio: {e.detail}")
        if (short := engine.too_short(len(waveform))) is not None:
            return fail(400, "too_short", str(short))
        try:
            ids = await Batcher_of(request).ids(waveform)
        except Exception as e:  # noqa: BLE001  (the model failed on it: say so, stay up)
            log.exception("transcribe failed")
            return fail(500, "model_error", f"{type(e).__name__}: {str(e)[:200]}")
        seconds = len(waveform) / engine.sample_rate
        metrics.audio_seconds.labels(endpoint).inc(seconds)
        result = {"text": engine_lib.greedy_text(ids, engine.alphabet), "duration_s": round(seconds, 3)}
        if _flag(request, "words"):
            result["words"] = _words(engine, ids)
        metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
        return JSONResponse(result)

    def Batcher_of(request: Request) -> Batcher:  # noqa: N802
        return request.app.state.batcher

    async def stream(socket: WebSocket) -> None:
        endpoint = "stream"
        metrics.requests.labels(endpoint).inc()

        async def refuse(code: str, message: str, status: int = 400) -> None:
            """An error before the socket is open: an HTTP answer where the server can send one."""
            metrics.errors.labels(endpoint, code).inc()
            if "websocket.http.response" in socket.scope.get("extensions", {}):
                await socket.send_denial_response(error(status, code, message))
            else:
                await socket.accept()
                await socket.send_json({"type": "error", "code": code, "message": message})
                await socket.close(1013 if status == 503 else 1008)

        if state["streams"] >= limits.max_streams:
            return await refuse("busy", f"{limits.max_streams} streams open (--max_streams): try again shortly", 503)
        rate_text = socket.query_params.get("rate")
        if rate_text is None or not rate_text.isdigit() or not MIN_RATE <= int(rate_text) <= MAX_RATE:
            return await refuse(
                "bad_rate",
                f"declare the PCM's sample rate as ?rate=<{MIN_RATE}..{MAX_RATE}> (got {rate_text!r}); "
                "messages are int16 little-endian mono samples at that rate",
            )
        state["streams"] += 1
        metrics.active_streams.inc()
        try:
            await socket.accept()
            await _run_stream(socket, int(rate_text), _flag(socket, "words"))
        finally:
            state["streams"] -= 1
            metrics.active_streams.dec()

    async def _run_stream(socket: WebSocket, rate: int, words: bool) -> None:
        endpoint = "stream"

        async def close_with(code: str, message: str, close_code: int = 1008) -> None:
            metrics.errors.labels(endpoint, code).inc()
            with contextlib.suppress(Exception):  # the client may be gone already
                await socket.send_json({"type": "error", "code": code, "message": message})
                await socket.close(close_code)

        utterance = engine.stream()
        resampler = None
        if rate != engine.sample_rate:
            import soxr

            resampler = soxr.ResampleStream(rate, engine.sample_rate, 1, dtype="int16")
        await socket.send_json({"type": "ready", "sample_rate": rate, "model_sample_rate": engine.sample_rate})
        received = 0  # samples at the client's rate
        while True:
            try:
                message = await asyncio.wait_for(socket.receive(), limits.idle_timeout_s)
            except TimeoutError:
                return await close_with("idle", f"no audio for {limits.idle_timeout_s:g} s (--idle_timeout_s)")
            if message["type"] == "websocket.disconnect":
                return  # a client that vanished: nothing to answer
            started = time.perf_counter()
            if message.get("bytes") is not None:
                data = message["bytes"]
                if len(data) % 2:
                    return await close_with("bad_pcm", "a binary message must hold whole int16 samples (even bytes)")
                received += len(data) // 2
                if received / rate > limits.max_stream_seconds:
                    return await close_with(
                        "too_long", f"over {limits.max_stream_seconds:g} s of audio (--max_stream_seconds)"
                    )
                chunk = np.frombuffer(data, "<i2")
                if resampler is not None:
                    chunk = resampler.resample_chunk(chunk)
                text = await anyio.to_thread.run_sync(utterance.feed, chunk, limiter=limiter)
                await socket.send_json({"type": "partial", "text": text, "audio_s": round(received / rate, 4)})
                metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
                continue
            try:
                kind = json.loads(message.get("text") or "").get("type")
            except (ValueError, AttributeError):
                kind = None
            if kind != "end":
                return await close_with("bad_message", 'text messages are {"type": "end"}; audio goes as binary')
            if resampler is not None:
                tail = resampler.resample_chunk(np.zeros(0, np.int16), last=True)
                await anyio.to_thread.run_sync(utterance.feed, tail, limiter=limiter)
            if utterance.samples < engine.window:
                return await close_with("too_short", "the stream ended before one analysis window of audio")
            text = await anyio.to_thread.run_sync(utterance.finish, limiter=limiter)
            final = {"type": "final", "text": text, "audio_s": round(received / rate, 4)}
            if words:
                final["words"] = _words(engine, utterance.ids)
            metrics.audio_seconds.labels(endpoint).inc(received / rate)
            await socket.send_json(final)
            await socket.close(1000)
            return

    @contextlib.asynccontextmanager
    async def lifespan(app):
        app.state.batcher = Batcher(engine, limits, limiter, metrics)
        task = asyncio.create_task(app.state.batcher.run())
        try:
            yield
        finally:
            task.cancel()

    routes = [Route(path, page) for path in STATIC] + [
        Route("/healthz", healthz),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Route("/metrics", metrics_page),
        Route("/v1/transcribe", transcribe, methods=["POST"]),
        WebSocketRoute("/v1/stream", stream),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.metrics = metrics
    return ConnectionLimit(app, limits.max_connections, metrics)
