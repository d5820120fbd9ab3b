"""The inference wing (ds2_jax.infer) and the one audio loader (ds2_jax.audio): the wall that keeps
the wing off the training side, the loader's numerics shared with the dataset build, and streaming
through an exported model."""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile

from ds2_jax import audio as audio_lib
from ds2_jax.datasets import audio as dataset_audio
from ds2_jax.infer import load
from tests.helpers import CORPUS, ROOT, repo_env

FLAC = os.path.join(CORPUS, "LibriSpeech", "test-clean", "118", "1180", "118-1180-0001.flac")
WING = os.path.join(ROOT, "ds2_jax", "infer")
# What the wing (and the loader under it) must never import: the training side.
FORBIDDEN = (
    "ds2_jax.pipeline",
    "ds2_jax.input_pipeline",
    "ds2_jax.datasets",
    "ds2_jax.train",
    "ds2_jax.evaluation",
    "ds2_jax.timing",
    "ds2_jax.finetune",
    "tensorflow_datasets",
    "tensorflow",
    "grain",
)


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def _imports(path: str, package: str) -> set[str]:
    """Every module a file imports, at any depth (function-level imports too), relative ones resolved."""
    names = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def test_the_wing_never_imports_the_training_side_at_any_depth():
    """An AST walk of the wing and of every ds2_jax module it reaches (lazy imports inside functions
    count: a serve process must not load the input pipeline on a code path rarely taken)."""
    seen, todo, bad = set(), [f"ds2_jax.infer.{f[:-3]}" for f in os.listdir(WING) if f.endswith(".py")], []
    todo += ["ds2_jax.infer", "ds2_jax.audio", "ds2_jax.serve"]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        base = os.path.join(ROOT, *module.split("."))
        path = os.path.join(base, "__init__.py") if os.path.isdir(base) else base + ".py"
        if not os.path.exists(path):
            continue  # a name imported from a module (ds2_jax.settings.Decoding), or a third-party one
        package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
        for name in _imports(path, package):
            if _forbidden(name):
                bad.append(f"{module} imports {name}")
            elif name.startswith("ds2_jax"):
                todo.append(name)
    assert not bad, bad
    assert "ds2_jax.infer.jax_backend" in seen and "ds2_jax.state" in seen  # the walk did reach down


@pytest.mark.slow
def test_importing_and_running_the_wing_loads_nothing_of_the_training_side(tmp_path):
    """The same wall at run time: a subprocess imports every module of the wing and runs the engine
    of a (random) workdir; sys.modules then holds none of the training side."""
    code = (
        "import sys, jax, numpy as np\n"
        "from ds2_jax import audio, checkpoint, workdir_config, state as S\n"
        "from tests.helpers import tiny_settings\n"
        "import ds2_jax.infer.load as infer, ds2_jax.infer.engine, ds2_jax.infer.jax_backend\n"
        "import ds2_jax.infer.onnx_backend, ds2_jax.infer.streaming, ds2_jax.infer.delay, ds2_jax.infer.onnx_model\n"
        "c = tiny_settings(**{'model.bidirectional': False})\n"
        "b = c.features.num_bins\n"
        "st = S.create_state(c, jax.random.PRNGKey(0), np.zeros(b, np.float32), np.ones(b, np.float32))\n"
        "w = sys.argv[1]\n"
        "with checkpoint.managed(w) as m: checkpoint.save(m, 0, jax.device_get(st), wait=True)\n"
        "workdir_config.save_config(c, w)\n"
        f"a = audio.read({FLAC!r}, 16000)\n"
        "e = infer.open_engine(workdir=w)\n"
        "e.transcribe([a]); u = e.stream(); u.feed(a[:8000]); u.finish()\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "w")],
        cwd=ROOT,
        env=repo_env(JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = proc.stdout.split()
    assert "ds2_jax.infer.jax_backend" in loaded and "ds2_jax.infer.streaming" in loaded
    assert [m for m in loaded if _forbidden(m)] == []


def _write(path, data, rate, subtype):
    soundfile.write(path, data, rate, subtype=subtype)
    return str(path)


@pytest.mark.parametrize(
    "subtype, rate, channels",
    [("PCM_16", 16_000, 1), ("PCM_16", 44_100, 2), ("FLOAT", 16_000, 1), ("PCM_24", 8_000, 1), ("FLAC", 16_000, 2)],
)
def test_the_build_and_the_server_read_the_same_samples(tmp_path, subtype, rate, channels):
    """One loader: the dataset build (datasets.audio.load), a path and the bytes of an upload give
    the same int16 samples; a float WAV is scaled (not clipped to -1, 0, 1)."""
    clean, _ = soundfile.read(FLAC, dtype="float32")
    data = np.stack([clean * (0.5 + 0.5 * c) for c in range(channels)], 1)[: rate * 2]
    name = "a.flac" if subtype == "FLAC" else "a.wav"
    path = _write(tmp_path / name, data, rate, "PCM_16" if subtype == "FLAC" else subtype)
    got = audio_lib.read(path, 16_000)
    np.testing.assert_array_equal(dataset_audio.load(path, 16_000).samples, got)
    np.testing.assert_array_equal(audio_lib.read(open(path, "rb").read(), 16_000), got)
    np.testing.assert_array_equal(audio_lib.read(io.BytesIO(open(path, "rb").read()), 16_000), got)
    assert abs(len(got) - 2 * 16_000 * min(len(data), rate * 2) // (rate * 2)) <= 2
    assert np.abs(got.astype(np.float32)).max() > 1000  # scaled to int16, not a few LSBs


def test_bad_audio_is_a_reason_not_a_crash(tmp_path):
    good = _write(tmp_path / "good.wav", np.zeros(16_000, np.int16), 16_000, "PCM_16")
    raw = open(good, "rb").read()
    cases = {
        b"": "empty_audio",
        b"\x00garbage bytes, not audio" * 10: "corrupt_audio",
        raw[:30]: "corrupt_audio",  # the header cut short
        raw[: len(raw) // 2]: "truncated_audio",  # an upload cut off halfway
    }
    for data, reason in cases.items():
        with pytest.raises(audio_lib.Unreadable) as e:
            audio_lib.read(data, 16_000)
        assert e.value.reason == reason, (data[:20], e.value)
    nan = _write(tmp_path / "nan.wav", np.array([0.1, np.nan, 0.2] * 400, np.float32), 16_000, "FLOAT")
    assert dataset_audio.load(nan, 16_000).reason == "corrupt_audio"
    assert dataset_audio.load(str(tmp_path / "none.wav"), 16_000).reason == "missing_audio"
    stereo = _write(tmp_path / "st.wav", np.zeros((100, 2), np.int16), 16_000, "PCM_16")
    assert dataset_audio.load(stereo, 16_000, "skip").reason == "not_mono"


def test_open_engine_takes_one_model_and_names_a_missing_file(tmp_path):
    for kwargs in ({}, {"model": "m.onnx", "workdir": "w"}):
        with pytest.raises(ValueError, match="give one of model"):
            load.open_engine(**kwargs)
    with pytest.raises(FileNotFoundError, match="nowhere.onnx"):
        load.open_engine(model=str(tmp_path / "nowhere.onnx"))
