"""A noisy copy of a LibriSpeech-layout split: each utterance mixed with noise at an SNR uniform
in [--snr_db_min, --snr_db_max], for measuring a model on noisy speech.

    python -m ds2_jax.tools.make_noisy --manual_dir=corpora/tiny_librispeech --split=test-clean \\
        --noise_dir=NOISE --out=DIR [--snr_db_min=0 --snr_db_max=10 --seed=0]
    python launch.py --config=configs/demo.py --workdir=W --mode=eval --config.eval.split=test-clean \\
        --config.dataset.manual_dir=DIR --config.dataset.data_dir=DIR/tfds

DIR/LibriSpeech/<split> holds the noisy split (same names, transcripts and lengths; 16 kHz int16
FLAC); the other splits of --manual_dir are linked into DIR unchanged (training's buckets and
statistics come from them), so DIR is a corpus the project reads like the one it came from. Utterance
i (in sorted file order) takes its noise, offset and SNR from rng([seed, i]), the mixing of
ds2_jax.pipeline.augment (add_noise): the output is a pure function of the flags and the files. Use
noise recordings that training never saw (a folder or a list file, as config.waveform.noise_dir).
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import soundfile


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_string(
        "manual_dir", None, "LibriSpeech-layout corpus (extracted, not .tar.gz).", flag_values=fv, required=True
    )
    flags.DEFINE_string("split", "test-clean", "The split to copy with noise.", flag_values=fv)
    flags.DEFINE_string(
        "noise_dir", None, "Noise recordings: a folder (recursive) or a list file.", flag_values=fv, required=True
    )
    flags.DEFINE_string(
        "out", None, "The noisy corpus (created; must not hold the split yet).", flag_values=fv, required=True
    )
    flags.DEFINE_float("snr_db_min", 0.0, "Lowest SNR (dB).", flag_values=fv)
    flags.DEFINE_float("snr_db_max", 10.0, "Highest SNR (dB).", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seeds every draw.", flag_values=fv)


def _root(manual_dir: str) -> str:
    nested = os.path.join(manual_dir, "LibriSpeech")
    return nested if os.path.isdir(nested) else manual_dir


def make_noisy(
    manual_dir: str, split: str, noise_dir: str, out: str, snr_db: tuple[float, float], seed: int = 0
) -> dict:
    """Writes the noisy corpus; returns {'utterances', 'mean_snr_db', 'linked'}."""
    from ds2_jax import settings
    from ds2_jax.pipeline import augment

    if not snr_db[0] <= snr_db[1]:
        raise ValueError(f"--snr_db_min={snr_db[0]} must be <= --snr_db_max={snr_db[1]}")
    src_root = _root(manual_dir)
    src = os.path.join(src_root, split)
    if not os.path.isdir(src):
        archive = os.path.join(manual_dir, f"{split}.tar.gz")
        hint = f" ({archive} is an archive: extract it first)" if os.path.exists(archive) else ""
        raise FileNotFoundError(f"--split={split}: no folder {src}{hint}")
    dst_root = os.path.join(out, "LibriSpeech")
    dst = os.path.join(dst_root, split)
    if os.path.exists(dst):
        raise FileExistsError(f"{dst} exists: choose another --out, or remove it to make it again")
    rate = settings.Spectrogram().sample_rate
    mixer = augment.Augmenter(settings.Waveform(noise_dir=noise_dir, noise_prob=1.0), seed, rate)
    files = sorted(os.path.relpath(os.path.join(r, f), src) for r, _, names in os.walk(src) for f in names)
    snrs = []
    for i, rel in enumerate(f for f in files if f.endswith(".flac")):
        audio, sr = soundfile.read(os.path.join(src, rel), dtype="int16")
        if sr != rate or audio.ndim != 1:
            raise ValueError(f"{os.path.join(src, rel)}: {sr} Hz, {audio.ndim} channel(s); expected {rate} Hz mono")
        rng = np.random.default_rng([seed, i])
        snr = float(rng.uniform(*snr_db))
        x = audio.astype(np.float32) / 32768.0
        y = augment.add_noise(x, mixer.noise_segment(len(x), float(rng.random()), rng), snr)
        os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
        soundfile.write(
            os.path.join(dst, rel), np.clip(np.round(y * 32768), -32768, 32767).astype(np.int16), rate, subtype="PCM_16"
        )
        snrs.append(snr)
    for rel in files:  # transcripts and anything else as they are
        if not rel.endswith(".flac"):
            shutil.copyfile(os.path.join(src, rel), os.path.join(dst, rel))
    linked = []
    for name in sorted(os.listdir(src_root)):
        other = os.path.join(src_root, name)
        if name != split and not os.path.exists(os.path.join(dst_root, name)):
            os.symlink(os.path.abspath(other), os.path.join(dst_root, name))
            linked.append(name)
    return {"utterances": len(snrs), "mean_snr_db": float(np.mean(snrs)) if snrs else None, "linked": linked}


def main(argv: list[str] | None = None) -> int:
    from ds2_jax import cli

    args, _ = cli.parse_args(argv, define_flags, __doc__)
    done = make_noisy(
        args.manual_dir, args.split, args.noise_dir, args.out, (args.snr_db_min, args.snr_db_max), args.seed
    )
    print(
        f"{os.path.join(args.out, 'LibriSpeech', args.split)}: {done['utterances']} utterances with noise at "
        f"{args.snr_db_min:g}-{args.snr_db_max:g} dB SNR (mean {done['mean_snr_db'] or 0:.1f}); linked unchanged: "
        f"{', '.join(done['linked']) or 'none'}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    from ds2_jax import errors

    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
