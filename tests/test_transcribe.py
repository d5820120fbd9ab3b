"""python -m ds2_jax.transcribe: audio loading (any rate, any channels) and files -> text."""

import os
import tracemalloc

import numpy as np
import pytest
import soundfile

from ds2_jax import audio as audio_lib
from ds2_jax import errors, settings, transcribe
from ds2_jax.infer import jax_backend
from tests.helpers import CORPUS

TEST_CLEAN = os.path.join(CORPUS, "LibriSpeech", "test-clean")


def _utterances(n: int) -> list[tuple[str, str]]:
    """(flac path, reference text) of the first n test-clean utterances."""
    out = []
    for root, dirs, files in sorted(os.walk(TEST_CLEAN)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".trans.txt"):
                for line in open(os.path.join(root, name)):
                    utt, ref = line.split(maxsplit=1)
                    out.append((os.path.join(root, utt + ".flac"), ref.strip().lower()))
    return out[:n]


def test_load_audio_downmixes_resamples_and_keeps_16k_int16_exact(tmp_path):
    pytest.importorskip("soxr")
    flac, _ = _utterances(1)[0]
    audio, rate = soundfile.read(flac, dtype="int16")
    assert rate == 16_000
    np.testing.assert_array_equal(audio_lib.read(flac, 16_000), audio)
    wav = str(tmp_path / "a.wav")
    soundfile.write(wav, audio, rate)
    np.testing.assert_array_equal(audio_lib.read(wav, 16_000), audio)
    stereo = str(tmp_path / "stereo.flac")
    soundfile.write(stereo, np.stack([audio, np.zeros_like(audio)], 1), rate)
    np.testing.assert_allclose(audio_lib.read(stereo, 16_000), audio / 2, atol=1)  # channel mean
    low = str(tmp_path / "8k.wav")
    soundfile.write(low, audio[::2], 8_000)  # not band-limited; only the length matters here
    assert abs(len(audio_lib.read(low, 16_000)) - len(audio)) <= 2


def _cer(ref: str, hyp: str) -> float:
    from ds2_jax import metrics

    return metrics.error_rates([ref], [hyp])["cer"]


@pytest.mark.slow
@pytest.mark.xdist_group("trained")  # one worker trains it (conftest.py)
def test_transcribes_wav_flac_8k_44k_stereo_and_reports_a_bad_file(trained, tmp_path, capsys):
    soxr = pytest.importorskip("soxr")
    (flac, ref), (flac2, ref2) = _utterances(2)
    audio, rate = soundfile.read(flac, dtype="float32")
    files = {
        "flac": flac,
        "wav": str(tmp_path / "a.wav"),
        "8k": str(tmp_path / "a_8k.wav"),
        "44k_stereo": str(tmp_path / "b_44k_stereo.flac"),
        "bad": str(tmp_path / "bad.wav"),
        "stereo": str(tmp_path / "a_stereo.flac"),
        "8k_as_16k": str(tmp_path / "a_8k_as_16k.wav"),
    }
    soundfile.write(files["wav"], audio, rate, subtype="PCM_16")
    soundfile.write(files["8k"], soxr.resample(audio, rate, 8_000), 8_000, subtype="PCM_16")
    soundfile.write(files["8k_as_16k"], audio_lib.read(files["8k"], 16_000), 16_000, subtype="PCM_16")
    audio2, _ = soundfile.read(flac2, dtype="float32")
    up = soxr.resample(audio2, rate, 44_100)
    soundfile.write(files["44k_stereo"], np.stack([up, up], 1), 44_100, subtype="PCM_16")
    soundfile.write(files["stereo"], np.stack([audio, audio], 1), rate, subtype="PCM_16")
    with open(files["bad"], "wb") as f:
        f.write(os.urandom(2000))

    code = transcribe.main(["--workdir", trained.workdir, *files.values()])
    out, err = capsys.readouterr()
    assert code == 1
    lines = dict(line.split("\t") for line in out.strip().splitlines())
    assert list(lines) == [p for k, p in files.items() if k != "bad"]  # input order, bad one left out
    assert f"error: {files['bad']}:" in err and err.count("error:") == 1
    got = {k: lines[p] for k, p in files.items() if k != "bad"}
    assert got["wav"] == got["flac"] == got["stereo"]  # same samples, however stored
    assert _cer(ref, got["flac"]) < 0.3, got
    assert _cer(ref2, got["44k_stereo"]) < 0.3, got  # resampled back to 16 kHz
    # 8 kHz has no content above 4 kHz, which the model was trained on, so its words are not
    # checked; but it is transcribed as its samples resampled to 16 kHz, stored at 16 kHz.
    assert got["8k"] == got["8k_as_16k"]

    pytest.importorskip("flashlight.lib.text")
    code = transcribe.main(["--workdir", trained.workdir, "--lm", trained.lm, "--beam_width", "16", flac, flac2])
    out, _ = capsys.readouterr()
    beam = [line.split("\t")[1] for line in out.strip().splitlines()]
    assert code == 0 and len(beam) == 2
    assert _cer(ref, beam[0]) <= _cer(ref, got["flac"]) and _cer(ref2, beam[1]) < 0.3

    lexicon = tmp_path / "words.txt"  # the first utterance's words only: the second must be spelled from them
    lexicon.write_text("\n".join(sorted(set(ref.split()))) + "\n")
    code = transcribe.main(
        ["--workdir", trained.workdir, "--lm", trained.lm, "--lexicon", str(lexicon), "--beam_width", "16", flac2]
    )
    out, _ = capsys.readouterr()
    words = out.strip().split("\t")[1].split()
    assert code == 0 and words and set(words) <= set(ref.split()), (words, ref)
    assert set(beam[1].split()) - set(ref.split())  # without the lexicon it used other words


