"""Your own speech (datasets.manifest): Common Voice and NeMo layouts of the bundled Spanish corpus
build to the same examples, the alphabet is derived and stored, every bad input is a counted
skip or one `error:` line naming the file and line, and a model trains, evaluates and
transcribes on it end to end."""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import unicodedata

import numpy as np
import pytest
import soundfile

from ds2_jax import settings, text
from ds2_jax.datasets import audio, build, manifest, shards
from tests.helpers import ROOT, launch, quick_compile_env, repo_env

CV = os.path.join(ROOT, "corpora", "tiny_es", "common_voice")
NEMO = os.path.join(ROOT, "corpora", "tiny_es", "nemo")
SPLITS = ("dev", "test", "train")


def options(**dataset) -> manifest.Options:
    """The build options of dataset.* keys (dataset.name='manifest'), as a run makes them."""
    changes = {
        "dataset.name": "manifest",
        "dataset.manual_dir": "x",
        "dataset.train_splits": "train",
        **{f"dataset.{k}": v for k, v in dataset.items() if k != "sample_rate"},
    }
    if "sample_rate" in dataset:
        changes["features.sample_rate"] = dataset["sample_rate"]
    config = settings.override(settings.Settings(), changes)
    return manifest.Options.of(config.dataset, config.features.spectrogram)


def examples(builder, split: str) -> dict[str, dict]:
    ds = builder.as_data_source(split)
    return {ex["id"].decode(): ex for ex in (ds[i] for i in range(len(ds)))}


def report_of(builder, split: str) -> dict:
    with open(manifest.report_path(os.fspath(builder.data_dir), split)) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """The Common Voice folder built inline, the NeMo folder on 2 worker processes."""
    root = tmp_path_factory.mktemp("es")
    cv = build.build(CV, str(root / "cv"), "manifest", options(build_workers=0))
    nemo = build.build(NEMO, str(root / "nemo"), "manifest", options(build_workers=2))
    return cv, nemo


# ----------------------------------------------------------------------------- layouts


def test_both_layouts_build_to_the_same_examples(both):
    """MP3 at 48 kHz (Common Voice, capitals and ¿?¡!) and 8 kHz mu-law WAV (NeMo, lower case):
    the same ids, texts and lengths at 16 kHz, the same waveform up to the codecs."""
    cv, nemo = both
    assert sorted(cv.info.splits) == sorted(nemo.info.splits) == list(SPLITS)
    for split in SPLITS:
        a, b = examples(cv, split), examples(nemo, split)
        assert len(a) == {"train": 80, "dev": 20, "test": 20}[split]
        assert a.keys() == b.keys()
        for key in a:
            assert a[key]["text"] == b[key]["text"]
            assert abs(int(a[key]["num_samples"]) - int(b[key]["num_samples"])) <= 2
            x, y = a[key]["audio"].astype(np.float64), b[key]["audio"].astype(np.float64)
            n = min(len(x), len(y))
            assert np.corrcoef(x[:n], y[:n])[0, 1] > 0.8, key  # 4 kHz of bandwidth less, mu-law
        assert report_of(cv, split)["kept"] == report_of(nemo, split)["kept"] == len(a)
    with open(os.path.join(CV, "train.tsv"), encoding="utf-8") as f:
        first = f.read().splitlines()[1].split("\t")
    got = examples(cv, "train")["clips/" + first[1][: -len(".mp3")]]
    assert got["text"].decode() == text.normalize(first[3]) != first[3]  # normalized: capitals, '.', '¿' gone


def shard_files(builder, split: str) -> list[bytes]:
    """The bytes of a prepared split's array_record files, in shard order."""
    folder = os.fspath(builder.data_dir)
    paths = sorted(p for p in os.listdir(folder) if p.startswith(f"manifest-{split}.array_record-"))
    return [open(os.path.join(folder, p), "rb").read() for p in paths]


def test_one_and_two_processes_write_the_same_shards_in_tfds_order(both, tmp_path):
    """The NeMo folder built inline and on 2 workers: byte-identical shard files (5 for train's 80
    utterances), the examples in tfds's own order (md5 of the id salted with the split name)."""
    _, on_two = both
    inline = build.build(NEMO, str(tmp_path), "manifest", options(build_workers=0))
    for split in SPLITS:
        assert shard_files(inline, split) == shard_files(on_two, split)
    assert len(shard_files(inline, "train")) == 5
    ds = inline.as_data_source("train")
    ids = [ds[i]["id"].decode() for i in range(len(ds))]
    assert ids == sorted(ids, key=lambda k: int(hashlib.md5(b"train" + k.encode()).hexdigest(), 16))


def test_a_workers_records_are_tfds_own_serialization():
    """shards.example_bytes builds the proto directly: the example tfds's serializer makes of the same
    utterance (for manifest.features()), byte for byte, and decodes back to it."""
    from tensorflow_datasets.core import example_serializer

    features = manifest.features()
    serializer = example_serializer.ExampleSerializer(features.get_serialized_info())
    for wav, speaker in ((np.arange(-200, 100_000, 7).astype(np.int16), ""), (np.zeros(1, np.int16), "s" * 300)):
        example = {"audio": wav, "text": "¿qué? ñu", "id": "clips/a", "speaker": speaker, "num_samples": len(wav)}
        want = serializer.get_tf_example(features.encode_example(example)).SerializeToString(deterministic=True)
        assert shards.example_bytes(wav, "¿qué? ñu", "clips/a", speaker) == want
    wav = np.array([0, 1, -1, 32767, -32768, 12345], np.int16)
    ours = shards.example_bytes(wav, "¿qué? ñu", "clips/a", "s1")
    back = features.deserialize_example_np(ours)
    np.testing.assert_array_equal(back["audio"], wav)
    assert back["text"].decode() == "¿qué? ñu" and back["num_samples"] == 6


def test_a_file_whose_work_raises_in_a_worker_is_a_counted_skip(tmp_path):
    """write_shard: an utterance whose labels cannot be encoded (a job out of step with its alphabet)
    is a 'failed' skip naming the error; the shard goes on and holds the next one."""
    from array_record.python import array_record_module

    path = str(tmp_path / "s.tmp")
    job = shards.ShardJob(
        "train",
        0,
        path,
        ((0, "a", clip(), "el gato", ""), (1, "b", clip(), "el", "")),
        " el",
        16_000,
        "downmix",
        320,
        160,
    )
    got = shards.write_shard(job)
    assert isinstance(got[0], audio.Skip) and got[0].reason == "failed" and "'g'" in got[0].detail
    assert got[1] == shards.Kept(len(audio.load(clip(), 16_000).samples), 0)
    assert array_record_module.ArrayRecordReader(path).num_records() == 1


