"""Waveform augmentation (config.waveform, ds2_jax.pipeline.augment): each part does what it says
to the number, every draw is a function of (seed, step, row), and the batches do not depend on
processes or input workers; bad settings and folders are one error naming the key."""

import numpy as np
import pytest

from ds2_jax import settings
from ds2_jax.pipeline import augment, loader
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import make_source
from tests.helpers import write_noise
from tests.test_loader import corpus  # noqa: F401  (the fixture: a tiny LibriSpeech build)
from tests.test_tfds_source import make_config

RATE = 16_000


def waveform(**kw) -> settings.Waveform:
    return settings.Waveform(**kw)


def tone(seconds=1.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)


def test_noise_is_added_at_the_drawn_snr(tmp_path):
    x = tone().astype(np.float32) / 32768
    noise = np.random.default_rng(1).standard_normal(len(x)).astype(np.float32)
    for snr in (0.0, 7.5, 20.0):
        y = augment.add_noise(x, noise, snr)
        measured = 10 * np.log10(np.mean(x**2) / np.mean((y - x) ** 2))
        assert measured == pytest.approx(snr, abs=1e-3)
    aug = augment.Augmenter(
        waveform(noise_dir=write_noise(tmp_path / "n"), noise_prob=1.0, noise_snr_db_min=5.0, noise_snr_db_max=5.0),
        seed=0,
        sample_rate=RATE,
    )
    a = tone()
    y = aug(a, step=3, row=1).astype(np.float64)
    measured = 10 * np.log10(np.mean(a.astype(np.float64) ** 2) / np.mean((y - a) ** 2))
    assert measured == pytest.approx(5.0, abs=0.05)  # int16 rounding only


def test_speed_changes_the_length_by_the_factor_and_gain_scales_exactly():
    x = tone(2.0).astype(np.float32) / 32768
    for factor in (0.9, 1.0, 1.1):
        assert abs(len(augment.speed(x, factor)) - len(x) / factor) <= 1
    # the tone's pitch moves with the speed (Kaldi's speed perturbation, not a tempo change)
    y = augment.speed(x, 1.1)
    peak = np.argmax(np.abs(np.fft.rfft(y))) * RATE / len(y)
    assert peak == pytest.approx(440 * 1.1, abs=2)
    aug = augment.Augmenter(waveform(gain_prob=1.0, gain_db_min=-6.0, gain_db_max=-6.0), seed=0, sample_rate=RATE)
    a = tone()
    np.testing.assert_allclose(aug(a, 0, 0), np.round(a * 10 ** (-6 / 20)), atol=1)


def test_reverberation_keeps_length_level_and_alignment():
    x = tone().astype(np.float32) / 32768
    rir = np.zeros(800, np.float32)
    rir[100] = 1.0  # a pure delay, peak at 100: aligned back, so the output is the input
    np.testing.assert_allclose(augment.reverberate(x, rir), x, atol=1e-5)
    rir[300:] = 0.3 * np.exp(-np.arange(500) / 100) * np.random.default_rng(0).standard_normal(500)
    y = augment.reverberate(x, rir)
    assert len(y) == len(x) and np.mean(y**2) == pytest.approx(np.mean(x**2), rel=1e-4)
    assert not np.allclose(y, x, atol=1e-3)


def test_each_utterance_is_a_function_of_seed_step_and_row(tmp_path):
    cfg = waveform(noise_dir=write_noise(tmp_path / "n"), noise_prob=0.5, speed_prob=0.5, gain_prob=0.5)
    a = tone()
    aug = augment.Augmenter(cfg, seed=0, sample_rate=RATE)
    again = augment.Augmenter(cfg, seed=0, sample_rate=RATE)
    outs = {(step, row): aug(a, step, row) for step in range(4) for row in range(4)}
    for (step, row), y in outs.items():
        np.testing.assert_array_equal(y, again(a, step, row))
    assert len({y.tobytes() for y in outs.values()}) == len(outs)  # every (step, row) its own draws
    assert len({len(y) for y in outs.values()}) > 2  # speeds differ
    assert not np.array_equal(augment.Augmenter(cfg, seed=1, sample_rate=RATE)(a, 0, 0), outs[0, 0])


