"""Waveform augmentation of training utterances (config.waveform): speed perturbation, room
impulse response, additive noise at a random SNR, gain. Host code, numpy, no jax.

Each utterance's augmentation is a pure function of (seed, step, row of the global batch) and
the recordings named: `Augmenter.__call__` draws from `np.random.default_rng([seed, SALT, step,
row])`, so a resumed run, any number of devices or processes, and any number of input workers
give the same batches. It runs where batches are made (the input workers, pipeline.loader), before
padding: speed perturbation changes an utterance's length, and the buckets are padded for the
slowest speed (settings.Waveform.stretch). Why there and not in the compiled step: BUILD_NOTES
"Input pipeline" and benchmarks/results/2026-12-05-cpu-augmentation/NOTES.md.

Noise and impulse responses are read lazily (a segment at a random offset per utterance), so a
large noise collection costs no memory in each worker; the files are listed and checked once, each
read whole at start: an unreadable, silent or non-finite recording is refused, named (a NaN in a
noise file would turn every utterance it is mixed into to zeros).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np

from ds2_jax import settings

SALT = 0xA06  # keeps these draws apart from every other stream of (seed, ...)
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3", ".aiff", ".aif", ".au", ".sph")


@dataclasses.dataclass(frozen=True)
class Recording:
    path: str
    frames: int
    rate: int


@functools.lru_cache(maxsize=8)
def recordings(spec: str, key: str) -> tuple[Recording, ...]:
    """The readable audio files of a folder (recursively) or a list file (one path a line, relative
    to the file's folder); a ValueError naming `key` when there is none."""
    import soundfile

    if os.path.isdir(spec):
        paths = sorted(
            os.path.join(root, f)
            for root, _, names in os.walk(spec)
            for f in names
            if f.lower().endswith(AUDIO_SUFFIXES)
        )
    elif os.path.isfile(spec):
        with open(spec) as f:
            lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
        paths = [p if os.path.isabs(p) else os.path.join(os.path.dirname(spec), p) for p in lines]
    else:
        raise FileNotFoundError(f"waveform.{key}={spec!r}: no such folder or list file")
    found, bad = [], []
    for path in paths:
        try:
            info = soundfile.info(path)
            why = "" if info.frames > 0 else "no samples"
            why = why or fault(path)
        except Exception as e:  # noqa: BLE001  (libsndfile raises several types)
            why = f"unreadable: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if why:
            bad.append(f"{path} ({why})")
        else:
            found.append(Recording(path, int(info.frames), int(info.samplerate)))
    if bad:  # one bad recording would zero or silence every utterance it is mixed into: refused, named
        raise ValueError(
            f"waveform.{key}={spec!r}: {len(bad)} of {len(paths)} recordings cannot be used: {'; '.join(bad[:3])}"
            f"{' ...' if len(bad) > 3 else ''}. Remove or fix them (formats: {' '.join(AUDIO_SUFFIXES)})"
        )
    if not found:
        raise ValueError(
            f"waveform.{key}={spec!r} holds no readable audio (0 files; formats: {' '.join(AUDIO_SUFFIXES)})"
        )
    return tuple(found)


def fault(path: str, block: int = 1 << 20) -> str:
    """What makes a noise or impulse-response recording unusable ('' if nothing): non-finite samples
    (a NaN spreads through the mix to every sample) or silence (nothing to add). Read whole, in blocks."""
    import soundfile

    peak = 0.0
    for x in soundfile.blocks(path, blocksize=block, dtype="float32", always_2d=True):
        if not np.isfinite(x).all():
            return f"{int(np.sum(~np.isfinite(x)))} NaN or infinite samples"
        peak = max(peak, float(np.abs(x).max(initial=0.0)))
    return "" if peak > 0 else "silent: every sample is 0"


def _read(rec: Recording, start: int, frames: int, rate: int) -> np.ndarray:
    """<float32>[~frames * rec.rate / rate] mono from `start` (in rec's own samples), at `rate`."""
    import soundfile

    audio, _ = soundfile.read(rec.path, start=start, frames=frames, dtype="float32", always_2d=True)
    audio = audio.mean(axis=1)
    if not np.isfinite(audio).all():  # checked at start (`fault`); a file changed since is refused, named
        raise ValueError(f"{rec.path}: NaN or infinite samples (a noise or impulse-response recording)")
    if rec.rate != rate:
        import soxr

        audio = soxr.resample(audio, rec.rate, rate)
    return audio.astype(np.float32, copy=False)


class Augmenter:
    """config.waveform applied to int16 utterances: `augment(audio, step, row)`."""

    def __init__(self, waveform: settings.Waveform, seed: int, sample_rate: int):
        self.cfg = waveform
        self.seed = seed
        self.rate = sample_rate
        # Listed and checked now (the main process: one error line before anything compiles).
        self.noise = recordings(waveform.noise_dir, "noise_dir") if waveform.noise_prob > 0 else ()
        self.rirs = recordings(waveform.rir_dir, "rir_dir") if waveform.rir_prob > 0 else ()

    def __call__(self, audio: np.ndarray, step: int, row: int) -> np.ndarray:
        """<int16>[n] -> <int16>[m] (m = n unless the speed changed), for global batch `step`'s `row`."""
        c = self.cfg
        rng = np.random.default_rng([self.seed, SALT, int(step), int(row)])
        u = rng.random(8)  # every draw made, used or not: one part's setting never moves another's
        x = audio.astype(np.float32) / 32768.0
        if u[0] < c.speed_prob:
            x = speed(x, c.speed_min + u[1] * (c.speed_max - c.speed_min))
        if u[2] < c.rir_prob:
            x = reverberate(x, _read(self.rirs[int(u[3] * len(self.rirs))], 0, -1, self.rate))
        if u[4] < c.noise_prob:
            snr = c.noise_snr_db_min + u[5] * (c.noise_snr_db_max - c.noise_snr_db_min)
            x = add_noise(x, self.noise_segment(len(x), u[6], rng), snr)
        if u[7] < c.gain_prob:
            x = x * 10 ** ((c.gain_db_min + rng.random() * (c.gain_db_max - c.gain_db_min)) / 20)
        return np.clip(np.round(x * 32768.0), -32768, 32767).astype(np.int16)

    def noise_segment(self, n: int, pick: float, rng: np.random.Generator) -> np.ndarray:
        """n samples of a noise recording from a random offset (tiled when it is shorter)."""
        rec = self.noise[int(pick * len(self.noise))]
        want = int(np.ceil(n * rec.rate / self.rate)) + 1
        start = int(rng.integers(0, max(rec.frames - want, 0) + 1))
        seg = _read(rec, start, min(want, rec.frames), self.rate)
        if len(seg) == 0:
            return np.zeros(n, np.float32)
        return np.resize(seg, n)  # tiles a short recording


def speed(x: np.ndarray, factor: float) -> np.ndarray:
    """x played `factor` times as fast (tempo and pitch): resampled to round(n / factor) samples (soxr)."""
    if factor == 1.0:
        return x
    import soxr

    return soxr.resample(x, factor, 1.0, quality="HQ").astype(np.float32, copy=False)


def reverberate(x: np.ndarray, rir: np.ndarray) -> np.ndarray:
    """x convolved with an impulse response (unit energy), aligned at its peak; same length and level."""
    if len(rir) == 0 or not np.any(rir):
        return x
    peak = int(np.argmax(np.abs(rir)))
    rir = rir / np.sqrt(np.sum(rir**2))
    size = len(x) + len(rir) - 1
    nfft = 1 << (size - 1).bit_length()
    y = np.fft.irfft(np.fft.rfft(x, nfft) * np.fft.rfft(rir, nfft), nfft)[peak : peak + len(x)]
    level = np.sqrt(np.mean(x**2) / max(np.mean(y**2), 1e-20))
    return (y * level).astype(np.float32)


def add_noise(x: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """x + noise scaled to `snr_db` below x's power (x unchanged when it or the noise is silent)."""
    px, pn = float(np.mean(x**2)), float(np.mean(noise**2))
    if px <= 0 or pn <= 0:
        return x
    return x + noise * np.sqrt(px / (pn * 10 ** (snr_db / 10)))


def make(waveform: settings.Waveform, seed: int, sample_rate: int) -> Augmenter | None:
    """An Augmenter when any part of config.waveform is on; None otherwise."""
    return Augmenter(waveform, seed, sample_rate) if waveform.enabled else None
