"""Real-time factor (seconds of compute per second of audio) of transcription's two paths on this
machine's CPU: the JAX engine of a workdir and the onnxruntime engine of its export (ds2_jax.infer).

    python -m benchmarks.export_rtf --workdir=W --model=model.onnx --threads=1 FILES...

--threads=1 pins both to one thread (XLA's CPU client through XLA_FLAGS, set here before jax is
imported; onnxruntime's intra-op threads); 0 lets both use every core. Prints one JSON line: the
median over --repeats passes of each path (a warm-up pass first: the JAX path compiles in it).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    from absl import flags

    fv = flags.FlagValues()
    flags.DEFINE_string("workdir", None, "Training workdir.", required=True, flag_values=fv)
    flags.DEFINE_string("model", None, "Its export (ds2_jax.export).", required=True, flag_values=fv)
    flags.DEFINE_integer("threads", 0, "1: one thread for both paths; 0: all cores.", flag_values=fv)
    flags.DEFINE_integer("repeats", 5, "Timed passes per path.", flag_values=fv)
    files = fv([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])[1:]
    if fv.threads == 1:  # before jax is imported
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        ).strip()
    from ds2_jax import audio as audio_lib
    from ds2_jax import settings
    from ds2_jax.infer import jax_backend, onnx_backend

    waves = [audio_lib.read(f, 16_000) for f in files]
    audio_seconds = sum(map(len, waves)) / 16_000
    greedy = settings.Decoding(beam_width=0)
    paths = {
        "jax": jax_backend.JaxEngine(fv.workdir, greedy, batch_size=8),
        "onnx": onnx_backend.OnnxEngine(fv.model, greedy, batch_size=8, threads=fv.threads),
    }
    result = {
        "threads": fv.threads or os.cpu_count(),
        "files": len(files),
        "audio_seconds": round(audio_seconds, 2),
        "load_average": os.getloadavg()[0],
    }
    texts = {}
    for name, t in paths.items():
        texts[name] = t.transcribe(waves)  # warm-up (compiles the JAX path)
        times = []
        for _ in range(fv.repeats):
            start = time.perf_counter()
            t.transcribe(waves)
            times.append(time.perf_counter() - start)
        result[f"{name}_rtf"] = round(statistics.median(times) / audio_seconds, 4)
    result["same_texts"] = texts["jax"] == texts["onnx"]
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