def test_process_shares_and_input_workers_give_the_one_process_batches(corpus, tmp_path):  # noqa: F811
    noise = write_noise(tmp_path / "n")

    def config(workers):
        c = make_config(corpus, sortagrad=False, num_workers=workers)
        c.waveform.noise_dir, c.waveform.noise_prob, c.waveform.speed_prob = noise, 0.7, 0.7
        c.waveform.speed_min = 0.8
        return settings.from_config_dict(c)

    def run(cfg, sharding):
        source = make_source(cfg, sharding)
        return source, list(loader.train_batches(cfg, sharding, source, 2, 8))

    plain = settings.from_config_dict(make_config(corpus, sortagrad=False, num_workers=0))
    _, clean = run(plain, Sharding(4))
    source, whole = run(config(0), Sharding(4))
    halves = [run(config(0), Sharding(4, p, 2))[1] for p in (0, 1)]
    _, workers = run(config(2), Sharding(4))
    # buckets padded for the slowest speed: 1 / 0.8 of the longest, whole hops
    assert [s for s, _ in source.shapes()] > [s for s, _ in make_source(plain, Sharding(4)).shapes()]
    for b, w, h0, h1, c in zip(whole, workers, *halves, clean, strict=True):
        for k in b:
            np.testing.assert_array_equal(b[k], w[k], err_msg=k)
            np.testing.assert_array_equal(b[k], np.concatenate([h0[k], h1[k]]), err_msg=k)
        np.testing.assert_array_equal(b["labels"], c["labels"])  # the same utterances, other audio
        assert not np.array_equal(b["audio_lengths"], c["audio_lengths"])


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"speed_min": 0.0}, r"waveform.speed_min=0.0: must be in \[0.5, 2.0\] \(a speed factor"),  # settings.RANGES
        ({"speed_max": 40.0}, r"waveform.speed_max=40.0: must be in \[0.5, 2.0\]"),  # every utterance CTC-infeasible
        ({"noise_snr_db_max": 1e6}, r"waveform.noise_snr_db_max=1000000.0: must be in \[-20.0, 60.0\]"),
        ({"gain_db_max": 200.0}, r"waveform.gain_db_max=200.0: must be in \[-40.0, 40.0\]"),
        ({"speed_min": 1.2}, r"the speed range must be positive, min <= max"),
        ({"noise_prob": 1.5}, r"waveform.noise_prob=1.5: must be in \[0.0, 1.0\]"),
        ({"gain_prob": float("nan")}, r"waveform.gain_prob=nan: must be a finite number"),
        ({"noise_prob": 0.5}, r"waveform.noise_prob=0.5 needs waveform.noise_dir"),
        ({"noise_snr_db_min": 20.0}, r"waveform.noise_snr_db_min=20.0 must be <= waveform.noise_snr_db_max=15.0"),
    ],
)
def test_a_bad_setting_names_its_key(changes, message):
    with pytest.raises(ValueError, match=message):
        settings.override(settings.Settings(), {f"waveform.{k}": v for k, v in changes.items()})


def test_a_noise_folder_without_readable_audio_is_one_error_naming_it(tmp_path):
    (tmp_path / "n").mkdir()
    (tmp_path / "n" / "broken.wav").write_bytes(b"RIFF....not audio")
    (tmp_path / "n" / "notes.txt").write_text("hello")
    cfg = waveform(noise_dir=str(tmp_path / "n"), noise_prob=0.5)
    with pytest.raises(
        ValueError, match=r"waveform.noise_dir=.*n': 1 of 1 recordings cannot be used: .*broken.wav \(unreadable"
    ):
        augment.Augmenter(cfg, seed=0, sample_rate=RATE)
    (tmp_path / "e").mkdir()
    with pytest.raises(ValueError, match=r"waveform.noise_dir=.*e' holds no readable audio \(0 files"):
        augment.Augmenter(waveform(noise_dir=str(tmp_path / "e"), noise_prob=0.5), seed=0, sample_rate=RATE)
    with pytest.raises(FileNotFoundError, match=r"waveform.rir_dir=.*nowhere.*no such folder or list file"):
        augment.Augmenter(waveform(rir_dir=str(tmp_path / "nowhere"), rir_prob=0.5), seed=0, sample_rate=RATE)
    listed = tmp_path / "noises.txt"  # a list file: paths relative to it
    write_noise(tmp_path / "m")
    listed.write_text("m/n0.wav\n# a comment\nm/n1.wav\n")
    assert [r.rate for r in augment.recordings(str(listed), "noise_dir")] == [RATE, 8000]


