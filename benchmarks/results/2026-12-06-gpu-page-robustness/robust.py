"""How stable is a trained model's greedy text under what Chromium's fake microphone does to a file:
resampling 16k->48k->16k and 148-628 samples of the lead-in dropped. usage: python robust.py WORKDIR..."""

import glob
import json
import sys

import numpy as np
import soxr

from ds2_jax import audio, metrics, settings
from ds2_jax.infer import jax_backend

files = sorted(glob.glob("corpora/tiny_librispeech/LibriSpeech/test-clean/*/*/*.flac"))


def variants(speech):
    pad = np.concatenate([np.zeros(16000, np.int16), speech, np.zeros(24000, np.int16)])
    f = pad.astype(np.float32) / 32768
    out = {"file": pad, "again": pad.copy(), "tail": np.concatenate([pad, np.zeros(1600, np.int16)])}
    for k in (148, 320, 470, 628):
        out[f"drop{k}"] = pad[k:]
    for q in ("HQ", "LQ"):
        chain = soxr.resample(soxr.resample(f, 16000, 48000, quality=q), 48000, 16000, quality=q)
        r = np.clip(np.round(chain * 32768), -32768, 32767).astype(np.int16)
        out[f"rs{q}"] = r
        for k in (148, 628):
            out[f"rs{q}_drop{k}"] = r[k:]
    return out


for w in sys.argv[1:]:
    eng = jax_backend.JaxEngine(w, settings.Decoding(beam_width=0))
    one = [eng.transcribe([audio.read(f, 16000)])[0] for f in files[:3]]
    print("alone:", one, flush=True)
    stable, cers, changed = 0, [], {}
    refs = []
    for path in files:
        v = variants(audio.read(path, 16000))
        texts = dict(zip(v, eng.transcribe(list(v.values()))))
        base = texts["file"]
        refs.append(base)
        if len(refs) <= 3:
            print(json.dumps(texts, indent=0), flush=True)
        same = all(t == base for t in texts.values())
        stable += same
        for k, t in texts.items():
            if t != base:
                changed[k] = changed.get(k, 0) + 1
            if k != "file":
                cers.append(metrics.error_rates([base], [t])["cer"])
    print(
        json.dumps(
            {
                "workdir": w,
                "files": len(files),
                "stable": stable,
                "mean_cer_vs_file": float(np.mean(cers)),
                "max_cer": float(np.max(cers)),
                "changed_by_variant": changed,
            }
        ),
        flush=True,
    )
