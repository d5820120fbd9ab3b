"""The page test's aligner (tests/test_page.py: _aligned, _pieces, _glitches) on simulated streams: the
test's WAV shifted by every lead-in a run can lose (0 to 1 s in 37.7-sample steps, to a tenth of a
sample), with noise 45 dB under its RMS; then with a drop of 160 samples, a repeat of 1,600, three drops
of 300 and a 0.8% stretch (each at 100 lead-ins). Prints how many streams the test's checks fail.

    PYTHONPATH=. python benchmarks/results/2026-12-06-cpu-one-model/page_alignment.py [MODULE]

MODULE (default tests.test_page): another copy of the test to compare, e.g. the one before this fix
(`git show 90bc80e:tests/test_page.py > tests/_old_page.py`, MODULE tests._old_page).
"""

import importlib
import pathlib
import sys
import tempfile

import numpy as np
import soundfile
import soxr


def passes(tp, x, sent) -> bool:
    offset, _ = tp._aligned(x, sent)
    pieces = tp._pieces(x, sent, offset)
    glitches = tp._glitches(pieces)
    spoiled = [p for p in pieces if p[2] < tp.MIN_SNR_DB]
    return (
        0 <= offset < 16_000
        and len(glitches) <= tp.MAX_GLITCHES
        and all(abs(g) <= tp.MAX_GLITCH_SAMPLES for g in glitches)
        and len(spoiled) <= min(len(glitches) + 1, tp.MAX_GLITCHES)
    )


def main(module: str) -> None:
    tp = importlib.import_module(module)
    sent = soundfile.read(tp._wav(pathlib.Path(tempfile.mkdtemp())), dtype="int16")[0]
    fine = soxr.resample(sent.astype(np.float64), 16_000, 160_000, quality="VHQ")
    rng = np.random.default_rng(0)
    alter = {
        "clean": lambda x: x,
        "drop 160": lambda x: np.concatenate([x[:30_000], x[30_160:]]),
        "repeat 1600": lambda x: np.concatenate([x[:30_000], x[28_400:]]),
        "three drops of 300": lambda x: np.concatenate([x[:21_000], x[21_300:27_000], x[27_300:33_000], x[33_300:]]),
        "stretch 0.8%": lambda x: soxr.resample(x, 16_000, 16_128),
    }
    for name, change in alter.items():
        lead_ins = range(0, 160_000, 377 if name == "clean" else 1_601)
        fails = 0
        for lost in lead_ins:
            x = change(fine[lost::10])
            x = x + rng.normal(0, 1, len(x)) * np.sqrt(np.mean(x**2)) * 10 ** (-45 / 20)
            fails += not passes(tp, np.round(x).astype(np.int16), sent)
        print(f"{name}: {fails} of {len(lead_ins)} fail the test's checks")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests.test_page")