def test_a_dead_build_worker_is_one_error_line(tmp_path):
    """A worker killed mid-shard (as the out-of-memory killer would): one `error:` line naming the signal,
    the shard and the way out; nothing prepared."""
    d = tmp_path / "manual"
    (d / "clips").mkdir(parents=True)
    wav, rate = soundfile.read(clip(), dtype="int16")
    soundfile.write(str(d / "long.wav"), np.tile(wav, 40), rate)  # ~1 min at 8 kHz: a shard takes a while
    for i in range(120):
        os.symlink(d / "long.wav", d / "clips" / f"u{i}.wav")
    (d / "train.tsv").write_text("path\tsentence\n" + "".join(f"u{i}.wav\thola\n" for i in range(120)))
    data_dir = tmp_path / "tfds"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ds2_jax.datasets.build",
            "--config.dataset.name=manifest",
            "--config.dataset.train_splits=train",
            f"--config.dataset.manual_dir={d}",
            f"--config.dataset.data_dir={data_dir}",
            "--config.dataset.build_workers=2",
            "--config.dataset.alphabet_min_count=1",
        ],
        cwd=ROOT,
        env=repo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    killed = None
    while killed is None and proc.poll() is None:
        if not any(data_dir.rglob("*.shard*.tmp")):  # no worker has begun a shard yet
            continue
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    worker = b"spawn_main" in f.read()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == proc.pid and worker:
                os.kill(int(pid), signal.SIGKILL)
                killed = pid
                break
    _, err = proc.communicate(timeout=300)
    line = one_error_line(subprocess.CompletedProcess(proc.args, proc.returncode, "", err))
    # how the killed worker died, not how the broken pool then ended the other (SIGTERM)
    assert killed and "a dataset build worker process died (killed by SIGKILL) while" in line, err
    assert "shard " in line and "dataset.build_workers=0" in line
    assert not build.get_builder(str(data_dir), "manifest").is_prepared()


def test_the_alphabet_is_derived_from_the_train_split_and_stored(both):
    cv, _ = both
    with open(os.path.join(CV, "train.tsv"), encoding="utf-8") as f:
        sentences = [line.split("\t")[3] for line in f.read().splitlines()[1:]]
    want = set("".join(text.normalize(s) for s in sentences))
    stored = manifest.read_alphabet(os.fspath(cv.data_dir))
    assert set(stored.symbols) == want and stored.symbols[0] == " "
    assert {"ñ", "á", "ó"} <= want and not want & set("¿?¡!.,ABCDEFGHIJKLMNOPQRSTUVWXYZ'")
    for ex in examples(cv, "dev").values():  # dev and test are spelled in it
        assert stored.decode(stored.encode(ex["text"].decode())) == ex["text"].decode()


def test_the_nemo_folder_builds_for_an_8_khz_model(tmp_path):
    """Window and hop stay in ms: 8 kHz audio of 160-sample windows, 81 bins."""
    builder = build.build(
        NEMO,
        str(tmp_path),
        "manifest",
        options(sample_rate=8000, manifest_splits="dev", train_splits="dev", alphabet_min_count=1),
    )
    spec = settings.Spectrogram(sample_rate=8000)
    assert (spec.window, spec.hop, spec.num_bins) == (160, 80, 81)
    got = examples(builder, "dev")
    with open(os.path.join(NEMO, "dev.json"), encoding="utf-8") as f:
        first = json.loads(f.readline())["audio_filepath"]
    wav, rate = soundfile.read(os.path.join(NEMO, first), dtype="int16")
    assert rate == 8000
    np.testing.assert_array_equal(got[first[: -len(".wav")]]["audio"], wav)  # no resampling at its rate
    assert report_of(builder, "dev")["sample_rate"] == 8000


# ----------------------------------------------------------------------------- text


def test_normalize_is_unicode_aware_and_settable():
    decomposed = unicodedata.normalize("NFD", "¿Dónde ESTÁ el Niño?")
    assert decomposed != "¿Dónde ESTÁ el Niño?"
    assert text.normalize(decomposed) == "dónde está el niño"  # NFC: one code point per letter
    assert text.normalize(decomposed, lower_case=False) == "Dónde ESTÁ el Niño"  # NFC without case folding too
    assert text.normalize("¡Hola, señor!  ¿Qué\tpasa?") == "hola señor qué pasa"
    assert text.normalize("L’homme — don't") == "l'homme don't"  # apostrophes kept, typographic ones mapped
    assert text.normalize("¿Dónde?", lower_case=False) == "Dónde"
    assert text.normalize("¿Dónde?", strip_punctuation=False) == "¿dónde?"
    assert text.normalize("HELLO WORLD", strip_punctuation=False) == "hello world"  # LibriSpeech's, as before