def test_make_noisy_copies_a_split_with_noise_at_the_snr_range_and_links_the_rest(tmp_path):
    import os

    import soundfile

    from ds2_jax.datasets import build
    from ds2_jax.tools import make_noisy
    from tests import librispeech_testdata as td

    manual = str(tmp_path / "manual")
    td.write_durations_corpus(manual, "train-clean-100", [1.0, 1.2, 1.4, 1.6])
    utts = td.write_durations_corpus(manual, "test-clean", [1.5, 2.0, 2.5], first_speaker=50)
    noise = write_noise(tmp_path / "noise")
    out = str(tmp_path / "noisy")
    args = [
        f"--manual_dir={manual}",
        "--split=test-clean",
        f"--noise_dir={noise}",
        f"--out={out}",
        "--snr_db_min=2",
        "--snr_db_max=8",
    ]
    assert make_noisy.main(args) == 0
    src, dst = (os.path.join(d, "LibriSpeech", "test-clean") for d in (manual, out))
    flacs = sorted(
        os.path.relpath(os.path.join(r, f), src) for r, _, fs in os.walk(src) for f in fs if f.endswith(".flac")
    )
    assert len(flacs) == len(utts) == 3
    for rel in flacs:
        clean = soundfile.read(os.path.join(src, rel), dtype="int16")[0].astype(np.float64)
        noisy = soundfile.read(os.path.join(dst, rel), dtype="int16")[0].astype(np.float64)
        assert len(noisy) == len(clean)
        snr = 10 * np.log10(np.mean(clean**2) / np.mean((noisy - clean) ** 2))
        assert 2 - 0.05 <= snr <= 8 + 0.05, (rel, snr)
    trans = [f for _, _, fs in os.walk(dst) for f in fs if f.endswith(".trans.txt")]
    assert len(trans) == 1 and os.path.islink(os.path.join(out, "LibriSpeech", "train-clean-100"))
    with pytest.raises(FileExistsError, match="exists: choose another --out"):
        make_noisy.make_noisy(manual, "test-clean", noise, out, (2.0, 8.0))
    again = str(tmp_path / "again")  # a pure function of the flags and the files
    make_noisy.make_noisy(manual, "test-clean", noise, again, (2.0, 8.0))
    for rel in flacs:
        assert (
            open(os.path.join(dst, rel), "rb").read()
            == open(os.path.join(again, "LibriSpeech", "test-clean", rel), "rb").read()
        )
    builder = build.build(out, str(tmp_path / "tfds"))  # the project reads it like any corpus
    assert builder.info.splits["test_clean"].num_examples == 3
    assert builder.info.splits["train_clean_100"].num_examples == 4


@pytest.mark.parametrize(
    "samples,why",
    [
        (np.r_[np.zeros(800), np.nan, np.zeros(799)], r"1 NaN or infinite samples"),
        (np.r_[np.ones(800), np.inf, np.ones(799)] * 0.1, r"1 NaN or infinite samples"),
        (np.zeros(1600), r"silent: every sample is 0"),
    ],
)
def test_a_non_finite_or_silent_noise_or_rir_recording_is_refused_naming_it(tmp_path, samples, why):
    """One NaN in a noise file turns every utterance it is mixed into to zeros: refused at start."""
    import soundfile

    for key in ("noise", "rir"):
        folder = tmp_path / key
        write_noise(folder)  # two good recordings beside the bad one
        soundfile.write(str(folder / "bad.wav"), samples.astype(np.float32), RATE, subtype="FLOAT")
        cfg = waveform(**{f"{key}_dir": str(folder), f"{key}_prob": 0.5})
        augment.recordings.cache_clear()
        with pytest.raises(
            ValueError, match=rf"waveform.{key}_dir=.*: 1 of 3 recordings cannot be used: .*bad.wav \({why}"
        ):
            augment.Augmenter(cfg, seed=0, sample_rate=RATE)


# ----------------------------------------------------------------------------- by what it does to the signal


def _peak_hz(x: np.ndarray, rate: int = RATE) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate / len(x))


def _tone_file(path, hz: float, seconds: float, rate: int) -> None:
    """A tone rising from silence to 0.5 over the recording (the ramp shows where it repeats)."""
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    soundfile.write(str(path), (0.5 * t / seconds * np.sin(2 * np.pi * hz * t)).astype(np.float32), rate)


