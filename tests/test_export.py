"""python -m ds2_jax.export and transcribe --model: the ONNX model gives the JAX path's
log-probabilities (to LOG_PROB_TOLERANCE) and greedy texts, its runner imports no jax, and bad
input gets one error line; benchmarks.export_rtf times both engines, greedy and beam + LM."""

import os
import subprocess
import sys

import numpy as np
import pytest

from ds2_jax import audio as audio_lib
from ds2_jax import export
from ds2_jax.infer import jax_backend, onnx_backend, onnx_model
from tests.helpers import CORPUS, ROOT, repo_env

pytest.importorskip("jax2onnx")  # the export extra, part of the test extra

TEST_CLEAN = os.path.join(CORPUS, "LibriSpeech", "test-clean")
# The same float32 sums in another order (onnxruntime's kernels, numpy's FFT): measured max
# |difference| 2.2e-5 (demo model, 39 held-out utterances) and 3.6e-5 (a random-init smoke model).
LOG_PROB_TOLERANCE = 2e-4


def _flacs(n: int | None = None) -> list[str]:
    paths = sorted(
        os.path.join(root, f) for root, _, files in os.walk(TEST_CLEAN) for f in files if f.endswith(".flac")
    )
    return paths[:n]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[str, str]:
    """(workdir, exported model) of the smoke model's initial state saved as checkpoint 0 (feature
    statistics that are not the identity: the export must carry them)."""
    from tests.helpers import random_model_workdir

    root = tmp_path_factory.mktemp("export")
    workdir, out = random_model_workdir(str(root / "w"), key=0), str(root / "model.onnx")
    assert export.main(["--workdir", workdir, "--out", out]) == 0
    return workdir, out


def _batch(paths: list[str]) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """(waveforms, <int16>[B, S] zero-padded, <int32>[B] lengths) of the files."""
    waves = [audio_lib.read(p, 16_000) for p in paths]
    audio = np.zeros((len(waves), max(map(len, waves))), np.int16)
    for i, w in enumerate(waves):
        audio[i, : len(w)] = w
    return waves, audio, np.array([len(w) for w in waves], np.int32)


def _both_paths(workdir: str, model: str, paths: list[str]):
    """(JAX log-probs, ONNX log-probs, JAX greedy texts, ONNX greedy texts) of the files."""
    from ds2_jax import settings

    beam = settings.Decoding(beam_width=0)
    jax_t = jax_backend.JaxEngine(workdir, beam, batch_size=4)
    onnx_t = onnx_backend.OnnxEngine(model, beam, batch_size=4)
    waves, audio, lengths = _batch(paths)
    import jax

    from ds2_jax import forward, state

    kw = state.step_kwargs(jax_t.config)
    ref = jax.jit(
        lambda a, n: forward.infer(
            jax_t.state, a, n, model_cfg=kw["model_cfg"], feature_cfg=kw["feature_cfg"], log_probs=True
        )
    )(audio, lengths)
    got = onnx_t.model.decoder_inputs(audio, lengths)
    np.testing.assert_array_equal(got["lengths"], np.asarray(ref["lengths"]))
    return np.asarray(ref["log_probs"]), got["log_probs"], jax_t.transcribe(waves), onnx_t.transcribe(waves)


def test_onnx_log_probs_and_greedy_texts_match_the_jax_path(smoke):
    ref, got, jax_texts, onnx_texts = _both_paths(*smoke, _flacs(6))
    assert ref.shape == got.shape and ref.shape[0] == 6
    assert np.abs(ref - got).max() < LOG_PROB_TOLERANCE
    assert onnx_texts == jax_texts and any(jax_texts)


@pytest.mark.slow
def test_the_stablehlo_artifact_is_the_whole_model_featurizer_included(smoke):
    """model.stablehlo (jax.export) maps audio to the JAX path's log-probs, any batch and length."""
    import jax

    from ds2_jax import forward, state

    workdir, model = smoke
    exported = jax.export.deserialize(open(export.stablehlo_path(model), "rb").read())
    ref = jax_backend.JaxEngine(workdir)
    kw = state.step_kwargs(ref.config)
    for paths in (_flacs(3), _flacs(1)):
        _, audio, lengths = _batch(paths)
        got_log_probs, got_lengths = exported.call(audio, lengths)
        want = forward.infer(
            ref.state, audio, lengths, model_cfg=kw["model_cfg"], feature_cfg=kw["feature_cfg"], log_probs=True
        )
        np.testing.assert_array_equal(np.asarray(got_lengths), np.asarray(want["lengths"]))
        assert np.abs(np.asarray(got_log_probs) - np.asarray(want["log_probs"])).max() < 1e-5


