"""Does noise augmentation help on noisy speech? The demo model trained with and without
config.waveform noise, scored on the clean test split and on a noisy copy of it whose noise
training never saw (ds2_jax.tools.make_noisy).

    python -m benchmarks.noisy_speech --out=DIR [--manual_dir=corpora/tiny_librispeech] [--steps=400] [--seeds=0,1]

Generates two disjoint noise sets under DIR: training noise (colored noises: pink, brown and
band-passed white, seed 0) and evaluation noise of other kinds (mains hum with harmonics under
amplitude-modulated band noise, and chirps over pink noise, seed 1). Makes DIR/noisy (test-clean
mixed with the evaluation noise at 0-10 dB SNR), trains configs/demo.py --steps steps twice per
seed (--noise_prob of the utterances with training noise at --snr_db_min..max dB, and without), and
scores both models greedily on test-clean and on its noisy copy. Each run has its own workdir
(DIR/run-<setting>-seed<N>): a rerun with another noise setting reuses the clean runs, and a run
already trained is only scored. Writes DIR/noisy_speech-<setting>.json and .md (per seed and the
means). The goal (issue 39): a lower noisy CER with augmentation, the mean clean CER within 1 point.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import soundfile

RATE = 16_000


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_string(
        "out", None, "Results, noise, the noisy corpus and the two workdirs.", flag_values=fv, required=True
    )
    flags.DEFINE_string("manual_dir", "corpora/tiny_librispeech", "The corpus (LibriSpeech layout).", flag_values=fv)
    flags.DEFINE_integer("steps", 400, "Training steps of each model (the demo's).", flag_values=fv)
    flags.DEFINE_float(
        "noise_prob", 0.3, "Share of training utterances with noise (the recommended 0.3).", flag_values=fv
    )
    flags.DEFINE_float("snr_db_min", 0.0, "Training noise: lowest SNR.", flag_values=fv)
    flags.DEFINE_float("snr_db_max", 15.0, "Training noise: highest SNR.", flag_values=fv)
    flags.DEFINE_list("seeds", ["0", "1"], "The runs' seeds (each trains both models).", flag_values=fv)


def _norm(x: np.ndarray) -> np.ndarray:
    x = x - x.mean()
    return (0.3 * x / np.abs(x).max()).astype(np.float32)


def _colored(rng, n: int, exponent: float) -> np.ndarray:
    """Noise with power ~ 1 / f^exponent."""
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.maximum(np.arange(len(spec)), 1.0)
    return np.fft.irfft(spec / f ** (exponent / 2), n)


def training_noise(folder: str, seconds: float = 20.0) -> str:
    rng = np.random.default_rng(0)
    os.makedirs(folder, exist_ok=True)
    n = int(seconds * RATE)
    kinds = {"pink": _colored(rng, n, 1.0), "brown": _colored(rng, n, 2.0)}
    for lo, hi in ((300, 1200), (1000, 3000), (2500, 6000)):
        spec = np.fft.rfft(rng.standard_normal(n))
        f = np.fft.rfftfreq(n, 1 / RATE)
        kinds[f"band{lo}-{hi}"] = np.fft.irfft(spec * ((f >= lo) & (f <= hi)), n)
    for name, x in kinds.items():
        soundfile.write(os.path.join(folder, f"{name}.wav"), _norm(x), RATE)
    return folder


def evaluation_noise(folder: str, seconds: float = 20.0) -> str:
    rng = np.random.default_rng(1)
    os.makedirs(folder, exist_ok=True)
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    hum = sum(np.sin(2 * np.pi * 50 * k * t + rng.uniform(0, 6.3)) / k for k in range(1, 12))
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n, 1 / RATE)
    band = np.fft.irfft(spec * ((f >= 400) & (f <= 2500)), n) * (1 + np.sin(2 * np.pi * 3.0 * t))  # babble-like
    soundfile.write(os.path.join(folder, "hum_babble.wav"), _norm(_norm(hum) + 2 * _norm(band)), RATE)
    sweep = np.sin(2 * np.pi * (200 * t + 400 * (t % 2.0) ** 2))  # a chirp every 2 s
    soundfile.write(os.path.join(folder, "chirp_pink.wav"), _norm(_norm(sweep) + _norm(_colored(rng, n, 1.0))), RATE)
    return folder


def means(rows: list[dict]) -> dict:
    """{training: {score: mean over its seeds}} of the rows."""
    names = dict.fromkeys(r["training"] for r in rows)
    keys = ("clean_cer", "clean_wer", "noisy_cer", "noisy_wer")
    return {n: {k: float(np.mean([r[k] for r in rows if r["training"] == n])) for k in keys} for n in names}


def table(rows: list[dict]) -> str:
    """A Markdown table of the rows, then each training's mean over its seeds."""
    lines = [
        "| training | seed | test-clean CER | WER | noisy test-clean CER | WER |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    cells = [(r["training"], str(r["seed"]), r) for r in rows]
    cells += [(n, "mean", m) for n, m in means(rows).items()]
    lines += [
        f"| {n} | {seed} | {100 * r['clean_cer']:.1f}% | {100 * r['clean_wer']:.1f}% | "
        f"{100 * r['noisy_cer']:.1f}% | {100 * r['noisy_wer']:.1f}% |"
        for n, seed, r in cells
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from configs import demo
    from ds2_jax import cli, evaluation, files, train
    from ds2_jax.tools import make_noisy

    args, _ = cli.parse_args(argv, define_flags, __doc__)
    os.makedirs(args.out, exist_ok=True)
    train_noise = training_noise(os.path.join(args.out, "noise-train"))
    eval_noise = evaluation_noise(os.path.join(args.out, "noise-eval"))
    noisy = os.path.join(args.out, "noisy")
    if not os.path.isdir(os.path.join(noisy, "LibriSpeech", "test-clean")):
        made = make_noisy.make_noisy(args.manual_dir, "test-clean", eval_noise, noisy, (0.0, 10.0), seed=1)
        print(json.dumps({"noisy_split": made}), flush=True)

    def config(noise_prob: float, seed: int, manual_dir: str, data_dir: str):
        c = demo.get_config()
        c.seed = seed
        c.num_train_steps, c.optimizer.decay_steps = args.steps, args.steps
        c.eval_every_steps, c.checkpoint_every_steps = 0, args.steps
        c.dataset.manual_dir, c.dataset.data_dir = manual_dir, data_dir
        if noise_prob:
            c.waveform.noise_dir, c.waveform.noise_prob = train_noise, noise_prob
            c.waveform.noise_snr_db_min, c.waveform.noise_snr_db_max = args.snr_db_min, args.snr_db_max
        return c

    setting = f"noise{round(100 * args.noise_prob)}-snr{args.snr_db_min:g}-{args.snr_db_max:g}"
    rows = []
    for seed in [int(s) for s in args.seeds]:
        for name, prob in (("clean", 0.0), (setting, args.noise_prob)):
            workdir = os.path.join(args.out, f"run-{name}-seed{seed}")
            train.train_and_evaluate(config(prob, seed, args.manual_dir, os.path.join(args.out, "tfds")), workdir)
            scores = [
                evaluation.evaluate_checkpoint(
                    config(prob, seed, corpus, os.path.join(args.out, tfds)), workdir, split="test-clean"
                )
                for corpus, tfds in ((args.manual_dir, "tfds"), (noisy, "tfds-noisy"))
            ]
            rows.append(
                {
                    "training": name,
                    "seed": seed,
                    "clean_cer": scores[0]["cer"],
                    "clean_wer": scores[0]["wer"],
                    "noisy_cer": scores[1]["cer"],
                    "noisy_wer": scores[1]["wer"],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    result = {
        "steps": args.steps,
        "seeds": [int(s) for s in args.seeds],
        "noise_prob": args.noise_prob,
        "train_snr_db": [args.snr_db_min, args.snr_db_max],
        "eval_snr_db": [0.0, 10.0],
        "rows": rows,
        "means": means(rows),
    }
    files.write_text(os.path.join(args.out, f"noisy_speech-{setting}.json"), json.dumps(result, indent=1) + "\n")
    files.write_text(os.path.join(args.out, f"noisy_speech-{setting}.md"), table(rows))
    return 0


if __name__ == "__main__":
    from ds2_jax import errors

    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