def test_missing_workdir_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        transcribe.main(["--workdir", str(tmp_path / "nowhere"), "a.wav"])


def test_missing_empty_and_undecodable_files_say_what_is_wrong(tmp_path):
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    junk = tmp_path / "junk.flac"
    junk.write_bytes(b"not audio at all" * 10)
    no_frames = str(tmp_path / "no_frames.wav")
    soundfile.write(no_frames, np.zeros(0, np.int16), 16_000)
    for path, reason in [
        (tmp_path / "missing.wav", "no such file"),
        (empty, "empty file (0 bytes)"),
        (junk, "not audio that libsndfile reads"),
        (no_frames, "no samples"),
    ]:
        with pytest.raises(errors.AudioError, match=reason.replace("(", "\\(").replace(")", "\\)")):
            audio_lib.read(str(path), 16_000)


def test_audio_below_16k_is_resampled_with_a_warning(tmp_path, caplog):
    pytest.importorskip("soxr")
    low = str(tmp_path / "8k.wav")
    soundfile.write(low, np.zeros(8000, np.int16), 8_000)
    with caplog.at_level("WARNING", logger="ds2_jax"):
        audio = audio_lib.read(low, 16_000)
    assert len(audio) == 16_000
    assert f"{low}: 8000 Hz audio resampled to 16000 Hz; the model was trained on 16000 Hz" in caplog.text
    caplog.clear()
    high = str(tmp_path / "44k.wav")
    soundfile.write(high, np.zeros(44_100, np.int16), 44_100)
    with caplog.at_level("WARNING", logger="ds2_jax"):
        audio_lib.read(high, 16_000)
    assert caplog.text == ""  # downsampling loses nothing the model uses