def test_numpy_spectrogram_is_the_featurizers():
    from ds2_jax import features, settings

    fc = settings.Spectrogram()
    audio = (np.random.default_rng(1).normal(0, 3000, (2, 8000))).astype(np.int16)
    audio[1, 4000:] = 0  # digital silence: log(eps) in both
    meta = onnx_model.MetaData.of({**export.metadata(settings.Settings(), 0)}, "x.onnx")
    np.testing.assert_allclose(
        onnx_model.log_spectrogram(audio, meta), np.asarray(features.log_spectrogram(audio, fc)), atol=2e-4
    )
    assert list(onnx_model.num_frames([319, 320, 480, 8000], meta)) == [0, 1, 2, 49]


def test_transcribe_model_runs_without_jax(smoke):
    """`import jax` fails in the subprocess: the --model path never needs it; its lines are the JAX path's."""
    workdir, model = smoke
    files = _flacs(2)
    code = (
        "import runpy, sys; sys.modules['jax'] = None; sys.argv = ['transcribe', *sys.argv[1:]]; "
        "runpy.run_module('ds2_jax.transcribe', run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, f"--model={model}", *files],
        cwd=ROOT,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    with_jax = subprocess.run(
        [sys.executable, "-m", "ds2_jax.transcribe", f"--workdir={workdir}", *files],
        cwd=ROOT,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.stdout == with_jax.stdout and proc.stdout.count("\n") == 2


def _error_line(module: str, *args: str) -> str:
    """The stderr of `python -m module *args`, checked to be one error line (exit 1) and returned."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, env=repo_env(), capture_output=True, text=True, timeout=300
    )
    err = proc.stderr.strip()
    assert proc.returncode == 1 and err.startswith("error: ") and "\n" not in err, err
    return err


@pytest.mark.slow
def test_bad_input_gets_one_error_line_each(smoke, tmp_path):
    workdir, model = smoke
    from ds2_jax import workdir_config
    from tests.helpers import tiny_settings

    empty = str(tmp_path / "empty")
    workdir_config.save_config(tiny_settings(), empty)
    err = _error_line("ds2_jax.export", f"--workdir={empty}", f"--out={tmp_path / 'a.onnx'}")
    assert "no checkpoint" in err and not os.path.exists(tmp_path / "a.onnx")
    err = _error_line("ds2_jax.export", f"--workdir={workdir}", "--step=7", f"--out={tmp_path / 'b.onnx'}")
    assert "no checkpoint at step 7" in err and "[0]" in err

    import onnx

    proto = onnx.load(model)
    del proto.metadata_props[:]
    foreign = str(tmp_path / "foreign.onnx")
    onnx.save(proto, foreign)
    flac = _flacs(1)[0]
    err = _error_line("ds2_jax.transcribe", f"--model={foreign}", flac)
    assert "not a ds2_jax export" in err and "ds2_jax.format" in err
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a protobuf" * 10)
    assert "not an ONNX model" in _error_line("ds2_jax.transcribe", f"--model={junk}", flac)


@pytest.mark.xdist_group("trained")
@pytest.mark.slow
def test_the_demo_model_exported_gives_its_texts_on_the_held_out_speakers(trained, tmp_path):
    out = str(tmp_path / "demo.onnx")
    assert export.main(["--workdir", trained.workdir, "--out", out]) == 0
    ref, got, jax_texts, onnx_texts = _both_paths(trained.workdir, out, _flacs())
    assert np.abs(ref - got).max() < LOG_PROB_TOLERANCE
    assert onnx_texts == jax_texts


def test_the_readmes_python_runs_without_jax_and_prints_what_transcribe_prints(smoke):
    """README's "Use a trained model" code block, with this export and a corpus file put in, run with
    `import jax` failing: its text and word times are `transcribe --model --timestamps`'s."""
    _, model = smoke
    (flac,) = _flacs(1)
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert '"model.onnx"' in block and '"a.flac"' in block
    code = "import sys; sys.modules['jax'] = None\n" + block.replace('"model.onnx"', repr(model)).replace(
        '"a.flac"', repr(flac)
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=repo_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    cli = subprocess.run(
        [sys.executable, "-m", "ds2_jax.transcribe", f"--model={model}", "--timestamps", flac],
        cwd=ROOT,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    head, *words = cli.stdout.splitlines()
    assert proc.stdout.splitlines() == [head.split("\t", 1)[1], *(" ".join(w.split("\t")[1:]) for w in words)]


def test_an_export_that_cannot_measure_the_delay_says_so_and_never_writes_0(smoke, capsys):
    """The smoke export had no --delay_audio and no recorded delay: its metadata says 'unmeasured'
    (read back as None), export says why, and transcribe --model --timestamps warns that its word
    times are uncorrected."""
    import jax

    from ds2_jax import state, transcribe, workdir_config

    workdir, model = smoke
    assert onnx_model.OnnxModel(model).meta.emission_delay_s is None
    config = workdir_config.load_config(workdir)
    restored, step = state.restore_state(config, workdir, None)
    delay, why = export.emission_delay(workdir, config, jax.device_get(restored), step, [])
    assert delay is None and "--delay_audio" in why
    capsys.readouterr()
    assert transcribe.main(["--model", model, "--timestamps", _flacs(1)[0]]) == 0
    assert "uncorrected" in capsys.readouterr().err


def test_export_rtf_times_the_four_paths_as_transcribe_runs_them(smoke, tmp_path):
    """benchmarks.export_rtf: a row per path (JAX and ONNX, greedy and beam + LM) whose RTFx is the
    audio seconds (a file named twice counted twice) over the median of --repeats passes, the warm-up
    apart; each row's texts those of an engine with its decoder; the devices named; the table written."""
    pytest.importorskip("flashlight.lib.text")
    import json
    import statistics

    import jax

    from benchmarks import export_rtf
    from ds2_jax import settings
    from ds2_jax.tools import build_lm

    workdir, model = smoke
    lm = str(tmp_path / "lm.arpa")
    assert build_lm.main(["--manual_dir", CORPUS, "--splits", "train-clean-100", "--order", "2", "--out", lm]) == 0
    files = [*_flacs(3), _flacs(1)[0]]
    out = tmp_path / "out"
    flags = [f"--workdir={workdir}", "--beam_width=4", "--batch_size=2", "--repeats=2", f"--out={out}"]
    assert export_rtf.main([*flags, f"--model={model}", f"--lm={lm}", *files]) == 0
    result = json.loads((out / "results.json").read_text())
    waves = [audio_lib.read(f, 16_000) for f in files]
    audio_s = sum(map(len, waves)) / 16_000
    assert result["audio_seconds"] == pytest.approx(audio_s) and (result["files"], result["distinct_files"]) == (4, 3)
    rows = {r["path"]: r for r in result["rows"]}
    assert list(rows) == ["read", *export_rtf.PATHS] and not result["left_out"]
    table = (out / "results.md").read_text()
    for r in rows.values():
        assert len(r["pass_s"]) == 2 and r["median_s"] == statistics.median(r["pass_s"]) and r["first_pass_s"] > 0
        assert r["rtfx"] == pytest.approx(audio_s / r["median_s"])
        assert f"| {r['path']} |" in table and f"| {r['rtfx']:.1f} |" in table
    beam = settings.Decoding(beam_width=4, lm_path=lm)
    for path in export_rtf.PATHS:
        assert rows[path]["decoder"] == (
            "greedy" if "greedy" in path else {"beam_width": 4, "alpha": 0.5, "beta": 1.0, "lm": lm}
        )
    want = {
        "onnx_greedy": onnx_backend.OnnxEngine(model, settings.Decoding(beam_width=0)).transcribe(waves),
        "onnx_beam_lm": onnx_backend.OnnxEngine(model, beam).transcribe(waves),
    }
    assert want["onnx_greedy"] != want["onnx_beam_lm"]  # so that a row decoded the other way is seen
    assert {k: result["texts"][k] for k in want} == want
    assert result["same_texts"]["greedy"] == "4/4" and result["texts"]["jax_greedy"] == want["onnx_greedy"]
    host = result["host"]
    assert host["jax_device"] == jax.devices()[0].device_kind and rows["jax_greedy"]["runs_on"].startswith(
        jax.default_backend()
    )
    assert host["cpu_model"] and host["onnx_threads"] == export_rtf.usable_cpus() and host["cpu_model"] in table

    assert export_rtf.main([*flags, "--repeats=1", *files[:1]]) == 0  # no --model, no --lm: the JAX greedy row
    result = json.loads((out / "results.json").read_text())
    assert [r["path"] for r in result["rows"]] == ["read", "jax_greedy"] and len(result["left_out"]) == 2
