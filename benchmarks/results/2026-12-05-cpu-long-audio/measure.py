"""Transcription of long files in windows against the same files whole, on the demo model.

    python benchmarks/results/2026-12-05-cpu-long-audio/measure.py WORKDIR [FILES_PER_LONG=20]

The held-out test-clean utterances of the bundled corpus (data/tiny_librispeech), joined in
their listed order with SILENCE_S (default 0.4) s of silence into long files of FILES_PER_LONG utterances; each long
file's reference is their transcripts joined. Prints the WER and CER (jiwer) of: each utterance
on its own; every long file whole (engine.WINDOW_SECONDS raised past its length); and in
windows (the default: WINDOW_SECONDS, CONTEXT_SECONDS), as `python -m ds2_jax.transcribe` runs it.
"""

import glob
import os
import sys

import jiwer
import numpy as np

from ds2_jax import audio
from ds2_jax.infer import engine, jax_backend

SILENCE_S = float(os.environ.get("SILENCE_S", "0.4"))  # between the joined utterances


def utterances(root: str) -> list[tuple[np.ndarray, str]]:
    """(int16 waveform, lower-case transcript) of every test-clean utterance, in listed order."""
    out = []
    for trans in sorted(glob.glob(os.path.join(root, "test-clean", "*", "*", "*.trans.txt"))):
        for line in open(trans):
            uid, text = line.strip().split(" ", 1)
            out.append((audio.read(os.path.join(os.path.dirname(trans), uid + ".flac"), 16_000), text.lower()))
    return out


def joined(items: list[tuple[np.ndarray, str]], per_file: int, rate: int) -> list[tuple[np.ndarray, str]]:
    gap = np.zeros(int(SILENCE_S * rate), np.int16)
    groups = [items[i : i + per_file] for i in range(0, len(items), per_file)]
    return [(np.concatenate([x for wav, _ in g for x in (wav, gap)]), " ".join(t for _, t in g)) for g in groups]


def scores(model: jax_backend.JaxEngine, items: list[tuple[np.ndarray, str]]) -> str:
    hyps = model.transcribe([wav for wav, _ in items])
    refs = [ref for _, ref in items]
    return f"WER {100 * jiwer.wer(refs, hyps):.1f}%  CER {100 * jiwer.cer(refs, hyps):.1f}%"


def main() -> None:
    workdir, per_file = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20
    model = jax_backend.JaxEngine(workdir)
    short = utterances(os.path.join("data", "tiny_librispeech", "LibriSpeech"))
    long = joined(short, per_file, model.sample_rate)
    seconds = [len(wav) / model.sample_rate for wav, _ in long]
    windows = [len(model.windows(len(wav))) for wav, _ in long]
    print(
        f"{len(short)} utterances; {len(long)} long files of {', '.join(f'{s:.1f}' for s in seconds)} s "
        f"({', '.join(map(str, windows))} windows of {engine.WINDOW_SECONDS:g} s, "
        f"{engine.CONTEXT_SECONDS:g} s context each side)"
    )
    print(f"each utterance alone:   {scores(model, short)}")
    print(f"long files in windows:  {scores(model, long)}")
    engine.WINDOW_SECONDS = 10 * max(seconds)
    assert all(len(model.windows(len(wav))) == 1 for wav, _ in long)
    print(f"long files whole:       {scores(model, long)}")


if __name__ == "__main__":
    main()
