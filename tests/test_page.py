"""The page at / in a real browser: Debian's chromium, driven by playwright (no browser download),
its microphone a fake device playing a known WAV. The page records, converts (and where the
browser's rate is not the model's, resamples) in its AudioWorklet, streams to /v1/stream, shows
partials and the final text with word times. Its model is the suite's one trained demo model
(bidirectional: the stream re-decodes the audio so far, engine.RedecodedUtterance); a unidirectional
model's frame-by-frame stream goes through the same page and socket (test_serve, test_streaming).

What it proves, and why not more. Chromium's fake device cannot hand the page the file's samples:
it plays at 48 kHz (a 16 kHz file is resampled on the way in, and again to the page's 16 kHz audio
context) and starts playing when getUserMedia opens it, before the page listens (measured: 148 and
628 samples of the lead-in gone, a 0.4-sample shift, 31-33 dB from the file). The brief demo model
is not robust to that: one output frame (320 samples) less of leading silence, or the resampling
alone, changes a letter of its text (measured; benchmarks/results/2026-12-06-gpu-page-robustness: no model
trained on the bundled corpus, 800 steps or silence padding included, keeps its text on more than 4 of
the 39 test utterances), so no real microphone path can give exactly `transcribe --model`'s text of
the file. So the test holds the page to three things that together
leave no room: (1) what the page streamed IS the file: aligned within its lead-in, and each 250 ms
piece of its speech >= MIN_SNR_DB from the file where the stream's offset puts it (a wrong rate, a
stretch, a clipped or silent stream fail every piece; a dropped or repeated stretch is a jump between
pieces: at most MAX_GLITCHES, the fake capture device's own on a loaded machine, see below);
(2) the page's final text is exactly `transcribe --model`'s text of that streamed audio; (3) the
page's file upload gives exactly `transcribe --model`'s text of the file. And, loosely, the final
text is the file's within MAX_CER."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest
import soundfile

pytest.importorskip("starlette")
playwright_api = pytest.importorskip("playwright.sync_api")

from ds2_jax import audio as audio_lib  # noqa: E402
from ds2_jax import metrics, settings, transcribe  # noqa: E402
from ds2_jax.infer import jax_backend  # noqa: E402
from tests.helpers import CORPUS  # noqa: E402
from tests.serving import serving  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
MAX_CER = 0.3  # the page's text against the file's: 0.12 in 4 runs (the demo model; the fake device resamples)
MIN_SNR_DB = 20.0  # the streamed audio against the file, aligned (measured 31-33 dB; a wrong rate: 0 dB)
# The streamed audio is held to the file piece by piece (WINDOW samples each): on a loaded machine the whole
# stream was now and then 0.19-0.25 dB from the file when aligned as one (2026-12-06: 1 CI run, 4 local
# runs under load; every other run 30.7 dB), most likely Chromium's fake capture device dropping or repeating a
# stretch (not shown: those runs' audio was not kept). At most MAX_GLITCHES jumps of at most MAX_GLITCH_SAMPLES
# between the pieces that fit are let through, and as many spoiled pieces (the first may be spoiled with no
# jump before it): a dropped or repeated 10 ms passes; a wrong rate, a stretch, a clip or three glitches fail
# (checked on five streamed recordings, then altered).
WINDOW = 4_000
MAX_GLITCHES = 2
MAX_GLITCH_SAMPLES = 1_600  # 100 ms
FLAC = os.path.join(CORPUS, "LibriSpeech", "test-clean", "118", "1180", "118-1180-0001.flac")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]


def _aligned(received: np.ndarray, sent: np.ndarray, up: int = 10, near: int | None = None) -> tuple[float, float]:
    """(offset in samples of `sent` where `received` begins, to 1/`up` sample; the SNR in dB of
    `received` against `sent` there, at its best gain): the integer offset by cross-correlation
    (within MAX_GLITCH_SAMPLES * MAX_GLITCHES of `near` when given), then the fraction against `sent`
    upsampled `up` times (the browser's resampling shifts it)."""
    import soxr

    r, s = received.astype(np.float64), sent.astype(np.float64)
    n = len(r) + len(s)
    correlation = np.fft.irfft(np.fft.rfft(s, n) * np.conj(np.fft.rfft(r, n)), n)[: len(s)]
    # Normalized by the energy of the stretch of `sent` each lag compares (a cosine): raw correlation
    # favours a loud stretch nearby over the quiet one that matches (a piece at the speech's onset was
    # placed 385 samples off, at 2 dB; 41 of 425 simulated lead-ins put some piece off so).
    energy = np.concatenate([[0.0], np.cumsum(s**2)])
    lags = np.arange(len(s))
    correlation = correlation / np.sqrt(np.maximum(energy[np.minimum(lags + len(r), len(s))] - energy[lags], 1e-9))
    low = 0 if near is None else max(near - MAX_GLITCH_SAMPLES * MAX_GLITCHES, 0)
    high = len(s) if near is None else near + MAX_GLITCH_SAMPLES * MAX_GLITCHES + 1
    offset = low + int(np.argmax(correlation[low:high]))
    fine = soxr.resample(s, 16_000, 16_000 * up, quality="VHQ")
    best = (float(offset), -np.inf)
    for fraction in range(1 - up, up):
        part = fine[max(offset * up + fraction, 0) :: up][: len(r)]
        err = r[: len(part)] - part * (part @ r[: len(part)]) / max(part @ part, 1e-9)
        snr = 10 * np.log10((r[: len(part)] ** 2).sum() / max((err**2).sum(), 1e-9))
        if snr > best[1]:
            best = (offset + fraction / up, float(snr))
    return best


def _pieces(received: np.ndarray, sent: np.ndarray, offset: float) -> list[tuple[int, float, float]]:
    """(start in `received`, its offset into `sent` less the start, SNR in dB) of each WINDOW-sample piece
    of `received` that holds speech (a tenth of the loudest piece's RMS or more), each aligned on its own
    near where the whole stream's `offset` puts it."""
    starts = range(0, len(received) - WINDOW + 1, WINDOW)
    rms = [float(np.sqrt(np.mean(received[i : i + WINDOW].astype(np.float64) ** 2))) for i in starts]
    pieces = []
    for i, loudness in zip(starts, rms):
        if loudness >= max(rms) / 10:
            at, snr = _aligned(received[i : i + WINDOW], sent, near=round(offset) + i)
            pieces.append((i, at - i, snr))
    return pieces


def _glitches(pieces: list[tuple[int, float, float]]) -> list[float]:
    """The jumps (samples) between the offsets of consecutive pieces that match the file: a stretch
    dropped or repeated between them."""
    fits = [p for p in pieces if p[2] >= MIN_SNR_DB]
    return [b[1] - a[1] for a, b in zip(fits, fits[1:]) if abs(b[1] - a[1]) > 1]


def _wav(tmp_path) -> str:
    """The utterance with 1 s of silence before and 1.5 s after (the fake microphone starts playing
    before the page listens, and stops after it), as a 16 kHz WAV."""
    speech = audio_lib.read(FLAC, 16_000)
    padded = np.concatenate([np.zeros(16_000, np.int16), speech, np.zeros(24_000, np.int16)])
    path = str(tmp_path / "mic.wav")
    soundfile.write(path, padded, 16_000, subtype="PCM_16")
    return path


@pytest.mark.slow
@pytest.mark.xdist_group("trained")  # one worker trains it (conftest.py)
def test_the_page_hears_the_microphone_and_shows_transcribe_models_text(trained, tmp_path, capsys):
    if not os.path.exists(CHROMIUM):
        pytest.skip("no chromium (.ci/run installs Debian's)")
    from ds2_jax import export

    wav = _wav(tmp_path)
    model = str(tmp_path / "model.onnx")
    assert export.main(["--workdir", trained.workdir, "--out", model]) == 0
    capsys.readouterr()
    assert transcribe.main(["--model", model, wav]) == 0
    want = capsys.readouterr().out.split("\t", 1)[1].strip()
    assert want  # the demo model hears words in it
    engine = jax_backend.JaxEngine(trained.workdir, settings.Decoding(beam_width=0))
    received = []  # the PCM the page sent, as the stream fed it to the model
    stream = engine.stream

    def recording_stream():
        utterance = stream()
        feed = utterance.feed
        utterance.feed = lambda chunk: received.append(np.array(chunk)) or feed(chunk)
        return utterance

    seconds = len(soundfile.read(wav)[0]) / 16_000
    warm = stream()  # compile each length the stream's decodes take before the browser's clock runs
    for first in range(0, int(seconds + 1) * 16_000, 1600):
        warm.feed(np.zeros(1600, np.int16))
    warm.finish()
    engine.stream = recording_stream
    with serving(engine) as url, playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=[*FLAGS, f"--use-file-for-fake-audio-capture={wav}%noloop"]
        )
        try:
            page = browser.new_page()
            page.goto(url + "/")
            page.wait_for_function("document.getElementById('start').disabled === false", timeout=30_000)
            page.click("#start")
            page.wait_for_function("document.getElementById('status').textContent === 'listening…'", timeout=30_000)
            partials, stop_at = set(), time.monotonic() + seconds - 0.7  # stop in the trailing silence
            while time.monotonic() < stop_at:
                page.wait_for_timeout(100)
                partials.add(page.text_content("#partial"))
            page.click("#stop")
            deadline = time.monotonic() + 120
            while page.get_attribute("#final", "data-done") != "1" and time.monotonic() < deadline:
                partials.add(page.text_content("#partial"))  # a loaded machine's partials may trail the audio
                page.wait_for_timeout(50)
            heard = page.text_content("#final")
            words = page.locator("#words span").all_text_contents()
            error = page.text_content("#status")
            page.set_input_files("#file", wav)
            page.wait_for_function(
                "document.getElementById('status').textContent.includes('s of audio')", timeout=60_000
            )
            uploaded = page.text_content("#final")
        finally:
            browser.close()
    streamed = np.concatenate(received)
    sent = soundfile.read(wav, dtype="int16")[0]
    speech = len(audio_lib.read(FLAC, 16_000))
    offset, snr = _aligned(streamed, sent)
    assert 0 <= offset < 16_000, (offset, snr)  # the file, from within its 1 s lead-in
    pieces = _pieces(streamed, sent, offset)
    glitches = _glitches(pieces)
    spoiled = [p for p in pieces if p[2] < MIN_SNR_DB]  # those a glitch falls in (or the first one)
    assert len(pieces) * WINDOW >= 0.5 * speech, pieces  # the speech is there
    assert len(glitches) <= MAX_GLITCHES and all(abs(g) <= MAX_GLITCH_SAMPLES for g in glitches), pieces
    assert len(spoiled) <= min(len(glitches) + 1, MAX_GLITCHES), (snr, pieces)  # the file, piece by piece
    assert len(streamed) + offset >= 16_000 + speech  # to past the speech's end
    pcm = str(tmp_path / "received.wav")
    soundfile.write(pcm, streamed, 16_000, subtype="PCM_16")
    assert transcribe.main(["--model", model, pcm]) == 0
    offline = capsys.readouterr().out.split("\t", 1)[1].strip()
    assert heard == offline, (heard, offline, error)
    assert metrics.error_rates([want], [heard])["cer"] <= MAX_CER, (heard, want)
    assert len([p for p in partials if p]) >= 2  # partials shown while it listened
    assert [w.split()[0] for w in words] == heard.split()  # each word with its times
    assert all("–" in w and w.endswith(" s") for w in words)
    assert uploaded == want