@pytest.mark.parametrize("rate", [8000, 22050, 44100])
def test_a_noise_recording_at_another_rate_keeps_its_pitch_and_duration(tmp_path, rate):
    """A 1 kHz tone of 0.25 s (rising) recorded at `rate` used as noise at 16 kHz: still 1 kHz, and
    still 0.25 s long (tiled to a second, it repeats every 4000 samples, not every 2000)."""
    folder = tmp_path / "noise"
    folder.mkdir()
    _tone_file(folder / "tone.wav", 1000.0, 0.25, rate)
    aug = augment.Augmenter(waveform(noise_dir=str(folder), noise_prob=1.0), seed=0, sample_rate=RATE)
    seg = aug.noise_segment(RATE, 0.0, np.random.default_rng(0))
    assert len(seg) == RATE
    assert _peak_hz(seg) == pytest.approx(1000.0, abs=5)
    period = RATE // 4  # 0.25 s at 16 kHz
    np.testing.assert_allclose(seg[period : period + 3000], seg[:3000], atol=0.02)
    assert not np.allclose(seg[period // 2 : period // 2 + 3000], seg[:3000], atol=0.02)


def test_every_noise_and_impulse_response_recording_is_drawn(tmp_path):
    """Three noise recordings (tones of 300, 1100 and 2500 Hz) and three impulse responses (echoes
    after 5, 10 and 20 ms): over 90 rows each recording is drawn, about a third of the time."""
    noise, rirs = tmp_path / "noise", tmp_path / "rirs"
    noise.mkdir()
    rirs.mkdir()
    import soundfile

    for hz in (300, 1100, 2500):
        _tone_file(noise / f"{hz}.wav", hz, 0.3, RATE)
    for ms in (5, 10, 20):
        rir = np.zeros(RATE // 20, np.float32)
        rir[0], rir[ms * RATE // 1000] = 1.0, 0.9
        soundfile.write(str(rirs / f"{ms}.wav"), rir, RATE)
    x = np.zeros(RATE // 4, np.int16)
    x[100] = 20000  # a click: its echo tells the impulse response
    seen_noise, seen_rir = [], []
    aug_n = augment.Augmenter(
        waveform(noise_dir=str(noise), noise_prob=1.0, noise_snr_db_min=0.0, noise_snr_db_max=0.0),
        seed=0,
        sample_rate=RATE,
    )
    aug_r = augment.Augmenter(waveform(rir_dir=str(rirs), rir_prob=1.0), seed=0, sample_rate=RATE)
    for row in range(90):
        added = aug_n(x, step=1, row=row).astype(np.float32) - x
        seen_noise.append(min((300, 1100, 2500), key=lambda hz: abs(hz - _peak_hz(added))))
        y = np.abs(aug_r(x, step=1, row=row).astype(np.float32))
        echo = 100 + int(np.argmax(y[110:]) + 10)
        seen_rir.append(round((echo - 100) * 1000 / RATE))
    for seen, values in ((seen_noise, (300, 1100, 2500)), (seen_rir, (5, 10, 20))):
        counts = {v: seen.count(v) for v in values}
        assert sum(counts.values()) == 90 and all(15 <= c <= 45 for c in counts.values()), counts


def test_the_speed_and_gain_draws_cover_their_settings_range_and_no_more():
    """Over 200 rows the drawn speed factors and gains fill [min, max] (within 5% of each end) and
    never leave it: the draws follow their settings."""
    x = tone(0.5)
    aug = augment.Augmenter(
        waveform(speed_prob=1.0, speed_min=0.8, speed_max=1.25, gain_prob=1.0, gain_db_min=-6.0, gain_db_max=3.0),
        seed=0,
        sample_rate=RATE,
    )
    factors, gains = [], []
    for row in range(200):
        y = aug(x, step=2, row=row)
        factors.append(len(x) / len(y))
        sped = augment.speed(x.astype(np.float32) / 32768.0, factors[-1])
        gains.append(20 * np.log10(np.sqrt(np.mean((y / 32768.0) ** 2)) / np.sqrt(np.mean(sped[: len(y)] ** 2))))
    assert 0.8 - 0.01 <= min(factors) <= 0.8 + 0.025 and 1.25 - 0.03 <= max(factors) <= 1.25 + 0.01
    assert -6.0 - 0.1 <= min(gains) <= -6.0 + 0.5 and 3.0 - 0.5 <= max(gains) <= 3.0 + 0.1