def test_a_long_file_is_read_block_by_block_like_in_one_piece(tmp_path, monkeypatch):
    """Past READ_BLOCK_SECONDS a file is read, downmixed and resampled a block at a time (memory:
    one block); the samples are those of the one-piece read (exact at 16 kHz)."""
    pytest.importorskip("soxr")
    rng = np.random.default_rng(0)
    audio = (rng.standard_normal((16_000 * 3, 2)) * 3000).astype(np.int16)
    wav16, wav44 = str(tmp_path / "16k.wav"), str(tmp_path / "44k.wav")
    soundfile.write(wav16, audio, 16_000)
    soundfile.write(wav44, np.repeat(audio, 3, axis=0)[: 44_100 * 3], 44_100)
    whole16, whole44 = audio_lib.read(wav16, 16_000), audio_lib.read(wav44, 16_000)
    monkeypatch.setattr(audio_lib, "READ_BLOCK_SECONDS", 0.25)
    np.testing.assert_array_equal(audio_lib.read(wav16, 16_000), whole16)
    tracemalloc.start()
    blocks44 = audio_lib.read(wav44, 16_000)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 44_100 * 3 * 2 * 4 / 2, peak  # under half the file as float32 channels
    assert abs(len(blocks44) - len(whole44)) <= 2
    n = min(len(blocks44), len(whole44))
    assert np.mean(np.abs(blocks44[:n].astype(float) - whole44[:n])) < 2  # int16 units, out of ~3000


