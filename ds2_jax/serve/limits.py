"""The server's settings: every size, count and time it bounds (ds2-serve's flags set them)."""

from __future__ import annotations

import dataclasses

from ds2_jax import settings


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one ds2-serve process accepts; RANGES says what each may be."""

    max_upload_bytes: int = 32 * 2**20  # POST /v1/transcribe bodies above this get a 413
    max_connections: int = 64  # HTTP requests in flight at once; more get a 503
    max_streams: int = 32  # open /v1/stream sockets; more are refused with a 503
    idle_timeout_s: float = 10.0  # a stream with no message for this long is closed (a stalled client)
    max_stream_seconds: float = 600.0  # audio per stream; past it the stream is finished with an error
    max_message_bytes: int = 2**20  # one WebSocket message (uvicorn's ws_max_size)
    max_batch: int = 8  # uploads run together in one forward pass
    batch_window_ms: float = 5.0  # how long the first upload of a batch waits for others to join it
    workers: int = 2  # threads running the model at once (streams and upload batches)


RANGES = {
    "max_upload_bytes": settings.Range(1024, 2**31),
    "max_connections": settings.Range(1, 4096),
    "max_streams": settings.Range(1, 1024),
    "idle_timeout_s": settings.Range(0.1, 3600.0),
    "max_stream_seconds": settings.Range(1.0, 86_400.0),
    "max_message_bytes": settings.Range(1024, 2**26),
    "max_batch": settings.Range(1, 256),
    "batch_window_ms": settings.Range(0.0, 1000.0, why="0 = run each upload as it comes"),
    "workers": settings.Range(1, 64),
}

HELP = {
    "max_upload_bytes": "Largest POST /v1/transcribe body; a larger upload gets a 413 JSON error.",
    "max_connections": "HTTP requests in flight at once; more get a 503 JSON error.",
    "max_streams": "Open /v1/stream WebSockets at once; more are refused with a 503.",
    "idle_timeout_s": "Seconds a stream may go without a message before it is closed (error 'idle').",
    "max_stream_seconds": "Seconds of audio one stream may send; past it: error 'too_long', closed.",
    "max_message_bytes": "Largest WebSocket message (bytes of PCM per message).",
    "max_batch": "Uploads run together in one forward pass.",
    "batch_window_ms": "Milliseconds the first upload of a batch waits for others (0: none).",
    "workers": "Threads running the model at once (stream chunks and upload batches).",
}


def checked(**values) -> Limits:
    """Limits of `values`; a ValueError naming the first out of its range."""
    for name, value in values.items():
        if not RANGES[name].holds(value):
            raise ValueError(f"--{name}={value}: must be {RANGES[name].text()}")
    return Limits(**values)
