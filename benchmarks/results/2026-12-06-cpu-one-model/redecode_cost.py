"""The compute of a bidirectional model's stream (engine.RedecodedUtterance) on this CPU: the demo's
model size (configs/demo.py, random weights: the time does not depend on them) behind the JAX engine,
fed SECONDS of the bundled corpus's test-clean speech (repeated) in 100 ms chunks as /v1/stream feeds it.

    PYTHONPATH=. python benchmarks/results/2026-12-06-cpu-one-model/redecode_cost.py [SECONDS]

Prints one JSON line per decode (the audio it covered, its ms: a partial's latency) and a summary:
decodes, the audio they covered against the stream's, the stream's compute against one whole-file
pass over the same audio. A first pass compiles every length; the second is timed.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import tempfile
import time


def main(argv: list[str]) -> int:
    import jax
    import numpy as np

    from configs import demo
    from ds2_jax import audio as audio_lib
    from ds2_jax import checkpoint, settings, workdir_config
    from ds2_jax import state as state_lib
    from ds2_jax.infer import engine as engine_lib
    from ds2_jax.infer import jax_backend

    seconds = float(argv[0]) if argv else 60.0
    config = settings.from_config_dict(demo.get_config())
    bins = config.features.num_bins
    state = state_lib.create_state(config, jax.random.PRNGKey(0), np.zeros(bins, np.float32), np.ones(bins, np.float32))
    workdir = tempfile.mkdtemp()
    with checkpoint.managed(workdir) as mgr:
        checkpoint.save(mgr, 0, jax.device_get(state), wait=True)
    workdir_config.save_config(config, workdir)
    engine = jax_backend.JaxEngine(workdir, settings.Decoding(beam_width=0))
    files = sorted(glob.glob("corpora/tiny_librispeech/LibriSpeech/test-clean/*/*/*.flac"))
    speech = np.concatenate([audio_lib.read(f, 16_000) for f in files])  # 50.75 s, repeated to SECONDS
    audio = np.tile(speech, -(-int(seconds * 16_000) // len(speech)))[: int(seconds * 16_000)]
    decodes = []
    frame_outputs = engine.frame_outputs

    def timed(waveforms, batch_size=None):
        start = time.perf_counter()
        out = frame_outputs(waveforms, batch_size)
        decodes.append((len(waveforms[0]) / 16_000, 1000 * (time.perf_counter() - start), batch_size or "engine's"))
        return out

    for _ in range(2):  # the first pass compiles each padded length
        decodes.clear()
        engine.frame_outputs = timed
        utterance, start = engine.stream(), time.perf_counter()
        for i in range(0, len(audio), 1_600):
            utterance.feed(audio[i : i + 1_600])
        utterance.finish()
        stream_s = time.perf_counter() - start
        engine.frame_outputs = frame_outputs
    once = time.perf_counter()
    engine.transcribe([audio])
    once = time.perf_counter() - once
    for covered, ms, rows in decodes:
        print(json.dumps({"audio_s": round(covered, 2), "ms": round(ms, 1), "windows_per_pass": rows}))
    print(
        json.dumps(
            {
                "stream_s": round(len(audio) / 16_000, 2),
                "decodes": len(decodes),
                "audio_decoded_s": round(sum(d[0] for d in decodes), 1),
                "bound_s": round(10 * len(audio) / 16_000 + 36, 1),
                "stream_compute_s": round(stream_s, 2),
                "one_pass_s": round(once, 3),
                "stream_over_one_pass": round(stream_s / once, 1),
                "redecode": [engine_lib.REDECODE_SECONDS, engine_lib.REDECODE_SHARE],
                "cpus": os.cpu_count(),
                "load_average": round(os.getloadavg()[0], 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