def _transcribe_command(*args):
    import subprocess
    import sys

    from tests.helpers import ROOT

    return subprocess.run(
        [sys.executable, "-m", "ds2_jax.transcribe", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )


@pytest.mark.e2e
def test_its_messages_name_its_own_flags(tmp_path):
    """transcribe's flags are --lm and --lexicon, not the config's decoding.lm_path / lexicon_path;
    a text file given as --lm is not taken for a KenLM binary."""
    pytest.importorskip("flashlight.lib.text")
    from ds2_jax import settings, workdir_config
    from tests.helpers import ROOT

    workdir_config.save_config(settings.Settings(), str(tmp_path))  # the LM is checked before any checkpoint
    readme = os.path.join(ROOT, "README.md")
    proc = _transcribe_command(f"--workdir={tmp_path}", f"--lm={readme}", "a.wav")
    assert proc.returncode == 1 and proc.stderr.startswith(
        f"error: --lm={readme!r} is not a word LM: neither an ARPA file (it starts with \\data\\) nor a KenLM "
        "binary (build one with python -m ds2_jax.tools.build_lm)"
    ), proc.stderr
    proc = _transcribe_command(f"--workdir={tmp_path}", f"--lexicon={readme}", "a.wav")
    assert proc.returncode == 1 and proc.stderr.startswith(
        f"error: --lexicon={readme!r} is used with an LM only: set --lm"
    ), proc.stderr


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.xdist_group("trained")  # one worker trains it (conftest.py)
def test_beam_search_with_an_arpa_lm_prints_only_the_transcripts(trained):
    """KenLM's 'Loading the LM will be faster...' banner and its bar of stars do not reach the console."""
    pytest.importorskip("flashlight.lib.text")
    flac, _ = _utterances(1)[0]
    proc = _transcribe_command(f"--workdir={trained.workdir}", f"--lm={trained.lm}", flac)
    assert proc.returncode == 0 and proc.stdout.count("\n") == 1 and proc.stdout.startswith(f"{flac}\t"), proc.stderr
    assert "Loading the LM" not in proc.stderr and "****" not in proc.stderr and "----5---10" not in proc.stderr


# ----------------------------------------------------------------------------- a tool people pipe (issue 40)


@pytest.fixture(scope="module")
def untrained(tmp_path_factory) -> str:
    """A workdir holding the smoke model's initial state as checkpoint 0: texts are noise, the paths real."""
    import jax

    from ds2_jax import checkpoint, workdir_config
    from ds2_jax import state as state_lib
    from tests.helpers import tiny_settings

    w = str(tmp_path_factory.mktemp("untrained"))
    config = tiny_settings()
    bins = config.features.num_bins
    state = state_lib.create_state(config, jax.random.PRNGKey(0), np.zeros(bins, np.float32), np.ones(bins, np.float32))
    with checkpoint.managed(w) as mgr:
        checkpoint.save(mgr, 0, jax.device_get(state), wait=True)
    workdir_config.save_config(config, w)
    return w


@pytest.mark.parametrize(
    "flag", ["--alpha=nan", "--alpha=-1", "--beta=inf", "--batch_size=0", "--beam_width=-1", "--step=-1"]
)
def test_flags_are_checked_before_the_model_loads_as_a_usage_error(tmp_path, capsys, flag):
    with pytest.raises(SystemExit) as exited:  # the workdir does not even exist: nothing was read
        transcribe.main(["--workdir", str(tmp_path / "none"), flag, "a.wav"])
    assert exited.value.code == 2
    name, value = flag.split("=")
    err = capsys.readouterr().err
    assert (
        err.startswith(f"error: {name}=")
        and ": must be " in err
        and float(err.split("=")[1].split(":")[0]) == float(value)
        or value == "nan"
        and f"error: {name}=nan: must be" in err
    )


def test_a_short_clip_nan_samples_and_a_tab_in_a_path_each_get_their_own_line(untrained, tmp_path, capsys):
    """A 1 ms clip and a float WAV with NaN samples: one message each, the others transcribed; a path
    with a tab is escaped, so every output line splits at exactly one tab."""
    rate = 16_000
    files = {
        "ok": str(tmp_path / "ok.wav"),
        "short": str(tmp_path / "short.wav"),
        "nan": str(tmp_path / "nan.wav"),
        "tab": str(tmp_path / "a\tb.wav"),
    }
    tone = np.sin(np.arange(rate) / 10).astype(np.float32) * 0.3
    soundfile.write(files["ok"], tone, rate, subtype="PCM_16")
    soundfile.write(files["tab"], tone, rate, subtype="PCM_16")
    soundfile.write(files["short"], tone[: rate // 1000], rate, subtype="PCM_16")
    soundfile.write(
        files["nan"], np.where(np.arange(rate) % 100 == 0, np.nan, tone).astype(np.float32), rate, subtype="FLOAT"
    )
    code = transcribe.main(["--workdir", untrained, "--batch_size=2", *files.values()])
    out, err = capsys.readouterr()
    assert code == 1
    assert f"error: {files['short']}: too short: 1 ms gives the model no output frame" in err
    assert f"error: {files['nan']}: 160 samples are NaN or infinite" in err
    assert err.count("error:") == 2 and "Traceback" not in err
    lines = out.splitlines()
    assert [line.count("\t") for line in lines] == [1, 1]
    assert [line.split("\t")[0] for line in lines] == [files["ok"], str(tmp_path / "a\\tb.wav")]


def _run_transcribe(workdir, files, *flags):
    import subprocess
    import sys

    from tests import helpers

    return subprocess.Popen(
        [sys.executable, "-m", "ds2_jax.transcribe", f"--workdir={workdir}", *flags, *files],
        cwd=helpers.ROOT,
        env=helpers.repo_env(JAX_PLATFORMS="cpu"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_lines_come_as_they_are_done_a_closed_pipe_ends_quietly_and_ctrl_c_says_how_far(untrained, tmp_path):
    """`transcribe ... | head -1`: the first line comes before the last file is read, the closed pipe
    ends the run with no traceback; Ctrl-C keeps what was printed and prints one line, exit 130."""
    import signal

    wav = str(tmp_path / "a.wav")
    soundfile.write(wav, np.zeros(16_000, np.float32), 16_000, subtype="PCM_16")
    many = [wav] * 400  # far more than are done when the first line is read
    proc = _run_transcribe(untrained, many, "--batch_size=1")
    assert proc.stdout.readline().startswith(wav + "\t")  # printed before the other 399 are done
    proc.stdout.close()  # as `head -1` does
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err[-2000:]
    assert "Traceback" not in err and "BrokenPipe" not in err and "error:" not in err
    proc = _run_transcribe(untrained, many, "--batch_size=1")
    first = proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    done = 1 + len(out.splitlines())
    assert first.startswith(wav + "\t") and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("transcribe: interrupted after ")
    assert f"interrupted after {done} of 400 files" in err or f"interrupted after {done + 1} of 400 files" in err


def test_every_numeric_flag_at_zero_is_used_or_refused_never_taken_for_unset(untrained, tmp_path, capsys):
    """issue 40: `--alpha=0` was ignored by an `or` that took 0 for "not given". Each numeric flag of
    transcribe at 0: a value the run uses (the workdir's own is not), or a usage error."""
    import types

    from ds2_jax import cli

    base = settings.Decoding(beam_width=8, lm_path="lm.arpa", alpha=0.5, beta=1.0)
    flags = dict(lm="", lexicon="", beam_width=None, alpha=None, beta=None)
    for flag, field in (("alpha", "alpha"), ("beta", "beta"), ("beam_width", "beam_width")):
        cfg = transcribe.decoder_settings(types.SimpleNamespace(**{**flags, flag: 0}), base)
        assert getattr(cfg, field) == 0, flag
    assert transcribe.decoder_settings(types.SimpleNamespace(**flags), base) == base  # not given: the workdir's
    fv_args = ["--workdir", untrained]
    with pytest.raises(SystemExit) as exited:
        transcribe.main([*fv_args, "--batch_size=0", "a.wav"])
    assert exited.value.code == cli.USAGE_EXIT
    wav = str(tmp_path / "a.wav")
    soundfile.write(wav, np.zeros(16_000, np.float32), 16_000, subtype="PCM_16")
    capsys.readouterr()
    assert (
        transcribe.main([*fv_args, "--step=0", "--beam_width=0", "--alpha=0", "--beta=0", wav]) == 0
    )  # step 0 is a step
    assert capsys.readouterr().out.startswith(wav + "\t")


# ----------------------------------------------------------------------------- word timings (issue 41)


def _onset_seconds(audio: np.ndarray) -> float:
    """Where speech starts in a corpus utterance: its first sample at 2% of its peak, the onset
    make_corpus.speak trims to (0.1 s after it begins)."""
    return int(np.flatnonzero(np.abs(audio) > 0.02 * np.abs(audio).max())[0]) / 16_000


@pytest.mark.slow
@pytest.mark.xdist_group("trained")
def test_first_word_starts_within_one_output_frame_of_the_speech_onset(trained):
    """The held-out utterances, whose speech onset is known: each first word's start within one
    output frame (30 ms) of it; words in order, none past the audio. (Only first words have a
    known start here: silence put between words or utterances is unlike the demo's training
    data, and its 160-step model then emits phantom words.)"""
    paths = [p for p, _ in _utterances(39)][::3]
    waves = [audio_lib.read(p, 16_000) for p in paths]
    transcriber = jax_backend.JaxEngine(trained.workdir, settings.Decoding(beam_width=0))
    frame = transcriber.frame_seconds
    for wave, result in zip(waves, transcriber.transcribe_timed(waves)):
        text, timed = result
        assert timed and " ".join(w.word for w in timed) == text
        assert abs(timed[0].start - _onset_seconds(wave)) <= frame, (text, timed[0], _onset_seconds(wave))
        assert all(w.start < w.end <= n.start for w, n in zip(timed, timed[1:]))
        assert timed[-1].end <= len(wave) / 16_000 + frame


def test_a_pipe_such_as_dev_stdin_is_read_not_called_empty(tmp_path):
    """/dev/stdin, a FIFO, a process substitution: no size, no seeking; read whole, then decoded."""
    import os
    import threading

    wav = tmp_path / "a.wav"
    tone = (np.sin(np.arange(8000) / 5) * 8000).astype(np.int16)
    soundfile.write(str(wav), tone, 16_000)
    fifo = str(tmp_path / "pipe")
    for data, want in [(wav.read_bytes(), None), (b"", "no bytes came from it")]:
        os.mkfifo(fifo)
        writer = threading.Thread(target=_write_to_fifo, args=(fifo, data), daemon=True)
        writer.start()
        try:
            if want is None:
                np.testing.assert_array_equal(audio_lib.read(fifo, 16_000), tone)
            else:
                with pytest.raises(errors.AudioError, match=want):
                    audio_lib.read(fifo, 16_000)
        finally:
            if writer.is_alive():  # nothing read the pipe: open it once so that the writer's open returns
                os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
            writer.join(timeout=10)
            os.remove(fifo)


def _write_to_fifo(path: str, data: bytes) -> None:
    try:
        with open(path, "wb") as f:
            f.write(data)
    except BrokenPipeError:  # the reader (a wrong load_audio) never read it
        pass
