"""Where the server's upload time goes, against `transcribe --model`'s work on the same 32 files: the
decode (ds2_jax.audio.read), every forward pass (its shape and time) and every batch the server ran,
timed by wrapping them; then the same 32 uploads through the server. Run 3 of NOTES.md.

    python benchmarks/results/2026-12-06-cpu-serve/profile_uploads.py bi.onnx > profile-run3.json
"""

import asyncio
import glob
import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())

from benchmarks import serve_load  # noqa: E402
from ds2_jax import audio, settings  # noqa: E402
from ds2_jax.infer import load  # noqa: E402

files = sorted(glob.glob("corpora/tiny_librispeech/LibriSpeech/test-clean/**/*.flac", recursive=True))[:32]
bodies = [open(f, "rb").read() for f in files]
engine = load.open_engine(model=sys.argv[1], decoder=settings.Decoding(beam_width=0), batch_size=8)
seen = {"read": [], "forward": [], "batches": []}


def timed(name, fn, shape):
    def wrapped(*args):
        start = time.perf_counter()
        out = fn(*args)
        seen[name].append((time.perf_counter() - start, shape(*args)))
        return out

    return wrapped


audio.read = timed("read", audio.read, lambda *a: None)
engine._forward = timed("forward", engine._forward, lambda a, n: list(a.shape))
engine.frame_outputs = timed("batches", engine.frame_outputs, lambda w: len(w))


def summary(prefix):
    out = {f"{prefix}_{k}_s": round(sum(t for t, _ in v), 3) for k, v in seen.items()}
    out[f"{prefix}_forward_shapes"] = [s for _, s in seen["forward"]]
    out[f"{prefix}_batch_sizes"] = [s for _, s in seen["batches"]]
    for v in seen.values():
        v.clear()
    return out


serve_load._command_work(engine, bodies)  # warm
summary("warm")
results = []
for _ in range(3):
    serve_load._command_work(engine, bodies)
    results.append(summary("command"))
server = serve_load.Server(engine, max_batch=8, batch_window_ms=10.0, max_connections=256)
asyncio.run(serve_load._uploads(server.url, bodies[:8]))  # warm
summary("warm")
for r in results:
    wall, _ = asyncio.run(serve_load._uploads(server.url, bodies))
    r.update(summary("server"), server_wall_s=round(wall, 3))
server.stop()
print(json.dumps(results, indent=1))