def test_a_vocabulary_file_reads_space_names_comments_and_names_a_bad_line(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("# Mozilla's alphabet.txt style\n \na\n\\#\nñ\n\n", encoding="utf-8")
    assert text.read_vocabulary(str(path)).symbols == " a#ñ"
    path.write_text("<space>\nb\nab\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab.txt:3: 'ab' is not one character"):
        text.read_vocabulary(str(path))
    path.write_text("|\nb\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab.txt:3: 'b' is listed twice"):
        text.read_vocabulary(str(path))
    alphabet = text.Alphabet(" añ")
    path.write_text(alphabet.to_lines(), encoding="utf-8")
    assert text.read_vocabulary(str(path)) == alphabet
    assert text.LIBRISPEECH.vocab_size == 29 and text.LIBRISPEECH.setting == ""


# ----------------------------------------------------------------------------- bad inputs


def clip(name: str = "common_voice_es_101") -> str:
    return os.path.join(NEMO, "clips", name + ".wav")


@pytest.fixture()
def bad_dir(tmp_path):
    """A folder of manifests with a few good WAVs and every kind of bad line."""
    d = tmp_path / "manual"
    (d / "clips").mkdir(parents=True)
    for i in range(101, 105):
        shutil.copy(clip(f"common_voice_es_{i}"), d / "clips" / f"u{i}.wav")
    (d / "clips" / "broken.wav").write_bytes(b"RIFF\x00\x00not really a wav file" * 10)
    stereo, rate = soundfile.read(clip("common_voice_es_105"), dtype="int16")
    soundfile.write(str(d / "clips" / "stereo.wav"), np.stack([stereo, stereo], 1), rate)
    lines = [
        json.dumps({"audio_filepath": "clips/u101.wav", "duration": 1.0, "text": "el perro"}),
        "",  # a blank line: no utterance
        '{"audio_filepath": "clips/u102.wav", "text": ',  # line 3: not JSON
        json.dumps({"audio_filepath": "clips/nowhere.wav", "text": "el gato"}),  # 4: missing audio
        json.dumps({"audio_filepath": "clips/u101.wav", "text": "otra vez"}),  # 5: duplicated id
        json.dumps({"audio_filepath": "clips/broken.wav", "text": "el gato"}),  # 6: corrupt
        json.dumps({"audio_filepath": "clips/u102.wav", "text": "straße"}),  # 7: ß, ' ' outside a fixed vocabulary
        json.dumps({"audio_filepath": "clips/u103.wav", "text": "¿?"}),  # 8: nothing left after normalizing
        json.dumps({"audio_filepath": "clips/stereo.wav", "text": "el niño"}),  # 9: two channels
        json.dumps({"text": "sin audio"}),  # 10: no audio path
        json.dumps(["a", "list"]),  # 11: not an object
        json.dumps({"audio_filepath": "clips/u104.wav", "text": "la casa"}),  # 12: good
    ]
    (d / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def test_every_bad_line_is_a_counted_skip_naming_its_file_and_line(bad_dir, tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(c + "\n" for c in "abcdefghijlmnopqrstuvxyzñ") + "<space>\n", encoding="utf-8")
    builder = build.build(str(bad_dir), str(tmp_path / "tfds"), "manifest", options(vocabulary=str(vocab)))
    report = report_of(builder, "train")
    assert report["kept"] == 3  # u101, stereo (downmixed), u104
    assert {r: n for r, n in report["skipped"].items() if n} == {
        "bad_line": 3,
        "missing_audio": 1,
        "duplicate_id": 1,
        "corrupt_audio": 1,
        "unknown_chars": 1,
        "empty_transcript": 1,
    }
    where = str(bad_dir / "train.jsonl")
    assert report["examples"]["bad_line"][0].startswith(f"{where}:3: not JSON")
    assert report["examples"]["missing_audio"][0].startswith(f"{where}:4: ")
    assert report["examples"]["duplicate_id"] == [f"{where}:5: clips/u101 (first on line 1)"]
    assert report["examples"]["corrupt_audio"][0].startswith(f"{where}:6: ")
    assert report["examples"]["unknown_chars"] == [f"{where}:7: ß"]
    assert report["unknown_chars"] == {"ß": 1}
    assert sorted(examples(builder, "train")) == ["clips/stereo", "clips/u101", "clips/u104"]
    assert "outside the alphabet: 'ß' in 1" in build.summary(report)
    assert "'ß' in 1" in build.unknown_line(build.reports(builder))


def test_stereo_is_skipped_when_asked(bad_dir, tmp_path):
    builder = build.build(
        str(bad_dir), str(tmp_path / "tfds"), "manifest", options(stereo="skip", alphabet_min_count=1)
    )
    report = report_of(builder, "train")
    assert report["skipped"]["not_mono"] == 1 and "clips/stereo" not in examples(builder, "train")
    assert report["skipped"]["unknown_chars"] == 0  # a derived alphabet of every character holds ß


def test_a_derived_alphabet_leaves_out_characters_rarer_than_the_minimum_count(tmp_path):
    """dataset.alphabet_min_count=2 (the default): the one-off 'ß' is no label; its utterance is a counted
    unknown_chars skip, named with its count in the report, and the setting is part of the data's identity."""
    d = tmp_path / "manual"
    (d / "clips").mkdir(parents=True)
    texts = {"u101": "el perro", "u102": "el perro", "u103": "la perra", "u104": "perro ßa"}
    for name in texts:
        shutil.copy(clip("common_voice_es_" + name[1:]), d / "clips" / f"{name}.wav")
    (d / "train.jsonl").write_text(
        "".join(json.dumps({"audio_filepath": f"clips/{n}.wav", "text": t}) + "\n" for n, t in texts.items()),
        encoding="utf-8",
    )
    builder = build.build(str(d), str(tmp_path / "tfds"), "manifest", options())
    report = report_of(builder, "train")
    assert report["kept"] == 3 and report["skipped"]["unknown_chars"] == 1
    assert report["rare_chars"] == {"ß": 1} and report["unknown_chars"] == {"ß": 1}
    assert report["examples"]["unknown_chars"] == [
        f"{d / 'train.jsonl'}:4: ß (seen fewer than dataset.alphabet_min_count times in the train splits)"
    ]
    assert "too rare for the alphabet (dataset.alphabet_min_count): 'ß' 1 time" in build.summary(report)
    assert "ß" not in manifest.read_alphabet(os.fspath(builder.data_dir)).symbols
    with pytest.raises(ValueError, match=r"alphabet_min_count 2 \(built\) vs 1 \(now\)"):
        build.build(str(d), str(tmp_path / "tfds"), "manifest", options(alphabet_min_count=1))
    every = build.build(str(d), str(tmp_path / "tfds1"), "manifest", options(alphabet_min_count=1))
    assert report_of(every, "train")["kept"] == 4 and "ß" in manifest.read_alphabet(os.fspath(every.data_dir)).symbols


def run_build(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ds2_jax.datasets.build",
            "--config.dataset.name=manifest",
            "--config.dataset.train_splits=train",  # a later --config.dataset.train_splits wins
            *args,
        ],
        cwd=ROOT,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The one `error:` line a failed command printed (no traceback)."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_a_manifest_without_a_text_column_is_one_error_line(tmp_path):
    d = tmp_path / "manual"
    d.mkdir()
    (d / "train.csv").write_text("wav_filename,wav_filesize,words\nclips/a.wav,100,hola\n")
    line = one_error_line(
        run_build(f"--config.dataset.manual_dir={d}", f"--config.dataset.data_dir={tmp_path / 'tfds'}")
    )
    assert f"{d / 'train.csv'}:1: no text column" in line and "dataset.text_column" in line
    assert "'words'" in line  # names the columns it has
    (d / "train.csv").write_text("wav_filename,wav_filesize,words\n" + f"{clip()},100,hola\n")
    proc = run_build(
        f"--config.dataset.manual_dir={d}",
        f"--config.dataset.data_dir={tmp_path / 'tfds'}",
        "--config.dataset.text_column=words",
        "--config.dataset.alphabet_min_count=1",
    )  # one utterance: every character seen once
    assert proc.returncode == 0, proc.stderr
    assert "manifest/train: kept 1 of 1 utterances" in proc.stdout


def test_a_header_only_manifest_is_not_a_split_and_nothing_else_is_lost(tmp_path):
    d = tmp_path / "manual"
    (d / "clips").mkdir(parents=True)
    shutil.copy(clip(), d / "clips" / "a.wav")
    (d / "train.tsv").write_text("client_id\tpath\tsentence\nx\ta.wav\tHola.\n", encoding="utf-8")
    (d / "dev.tsv").write_text("client_id\tpath\tsentence\n", encoding="utf-8")
    (d / "reported.tsv").write_text("sentence_id\tsentence\treason\n1\tHola\tgrammar\n", encoding="utf-8")
    proc = run_build(
        f"--config.dataset.manual_dir={d}",
        f"--config.dataset.data_dir={tmp_path / 'tfds'}",
        "--config.dataset.alphabet_min_count=1",
    )
    assert proc.returncode == 0, proc.stderr
    assert f"{d / 'dev.tsv'} lists no utterances" in proc.stderr
    builder = build.get_builder(str(tmp_path / "tfds"), "manifest")
    assert list(builder.info.splits) == ["train"]  # CV's side file reported.tsv: no split either
    assert examples(builder, "train")["clips/a"]["text"] == b"hola"  # CV's clips/ folder


def test_an_asked_split_without_a_manifest_is_one_error_line(tmp_path):
    line = one_error_line(
        run_build(
            f"--config.dataset.manual_dir={CV}",
            f"--config.dataset.data_dir={tmp_path}",
            "--config.dataset.manifest_splits=train+valid",
        )
    )
    assert "dataset.manifest_splits='train+valid': no manifest for ['valid']" in line
    assert "'dev', 'test', 'train'" in line
    line = one_error_line(
        run_build(
            f"--config.dataset.manual_dir={CV}",
            f"--config.dataset.data_dir={tmp_path}",
            "--config.dataset.train_splits=training",
        )
    )
    assert "dataset.train_splits='training' names no manifest to derive the alphabet from" in line


def test_build_options_that_differ_from_the_prepared_data_are_refused(both):
    from ds2_jax import errors

    cv, _ = both
    data_dir = os.path.dirname(os.path.dirname(os.fspath(cv.data_dir)))
    with pytest.raises(errors.DatasetMismatch, match=r"sample_rate 16000 \(built\) vs 8000 \(now\)"):
        build.build(CV, data_dir, "manifest", options(sample_rate=8000))
    with pytest.raises(errors.DatasetMismatch, match="holds other files"):
        build.build(NEMO, data_dir, "manifest", options())


def test_a_corrupt_file_is_a_skip_in_a_worker_too(tmp_path):
    bad = tmp_path / "x.mp3"
    bad.write_bytes(b"\xff\xfb" + bytes(300))
    got = audio.load_many(
        [(str(bad), 16000, "downmix"), (clip(), 16000, "downmix"), (str(tmp_path / "no"), 16000, "downmix")]
    )
    assert isinstance(got[0], audio.Skip) and got[0].reason in ("corrupt_audio", "empty_audio")
    assert got[1].samples.dtype == np.int16 and len(got[1].samples) > 8000
    assert got[2].reason == "missing_audio"


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow  # 15-60 s on 2 idle cores (2026-12-05): make test runs it, test-fast does not
@pytest.mark.e2e
def test_train_eval_and_transcribe_on_common_voice_any_split_names(tmp_path):
    workdir, data = tmp_path / "w", tmp_path / "tfds"
    common = [
        f"--workdir={workdir}",
        "--config.dataset.name=manifest",
        f"--config.dataset.manual_dir={CV}",
        f"--config.dataset.data_dir={data}",
        "--config.dataset.train_splits=train",
        "--config.dataset.eval_split=dev",
        "--config.dataset.num_workers=0",
        "--config.dataset.num_buckets=1",  # each bucket is a train and an eval step compiled
    ]
    quick = {"devices": 2, "quick_compile": True}  # these runs and transcribe compile most of what they run
    proc = launch(*common, "--config.num_train_steps=10", "--config.eval_every_steps=10", **quick)
    assert proc.returncode == 0, proc.stderr[-3000:]
    alphabet = manifest.read_alphabet(os.path.join(data, "manifest", "1.0.0"))
    with open(workdir / "config.json") as f:
        assert json.load(f)["model"]["alphabet"] == alphabet.symbols
    with open(workdir / "metrics.jsonl") as f:
        evals = [json.loads(line) for line in f if '"eval_cer"' in line]
    assert evals and 0 < evals[-1]["eval_cer"] <= 1.5
    proc = launch(*common, "--mode=eval", "--config.eval.split=test,dev", **quick)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "model.alphabet" not in proc.stderr  # an unset model.alphabet is no difference
    for split in ("test", "dev"):
        with open(workdir / f"eval-{split}-10-greedy-max16.json") as f:
            result = json.load(f)
        assert result["utterances"] > 0 and set(result["examples"][0]["reference"]) <= set(alphabet.symbols)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ds2_jax.transcribe",
            f"--workdir={workdir}",
            os.path.join(CV, "clips", "common_voice_es_1.mp3"),
        ],
        cwd=ROOT,
        env=quick_compile_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    path, hyp = proc.stdout.strip().split("\t")
    assert path.endswith("common_voice_es_1.mp3") and set(hyp) <= set(alphabet.symbols)

    # The same workdir on data of another alphabet: refused, naming both.
    vocab = tmp_path / "vocab.txt"
    vocab.write_text(alphabet.to_lines() + "ü\n", encoding="utf-8")
    other = [a for a in common if "data_dir" not in a] + [
        f"--config.dataset.data_dir={tmp_path / 'other'}",
        f"--config.dataset.vocabulary={vocab}",
    ]
    proc = launch(*other, "--config.num_train_steps=12", devices=2)
    assert proc.returncode != 0
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert "model.alphabet" in line and repr(alphabet.symbols) in line and "ü" in line
    proc = launch(*other, "--mode=eval", "--config.eval.split=dev", devices=2)
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert "emits the alphabet 29 symbols" in line and "holds the alphabet 30 symbols" in line


@pytest.mark.e2e
def test_an_eval_split_without_a_manifest_is_refused_before_training(tmp_path):
    proc = launch(
        f"--workdir={tmp_path / 'w'}",
        "--config.dataset.name=manifest",
        f"--config.dataset.manual_dir={CV}",
        f"--config.dataset.data_dir={tmp_path / 'tfds'}",
        "--config.dataset.train_splits=train",
        "--config.dataset.eval_split=validation",
        "--config.dataset.num_workers=0",
        devices=2,
    )
    assert proc.returncode != 0
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert "dataset.eval_split='validation'" in line and "'dev', 'test', 'train'" in line
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------- LM and beam search


def test_build_lm_and_beam_search_use_the_runs_alphabet(tmp_path):
    from ds2_jax import decoding
    from ds2_jax.tools import build_lm

    lines = build_lm.manifest_transcripts(CV, ["train"])
    assert len(lines) == 80 and any("¿" in line for line in lines)  # as written in train.tsv
    alphabet = text.derive(text.normalize(line) for line in lines)
    dropped = []
    sents = list(build_lm.sentences(lines + ["Über die Straße"], alphabet=alphabet, dropped=dropped))
    assert len(sents) == 80 and dropped == ["über die straße"]
    path = str(tmp_path / "es.arpa")
    build_lm.write_arpa(*build_lm.estimate(sents, 2), path)
    words = decoding.lexicon_words(path, alphabet)
    assert "señor" in words and "dónde" in words
    with pytest.raises(ValueError, match="outside the model's alphabet"):
        decoding.lexicon_words(path, text.LIBRISPEECH)
    pytest.importorskip("flashlight.lib.text")
    ids = alphabet.encode("el niño")
    frames = np.full((2 * len(ids) + 1, alphabet.vocab_size), -12.0, np.float32)
    frames[0::2, text.BLANK] = -0.01
    frames[1::2][np.arange(len(ids)), ids] = -0.01
    beam = decoding.BeamSearchDecoder(settings.Decoding(beam_width=8), alphabet)
    assert beam.decode(frames) == "el niño"
    lm_beam = decoding.BeamSearchDecoder(settings.Decoding(beam_width=8, lm_path=path), alphabet)
    assert lm_beam.decode(frames) == "el niño"
    assert decoding.greedy_texts(frames.argmax(-1)[None], np.array([len(frames)]), alphabet) == ["el niño"]


def test_a_workdir_from_before_the_alphabet_setting_keeps_librispeechs_29_outputs(tmp_path):
    from ds2_jax import model, workdir_config

    old = settings.to_dict(settings.Settings())
    del old["model"]["alphabet"]  # config.json as workdirs wrote it before model.alphabet existed
    (tmp_path / "config.json").write_text(json.dumps(old))
    config = workdir_config.load_config(str(tmp_path))
    assert config.model.alphabet == "" and model.ModelConfig.of(config.model).vocab_size == 29
    workdir_config.refuse_fixed_changes(settings.Settings(), str(tmp_path))  # a LibriSpeech run resumes it
    spanish = settings.override(settings.Settings(), {"model.alphabet": " abcñ"})
    assert model.ModelConfig.of(spanish.model).vocab_size == 6
    with pytest.raises(ValueError, match=r"model.alphabet \(trained '', --config ' abcñ'\)"):
        workdir_config.refuse_fixed_changes(spanish, str(tmp_path))


def test_the_build_command_ends_with_the_characters_outside_the_alphabet(bad_dir, tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(c + "\n" for c in "abcdefghijlmnopqrstuvxyzñ") + "<space>\n", encoding="utf-8")
    proc = run_build(
        f"--config.dataset.manual_dir={bad_dir}",
        f"--config.dataset.data_dir={tmp_path / 'tfds'}",
        f"--config.dataset.vocabulary={vocab}",
    )
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("characters outside the alphabet skipped 1 utterances: 'ß' in 1"), proc.stdout
    assert "manifest/train: kept 3 of 11 utterances" in proc.stdout


# ----------------------------------------------------------------------------- text is never replaced

SENTENCES = ["¿Dónde está el señor?", "El niño come pan."]


def cv_manifest(folder, encoding: str, bom: bytes = b"") -> str:
    lines = ["path\tsentence"] + [f"clips/u{i}.mp3\t{s}" for i, s in enumerate(SENTENCES)]
    path = folder / "train.tsv"
    path.write_bytes(bom + ("\n".join(lines) + "\n").encode(encoding))
    return str(path)


@pytest.mark.parametrize(
    "encoding,bom",
    [("utf-8", b""), ("utf-8", b"\xef\xbb\xbf"), ("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff")],
)
def test_utf8_with_or_without_a_bom_and_utf16_with_one_read_the_same_text(tmp_path, encoding, bom):
    m = manifest.read_manifest(cv_manifest(tmp_path, encoding, bom), options())
    assert [e.text for e in m.entries] == SENTENCES and not m.bad_lines
    assert [e.id for e in m.entries] == ["clips/u0", "clips/u1"]


@pytest.mark.parametrize("encoding", ["latin-1", "cp1252"])
def test_a_manifest_in_another_encoding_is_an_error_naming_file_line_and_the_fix(tmp_path, encoding):
    path = cv_manifest(tmp_path, encoding)
    with pytest.raises(ValueError, match=rf"^{path}:2: byte 0xbf \(column 14\) is not UTF-8.*iconv -f LATIN1"):
        manifest.read_manifest(path, options())


def test_other_text_files_are_never_replaced_either(tmp_path):
    """The vocabulary, an LM's text and LibriSpeech transcripts: the same rule, the same error line."""
    from ds2_jax.datasets import librispeech_local
    from ds2_jax.tools import build_lm

    vocab = tmp_path / "alphabet.txt"
    vocab.write_bytes("a\nb\nñ\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"^{vocab}:3: byte 0xf1 .* is not UTF-8"):
        text.read_vocabulary(str(vocab))
    vocab.write_bytes("\ufeffa\nb\nñ\n".encode("utf-16"))
    assert text.read_vocabulary(str(vocab)).symbols == "abñ"
    corpus = tmp_path / "lm.txt"
    corpus.write_bytes("una frase\nel señor\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"^{corpus}:2: byte 0xf1"):
        list(build_lm.read_text_file(str(corpus)))
    with pytest.raises(ValueError, match=r"^c/1-2.trans.txt:2: byte 0xd1 \(column 9\)"):
        librispeech_local.parse_transcripts("1-2-0 A\n1-2-1 SEÑOR\n".encode("latin-1"), "c/1-2.trans.txt")


def nemo_objects() -> list[dict]:
    return [{"audio_filepath": f"clips/u{i}.wav", "duration": 1.0, "text": s} for i, s in enumerate(SENTENCES)]


def test_a_json_array_manifest_is_read_as_its_objects_with_their_lines(tmp_path):
    lines = tmp_path / "lines" / "train.json"
    array = tmp_path / "array" / "train.json"
    lines.parent.mkdir()
    array.parent.mkdir()
    lines.write_text("\n".join(json.dumps(o, ensure_ascii=False) for o in nemo_objects()) + "\n", encoding="utf-8")
    array.write_text(json.dumps(nemo_objects(), indent=1, ensure_ascii=False), encoding="utf-8")
    a, b = manifest.read_manifest(str(lines), options()), manifest.read_manifest(str(array), options())
    assert [(e.id, e.text) for e in a.entries] == [(e.id, e.text) for e in b.entries] and not b.bad_lines
    assert [e.line for e in b.entries] == [2, 7]  # where each object starts (json.dumps indent=1)


def test_a_broken_json_array_or_a_manifest_without_transcripts_names_its_cause(tmp_path):
    """Never the advice to lower dataset.alphabet_min_count: the manifest is at fault."""
    d = tmp_path / "m"
    d.mkdir()
    (d / "train.json").write_text(json.dumps(nemo_objects(), indent=1)[:-3] + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"train.json:\d+: the file is one JSON array .* does not parse") as e:
        build.build(str(d), str(tmp_path / "tfds"), "manifest", options())
    assert "alphabet_min_count" not in str(e.value)
    (d / "train.json").write_text('{"audio_filepath": "a.wav", "text": \n{"audio_filepath": "b.wav", "te\n')
    with pytest.raises(ValueError, match=r"hold no transcript to derive the alphabet from .* not JSON") as e:
        build.build(str(d), str(tmp_path / "tfds"), "manifest", options())
    assert "alphabet_min_count" not in str(e.value)


def test_a_common_voice_folder_with_only_validated_tsv_gets_the_manifest_splits_hint(tmp_path):
    d = tmp_path / "cv"
    d.mkdir()
    shutil.copy(os.path.join(CV, "train.tsv"), d / "validated.tsv")
    with pytest.raises(FileNotFoundError, match=r"only Common Voice's validated .* dataset.manifest_splits=validated"):
        build.build(str(d), str(tmp_path / "tfds"), "manifest", options())


# ----------------------------------------------------------------------------- records, field by field


def test_each_recorded_build_option_changed_alone_is_refused_naming_it_and_no_other(both, tmp_path):
    """Every field of the build record (manifest.Options.record), changed alone, reopens the prepared
    data as a DatasetMismatch naming that field's built and current values, and only that field; a
    new recorded field must join the table."""
    from ds2_jax import errors

    cv, _ = both
    data_dir = os.path.dirname(os.path.dirname(os.fspath(cv.data_dir)))
    vocab = tmp_path / "vocab.txt"
    vocab.write_text(manifest.read_alphabet(os.fspath(cv.data_dir)).to_lines(), encoding="utf-8")
    changes = {
        "sample_rate": {"sample_rate": 8000},
        "vocabulary": {"vocabulary": str(vocab)},
        "lower_case": {"lower_case": False},
        "strip_punctuation": {"strip_punctuation": False},
        "path_column": {"path_column": "path"},
        "text_column": {"text_column": "sentence"},
        "stereo": {"stereo": "skip"},
        "alphabet_min_count": {"alphabet_min_count": 3},
    }
    built = options(build_workers=0).record()
    assert sorted(changes) == sorted(built)
    build.build(CV, data_dir, "manifest", options(build_workers=0))  # unchanged: reopens
    for field, change in changes.items():
        now = options(build_workers=0, **change).record()
        changed = [field, "alphabet_min_count"] if field == "vocabulary" else [field]
        assert [k for k in built if built[k] != now[k]] == changed, field
        with pytest.raises(errors.DatasetMismatch) as e:
            build.build(CV, data_dir, "manifest", options(build_workers=0, **change))
        named = str(e.value).split(". Set")[0]
        for k in changed:
            assert f"{k} {built[k]!r} (built) vs {now[k]!r} (now)" in named, named
        assert not [k for k in built if k not in changed and f"{k} " in named], named


@pytest.mark.parametrize(
    "edit, named",
    [
        ("transcript", "split(s) train "),
        ("clip_renamed", "split(s) train "),
        ("split_added", "split(s) extra "),
    ],
)
def test_each_part_of_the_data_fingerprint_changed_alone_is_noticed(tmp_path, edit, named):
    """The prepared data's source record, part by part (manifest.source_of: the manifests' names,
    sizes and text, and per split every listed audio file): one transcript edited to the same length,
    one clip renamed in its manifest, one split added: each is a SourceChanged naming the split it
    touches (which build.build builds again); an untouched copy reopens."""
    from ds2_jax import errors

    manual = tmp_path / "cv"
    shutil.copytree(CV, manual)
    data_dir = str(tmp_path / "tfds")
    build.build(str(manual), data_dir, "manifest", options(build_workers=0))
    build.build(str(manual), data_dir, "manifest", options(build_workers=0))  # unchanged: reopens
    if edit == "transcript":
        tsv = manual / "train.tsv"
        text_ = tsv.read_text(encoding="utf-8")
        tsv.write_text(text_.replace("campesino busca", "campesino besca", 1), encoding="utf-8")
    elif edit == "clip_renamed":
        os.rename(manual / "clips" / "common_voice_es_1.mp3", manual / "clips" / "common_voice_es_1b.mp3")
        tsv = manual / "train.tsv"
        tsv.write_text(tsv.read_text(encoding="utf-8").replace("es_1.mp3", "es_1b.mp3"), encoding="utf-8")
    else:
        shutil.copy(manual / "dev.tsv", manual / "extra.tsv")
    with pytest.raises(errors.SourceChanged) as e:
        build.check_source(build.get_builder(data_dir, "manifest", options(build_workers=0)), str(manual))
    assert named in str(e.value), str(e.value)


# ----------------------------------------------------------------------------- changed sources


def test_an_edited_replaced_deleted_or_added_audio_file_rebuilds_the_split_it_is_in(tmp_path, caplog):
    """The build's record covers every listed audio file (path, size, mtime): each change is seen,
    its split built again and the untouched split taken from the previous build (the same shards)."""
    d = tmp_path / "manual"
    (d / "clips").mkdir(parents=True)
    for i in range(101, 106):
        shutil.copy(clip(f"common_voice_es_{i}"), d / "clips" / f"u{i}.wav")
    train = [f"clips/u{i}.wav\tla casa del perro" for i in (101, 102, 103)]
    (d / "train.tsv").write_text("path\tsentence\n" + "\n".join(train) + "\n", encoding="utf-8")
    (d / "dev.tsv").write_text("path\tsentence\nclips/u104.wav\tel perro\n", encoding="utf-8")
    opts, data_dir = options(build_workers=0, alphabet_min_count=1), str(tmp_path / "tfds")
    first = build.build(str(d), data_dir, "manifest", opts)
    dev_shard = shard_files(first, "dev")

    def rebuilt() -> dict[str, dict]:
        caplog.clear()
        with caplog.at_level("INFO"):
            builder = build.build(str(d), data_dir, "manifest", opts)
        assert "split(s) train" in caplog.text and "manifest/dev: its files are unchanged" in caplog.text
        assert shard_files(builder, "dev") == dev_shard
        return examples(builder, "train")

    samples, _ = soundfile.read(d / "clips" / "u101.wav", dtype="int16")
    soundfile.write(str(d / "clips" / "u101.wav"), samples[::-1], 8000, subtype="ULAW")  # edited: the same size
    np.testing.assert_array_equal(
        rebuilt()["clips/u101"]["audio"][:100], audio.load(str(d / "clips" / "u101.wav"), 16000).samples[:100]
    )
    shutil.copy(d / "clips" / "u105.wav", d / "clips" / "u102.wav")  # replaced by another clip
    assert len(rebuilt()["clips/u102"]["audio"]) == len(audio.load(clip("common_voice_es_105"), 16000).samples)
    os.remove(d / "clips" / "u103.wav")  # deleted
    caplog.clear()
    assert "clips/u103" not in rebuilt()
    assert "1 listed audio files are missing" in caplog.text and "u103.wav" in caplog.text
    with open(d / "train.tsv", "a", encoding="utf-8") as f:  # added
        f.write("clips/u105.wav\tla casa\n")
    assert sorted(rebuilt()) == ["clips/u101", "clips/u102", "clips/u105"]
    caplog.clear()
    with caplog.at_level("INFO"):
        build.build(str(d), data_dir, "manifest", opts)  # nothing changed: nothing built
    assert "holds the same files" in caplog.text and "building again" not in caplog.text


def test_the_build_command_reads_the_settings_a_training_run_reads():
    """ds2-build takes --config.dataset.* and --config.features.* as launch.py does: every build
    option, each set away from its default, reaches the build as a training run's would."""
    changes = {
        "dataset.name": "manifest",
        "dataset.manual_dir": "own data",
        "dataset.data_dir": "d",
        "dataset.train_splits": "tr",
        "dataset.vocabulary": "v.txt",
        "dataset.lower_case": False,
        "dataset.strip_punctuation": False,
        "dataset.path_column": "p",
        "dataset.text_column": "t",
        "dataset.stereo": "skip",
        "dataset.manifest_splits": "tr+dev",
        "dataset.build_workers": 3,
        "dataset.alphabet_min_count": 5,
        "features.sample_rate": 8000,
        "features.window_ms": 25.0,
        "features.hop_ms": 12.5,
    }
    built = build.settings_of_argv([f"--config.{k}={v}" for k, v in changes.items()])
    trained = settings.override(settings.Settings(), changes)  # launch.py's --config.KEY=VALUE
    assert built == trained
    got = build.options_of(built)  # what main builds with
    assert got == manifest.Options.of(trained.dataset, trained.features.spectrogram)
    default = manifest.Options()
    assert [f.name for f in dataclasses.fields(got) if getattr(got, f.name) == getattr(default, f.name)] == []


def test_the_build_command_reads_a_training_config_file_and_its_overrides():
    """ds2-build --config=FILE builds what launch.py --config=FILE trains on; a missing file or a
    config of data that needs no build is one `error:` line, exit 2."""
    from configs import tiny_es

    file = os.path.join(ROOT, "configs", "tiny_es.py")
    built = build.settings_of_argv([f"--config={file}", "--config.features.sample_rate=8000"])
    trained = settings.override(settings.from_config_dict(tiny_es.get_config()), {"features.sample_rate": 8000})
    assert built == trained and built.dataset.name == "manifest" and built.model.rnn_cell == "gru"
    for argv, message in (
        (["--config=configs/tiny_ess.py"], "no such file; did you mean configs/tiny_es.py"),
        (["--config", "configs/smoke.py", "--config.dataset.manual_dir=x"], "the build prepares librispeech_local"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "ds2_jax.datasets.build", *argv],
            cwd=ROOT,
            env=repo_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr


# ----------------------------------------------------------------------------- a real-shaped Common Voice release


@pytest.fixture(scope="module")
def cv_release(tmp_path_factory):
    """corpora/tiny_es/common_voice laid out as a Common Voice release folder holds it: train/dev/test.tsv,
    validated.tsv (their superset and 4 more), invalidated.tsv, other.tsv, reported.tsv,
    clip_durations.tsv, validated_sentences.tsv, unvalidated_sentences.tsv and clips/."""
    d = tmp_path_factory.mktemp("cv_release") / "es"
    shutil.copytree(CV, d)
    rows = {s: (d / f"{s}.tsv").read_text(encoding="utf-8").splitlines() for s in SPLITS}
    header = rows["train"][0]
    extra = rows["train"][1:5]  # validated holds clips of no split too: 4 rows of train, renamed
    for i, line in enumerate(extra):
        src = line.split("\t")[1]
        shutil.copy(d / "clips" / src, d / "clips" / f"common_voice_es_900{i}.mp3")
    extra = [line.replace(line.split("\t")[1], f"common_voice_es_900{i}.mp3") for i, line in enumerate(extra)]
    validated = [header] + [r for s in SPLITS for r in rows[s][1:]] + extra
    (d / "validated.tsv").write_text("\n".join(validated) + "\n", encoding="utf-8")
    (d / "invalidated.tsv").write_text("\n".join([header] + rows["dev"][1:3]) + "\n", encoding="utf-8")
    (d / "other.tsv").write_text("\n".join([header] + rows["test"][1:4]) + "\n", encoding="utf-8")
    (d / "reported.tsv").write_text(
        "sentence_id\tsentence\tlocale\treason\nabc\t¿El campesino busca la canción?\tes\tgrammar-or-spelling\n",
        encoding="utf-8",
    )
    clips = sorted(os.listdir(d / "clips"))
    (d / "clip_durations.tsv").write_text(
        "clip\tduration[ms]\n" + "".join(f"{c}\t{1000 + i}\n" for i, c in enumerate(clips)), encoding="utf-8"
    )
    (d / "validated_sentences.tsv").write_text(
        "sentence_id\tsentence\tsentence_domain\tsource\tis_used\tclips_count\nabc\tEl niño\t\tx\t1\t3\n",
        encoding="utf-8",
    )
    (d / "unvalidated_sentences.tsv").write_text(
        "sentence_id\tsentence\tsentence_domain\tsource\nabd\tLa niña\t\tx\n", encoding="utf-8"
    )
    return d, {s: len(rows[s]) - 1 for s in SPLITS}, len(validated) - 1


def test_a_common_voice_release_folder_builds_exactly_train_dev_and_test(cv_release, tmp_path):
    """Every file a release holds, as it holds them: the build makes train, dev and test alone, each
    with its own utterances; the side files are neither splits nor counted as bad lines."""
    folder, counts, _ = cv_release
    builder = build.build(str(folder), str(tmp_path / "tfds"), "manifest", options(build_workers=0))
    assert sorted(builder.info.splits) == sorted(SPLITS)
    for split, n in counts.items():
        assert builder.info.splits[split].num_examples == n, split
        assert report_of(builder, split)["kept"] == n, split


def test_a_common_voice_release_builds_validated_alone_when_asked(cv_release, tmp_path):
    """dataset.manifest_splits=validated (train_splits=validated): that split alone, every row of it."""
    folder, _, validated = cv_release
    builder = build.build(
        str(folder),
        str(tmp_path / "tfds"),
        "manifest",
        options(build_workers=0, manifest_splits="validated", train_splits="validated"),
    )
    assert list(builder.info.splits) == ["validated"]
    assert builder.info.splits["validated"].num_examples == validated, report_of(builder, "validated")


# ----------------------------------------------------------------------------- awkward text through every parser

AWKWARD_TEXT = [
    'he said "hi" twice',
    '"a leading quote',
    "a, b, and c,",
    "it's 'single' quoted",
    "naïve café, ñandú — ¿qué?",
    "Straße 東京 ok",
]
AWKWARD_PATHS = [
    "clips/v1.2 take.wav",
    "clips/a b.wav",
    "clips/c:d.wav",
    "clips/ñú é.wav",
    "clips/x,y.wav",
    "clips/'q' \"r\".wav",
    "día 2/ü.wav",
]


def _write_layout(folder, layout: str, rows: list[tuple[str, str]]) -> str:
    """`rows` (path, transcript) as a manifest of `layout`, written as its tools write it."""
    import csv as csv_

    path = folder / f"train.{layout}"
    if layout == "tsv":  # Common Voice: tab-separated, quotes are text (QUOTE_NONE)
        path.write_text("path\tsentence\n" + "".join(f"{p}\t{t}\n" for p, t in rows), encoding="utf-8")
    elif layout == "csv":
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv_.writer(f)
            w.writerow(["path", "sentence"])
            w.writerows(rows)
    elif layout == "jsonl":
        path.write_text("".join(json.dumps({"audio_filepath": p, "text": t}) + "\n" for p, t in rows), encoding="utf-8")
    else:
        path.write_text(json.dumps([{"audio_filepath": p, "text": t} for p, t in rows], ensure_ascii=False, indent=1))
    return str(path)


@pytest.mark.parametrize("layout", ["tsv", "csv", "jsonl", "json"])
def test_awkward_transcripts_and_paths_come_through_every_manifest_layout_as_written(tmp_path, layout):
    """Quotes, commas, apostrophes and non-ASCII text in transcripts (tabs and newlines too, where the
    layout can hold them), and paths with spaces, ':', ',', quotes and non-ASCII letters: each manifest
    layout gives back every row, its transcript and its path exactly as written, its id the path."""
    text_ = AWKWARD_TEXT + ([] if layout == "tsv" else ["a\ttab inside", "two\nlines"])
    rows = [(AWKWARD_PATHS[i % len(AWKWARD_PATHS)].replace(".wav", f"{i}.wav"), t) for i, t in enumerate(text_)]
    m = manifest.read_manifest(_write_layout(tmp_path, layout, rows), options())
    assert not m.bad_lines, m.bad_lines
    got = [(os.path.relpath(e.audio, tmp_path), e.text, e.id) for e in m.entries]
    assert got == [(p, t, os.path.splitext(p)[0]) for p, t in rows]


def test_one_audio_file_in_two_splits_is_warned_and_counted(tmp_path, caplog):
    d = tmp_path / "manual"
    (d / "clips").mkdir(parents=True)
    for i in (101, 102, 103):
        shutil.copy(clip(f"common_voice_es_{i}"), d / "clips" / f"u{i}.wav")
    (d / "train.tsv").write_text("path\tsentence\nclips/u101.wav\tla casa\nclips/u102.wav\tel perro\n")
    (d / "test.tsv").write_text("path\tsentence\nclips/u103.wav\tla casa\nu102.wav\tel perro\n")  # clips/ found
    with caplog.at_level("WARNING"):
        builder = build.build(
            str(d), str(tmp_path / "tfds"), "manifest", options(build_workers=0, alphabet_min_count=1)
        )
    assert "1 audio files are listed in more than one split" in caplog.text
    train, test = report_of(builder, "train"), report_of(builder, "test")
    assert train["audio_in_other_splits"] == 1 and test["audio_in_other_splits"] == 1
    assert test["audio_in_other_splits_examples"][0].startswith(f"{d / 'test.tsv'}:3: ")
    assert "(also in train)" in test["audio_in_other_splits_examples"][0]
    assert "also listed in another split" in build.summary(test) and train["kept"] == test["kept"] == 2


@pytest.mark.parametrize(
    "key,value",
    [
        ("dataset.train_splits", "train+dev+train"),
        ("dataset.manifest_splits", "dev-clean+dev_clean"),
        ("eval.split", "a+a"),
    ],
)
def test_a_split_named_twice_is_refused_naming_the_key(key, value):
    with pytest.raises(ValueError, match=re.escape(f"{key}='{value}' names split(s) ") + r"\w+ twice"):
        settings.override(settings.Settings(), {key: value})


def _children(pid: int) -> dict[int, bytes]:
    """pid -> cmdline of each process whose parent is `pid`."""
    out = {}
    for child in os.listdir("/proc"):
        try:
            with open(f"/proc/{child}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{child}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out[int(child)] = cmd
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_build_workers_and_the_resource_tracker_die_with_a_killed_build(tmp_path):
    """kill -9 of a build on 2 workers: the workers (and the resource tracker) end with it, as input
    workers do, instead of decoding on for nobody."""
    import time

    d = tmp_path / "manual"
    (d / "clips").mkdir(parents=True)
    wav, rate = soundfile.read(clip(), dtype="int16")
    soundfile.write(str(d / "long.wav"), np.tile(wav, 40), rate)
    for i in range(120):
        os.symlink(d / "long.wav", d / "clips" / f"u{i}.wav")
    (d / "train.tsv").write_text("path\tsentence\n" + "".join(f"u{i}.wav\thola\n" for i in range(120)))
    data_dir = tmp_path / "tfds"
    args = [
        "-m",
        "ds2_jax.datasets.build",
        "--config.dataset.name=manifest",
        "--config.dataset.train_splits=train",
        f"--config.dataset.manual_dir={d}",
        f"--config.dataset.data_dir={data_dir}",
        "--config.dataset.build_workers=2",
        "--config.dataset.alphabet_min_count=1",
    ]
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env=repo_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    children = {}
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            children = _children(proc.pid)
            if any(data_dir.rglob("*.shard*.tmp")) and sum(b"spawn_main" in c for c in children.values()) == 2:
                break
            time.sleep(0.05)
        assert sum(b"spawn_main" in c for c in children.values()) == 2, children
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.time() + 30
        while any(_alive(p) for p in children) and time.time() < deadline:
            time.sleep(0.1)
        assert not [c for p, c in children.items() if _alive(p)], "a build worker outlived the killed build"
    finally:
        proc.kill()
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
