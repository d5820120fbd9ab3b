"""librispeech_local: every bad input is skipped with its counted reason, tree and tar alike."""

import dataclasses
import json
import os

import numpy as np
import pytest

from ds2_jax import errors, settings
from ds2_jax.datasets import build, kept_splits, librispeech_local
from tests import librispeech_testdata as td


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """dev-clean as an extracted tree and test-clean as a .tar.gz, same bad inputs in both."""
    root = tmp_path_factory.mktemp("ls")
    manual = root / "manual"
    expected = td.write_bad_inputs(str(manual / "LibriSpeech" / "dev-clean"))
    staging = root / "staging" / "test-clean"
    td.write_bad_inputs(str(staging))
    td.tar_split(str(staging), str(manual / "test-clean.tar.gz"), flacs_first=True)
    builder = build.build(str(manual), str(root / "tfds"))
    return builder, expected


@pytest.mark.parametrize("split", ["dev_clean", "test_clean"])
def test_every_reason_is_counted(built, split):
    builder, expected = built
    with open(librispeech_local.report_path(os.fspath(builder.data_dir), split)) as f:
        report = json.load(f)
    assert report["kept"] == expected["kept"]
    assert report["transcripts_without_audio"] == expected["transcripts_without_audio"]
    for reason in librispeech_local.REASONS:
        assert report["skipped"][reason] == expected[reason], reason
        assert len(report["examples"].get(reason, [])) == expected[reason], reason
    total = sum(report["skipped"].values())
    assert report["skipped_total"] == total == 11
    assert builder.info.splits[split].num_examples == expected["kept"]


@pytest.mark.parametrize("split", ["dev_clean", "test_clean"])
def test_kept_examples_are_normalized_and_exact(built, split):
    builder, _ = built
    ds = builder.as_data_source(split)
    got = {ex["id"].decode(): ex for ex in (ds[i] for i in range(len(ds)))}
    assert {k: v["text"].decode() for k, v in got.items()} == td.EXPECTED_GOOD_TEXT
    for i in range(4):
        ex = got[f"1-10-{i:04d}"]
        want = td.tone(td.RATE + 800 * i)
        assert ex["audio"].dtype == np.int16
        np.testing.assert_array_equal(ex["audio"], want)
        assert ex["num_samples"] == len(want)
        assert (ex["speaker_id"], ex["chapter_id"]) == (1, 10)


def test_only_present_splits_are_built(built):
    builder, _ = built
    assert sorted(builder.info.splits) == ["dev_clean", "test_clean"]


def test_tar_with_transcripts_first(tmp_path):
    staging = tmp_path / "staging" / "dev-other"
    expected = td.write_bad_inputs(str(staging))
    (tmp_path / "manual").mkdir()
    td.tar_split(str(staging), str(tmp_path / "manual" / "dev-other.tar.gz"), flacs_first=False)
    builder = build.build(str(tmp_path / "manual"), str(tmp_path / "tfds"))
    report = build.reports(builder)["dev_other"]
    assert report["kept"] == expected["kept"]
    assert report["skipped"]["missing_transcript"] == expected["missing_transcript"]


def test_cli_prints_the_summary(built, tmp_path, capsys):
    manual = tmp_path / "manual"
    td.write_bad_inputs(str(manual / "LibriSpeech" / "dev-clean"))
    assert build.main([f"--config.dataset.manual_dir={manual}", f"--config.dataset.data_dir={tmp_path / 'tfds'}"]) == 0
    out = capsys.readouterr().out
    assert "dev-clean: kept 4 of 16 utterances" in out
    assert "missing_transcript=3" in out and "ctc_infeasible=1" in out and "missing_audio=1" in out


@pytest.mark.parametrize("make", [lambda p: None, lambda p: p.mkdir()])
def test_missing_or_empty_manual_dir_names_the_setting(tmp_path, make):
    make(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match="dataset.manual_dir"):
        build.build(str(tmp_path / "nothing"), str(tmp_path / "tfds"))


def test_split_names_map_dashes():
    assert librispeech_local.tfds_split("train-clean-100") == "train_clean_100"
    assert librispeech_local.tfds_split("train_clean_100") == "train_clean_100"


def test_large_split_spills_to_disk_without_tensorflow(tmp_path, monkeypatch):
    """Past tfds's in-memory shuffle buffer, examples spill to temp files; no TF needed."""
    from tensorflow_datasets.core import shuffle

    monkeypatch.setattr(shuffle, "MAX_MEM_BUFFER_SIZE", 1000)  # bytes: spill at once
    td.write_bad_inputs(str(tmp_path / "manual" / "LibriSpeech" / "dev-clean"))
    builder = build.build(str(tmp_path / "manual"), str(tmp_path / "tfds"))
    ds = builder.as_data_source("dev_clean")
    assert sorted(ds[i]["id"].decode() for i in range(len(ds))) == sorted(td.EXPECTED_GOOD_TEXT)
    assert shuffle.tf is not build._LOCAL_TF  # restored after the build


def test_a_local_build_says_nothing_of_downloads(tmp_path, capsys, caplog):
    """tfds's 'Downloading and preparing dataset Unknown size' (stdout) and 'Variant folder
    ... has no dataset_info.json' (absl) do not describe a local build: neither shows, and
    our own build line and split reports still do."""
    import logging

    caplog.set_level(logging.INFO)
    td.write_bad_inputs(str(tmp_path / "manual" / "LibriSpeech" / "dev-clean"))
    assert not build.get_builder(str(tmp_path / "tfds")).is_prepared()  # as tfds_source asks first
    build.build(str(tmp_path / "manual"), str(tmp_path / "tfds"))
    build.build(str(tmp_path / "manual"), str(tmp_path / "tfds"))  # prepared: a no-op
    out = capsys.readouterr().out
    assert "Downloading" not in out and "downloaded and prepared" not in out
    messages = [r.getMessage() for r in caplog.records]
    assert not any("dataset_info.json" in m for m in messages), messages
    assert any("dev_clean: kept 4 of 16" in m for m in messages)
    assert sum("librispeech_local: built" in m for m in messages) == 1


def test_records_are_stored_uncompressed(tmp_path):
    """Brotli-compressed records cost far more per random read (BUILD_NOTES.md, "Tried and rejected"):
    the build writes them plain."""
    import glob

    from array_record.python import array_record_module

    manual = str(tmp_path / "manual")
    td.write_durations_corpus(manual, "train-clean-100", [0.5, 0.7])
    builder = build.build(manual, str(tmp_path / "tfds"))
    files = glob.glob(os.path.join(os.fspath(builder.data_dir), "*.array_record*"))
    assert files
    for f in files:
        options = array_record_module.ArrayRecordReader(f).writer_options_string()
        assert "uncompressed" in options.split(","), options


def test_a_split_with_every_utterance_skipped_says_why(tmp_path):
    """Not tfds' "No examples were yielded": the split, the reason counts and an example."""
    split_dir = str(tmp_path / "manual" / "LibriSpeech" / "dev-clean")
    td.write_chapter(
        split_dir, 1, 1, {"1-1-0000.flac": td.flac_bytes(td.tone(1600))}, b"1-1-0000 " + b"A" * 200 + b"\n"
    )
    with pytest.raises(ValueError, match=r"dev_clean: kept 0 of 1 .*ctc_infeasible=1.*1-1-0000: 200 labels"):
        build.build(str(tmp_path / "manual"), str(tmp_path / "tfds"))


def test_a_linked_speaker_folder_is_read_loops_once_and_a_broken_link_is_counted(tmp_path, caplog):
    """issue 40: a speaker folder that is a symbolic link was left out ("kept 13 of 13, skipped:
    none"). Linked folders are read like any other, a link back up (a loop) is read once and named,
    a broken link to a .flac is counted, and the data record's fingerprint sees the linked files."""
    split = tmp_path / "manual" / "LibriSpeech" / "dev-clean"
    texts = b"1-10-0000 ONE\n1-10-0001 TWO\n"
    td.write_chapter(
        str(split), 1, 10, {f"1-10-{i:04d}.flac": td.flac_bytes(td.tone(td.RATE)) for i in range(2)}, texts
    )
    elsewhere = tmp_path / "other_disk"
    td.write_chapter(
        str(elsewhere), 2, 20, {"2-20-0000.flac": td.flac_bytes(td.tone(td.RATE))}, b"2-20-0000 THREE\n2-20-0001 FOUR\n"
    )
    os.symlink(elsewhere / "2", split / "2")  # speaker 2 linked in
    os.symlink(split, elsewhere / "2" / "20" / "loop")  # a link back up: a loop
    os.symlink(tmp_path / "gone.flac", elsewhere / "2" / "20" / "2-20-0001.flac")  # broken
    report = librispeech_local.SplitReport("dev-clean")
    with caplog.at_level("WARNING"):
        keys = [key for key, _ in librispeech_local.generate_from_tree(str(split), report)]
    assert sorted(keys) == ["1-10-0000", "1-10-0001", "2-20-0000"]  # each once, the loop not re-read
    assert report.kept == 3 and report.skipped["corrupt_audio"] == 1
    assert "2-20-0001: unreadable" in report.examples["corrupt_audio"][0]
    assert "loop" in caplog.text and str(split) in caplog.text
    before = build.source_of(str(tmp_path / "manual"))
    assert before["files"] == 6  # 1/10: 2 flac + trans; 2/20: flac, trans and the broken link (sized -1)
    with open(elsewhere / "2" / "20" / "2-20.trans.txt", "ab") as f:
        f.write(b"2-20-0002 FIVE\n")
    assert build.source_of(str(tmp_path / "manual"))["content_fingerprint"] != before["content_fingerprint"]


def _counting_generators(monkeypatch) -> list[str]:
    """Records the LibriSpeech split of each tree or archive the build reads (the builder's generators)."""
    built: list[str] = []
    for name in ("generate_from_tree", "generate_from_tar"):
        real = getattr(librispeech_local, name)
        monkeypatch.setattr(
            librispeech_local, name, lambda path, report, real=real: built.append(report.split) or real(path, report)
        )
    return built


def _split_sizes(builder) -> dict[str, int]:
    return {name: info.num_examples for name, info in builder.info.splits.items()}


def test_a_truncated_archive_names_itself_and_costs_only_its_own_split(tmp_path, monkeypatch):
    """issue 40: a .tar.gz cut short mid-download was an EOFError traceback from inside tfds, and the
    splits built before it were discarded with the failed build. Now its error names it and says to
    download it again, the splits before and after it are built and kept, and the next build, once
    the archive is whole, builds only that split."""
    manual, data_dir = tmp_path / "manual", str(tmp_path / "tfds")
    staging = tmp_path / "staging" / "dev-other"
    td.write_bad_inputs(str(staging))
    manual.mkdir()
    archive = manual / "dev-other.tar.gz"
    td.tar_split(str(staging), str(archive))
    whole = archive.read_bytes()
    archive.write_bytes(whole[: len(whole) * 2 // 3])  # cut mid-file
    with pytest.raises(OSError, match=rf"{archive} is truncated or damaged .*: download it again"):
        list(librispeech_local.generate_from_tar(str(archive), librispeech_local.SplitReport("dev-other")))
    for split in ("dev-clean", "test-clean"):  # good splits before and after it
        td.write_bad_inputs(str(manual / "LibriSpeech" / split))
    built = _counting_generators(monkeypatch)
    with pytest.raises(OSError, match=rf"{archive} is truncated or damaged .*: download it again") as failed:
        build.build(str(manual), data_dir)
    assert type(failed.value) is errors.DamagedArchive  # one `error:` line, not tfds's wrapper
    assert "disk full" not in str(failed.value)  # an OSError, but not the disk's
    assert built == ["dev-clean", "dev-other", "test-clean"]  # the one after it built too
    kept = tmp_path / "tfds" / "librispeech_local" / kept_splits.FOLDER
    assert sorted(os.listdir(kept)) == ["dev_clean", "test_clean"]
    archive.write_bytes(whole)  # downloaded again
    built.clear()
    builder = build.build(str(manual), data_dir)
    assert built == ["dev-other"]  # only the split that failed
    assert not kept.exists()  # a build that succeeds keeps nothing
    sizes = _split_sizes(builder)
    assert sorted(sizes) == ["dev_clean", "dev_other", "test_clean"] and len(set(sizes.values())) == 1
    assert set(build.reports(builder)) == set(sizes)  # the kept splits' build reports came back with them
    for split in sizes:  # every split reads back whole
        assert len(builder.as_data_source(split)) == sizes[split]


def test_a_kept_split_is_built_again_when_its_files_change_and_any_failure_keeps_the_finished_ones(
    tmp_path, monkeypatch
):
    """Not only archives: any failure mid-build (here a bug raising in the second split) keeps the
    splits finished before it; a kept split whose files changed since (a transcript edited) is built
    again, not taken."""
    manual, data_dir = tmp_path / "manual", str(tmp_path / "tfds")
    for split in ("dev-clean", "dev-other", "test-clean"):
        td.write_bad_inputs(str(manual / "LibriSpeech" / split))
    built = _counting_generators(monkeypatch)
    real = librispeech_local.make_example

    def fails_in_dev_other(utt_id, flac, transcript, report):
        if report.split == "dev-other":
            raise RuntimeError("a bug in the second split")
        return real(utt_id, flac, transcript, report)

    monkeypatch.setattr(librispeech_local, "make_example", fails_in_dev_other)
    with pytest.raises(RuntimeError, match="a bug in the second split"):
        build.build(str(manual), data_dir)
    assert built == ["dev-clean", "dev-other"]  # stopped at the failure: nothing after it is built
    monkeypatch.setattr(librispeech_local, "make_example", real)
    with open(manual / "LibriSpeech" / "dev-clean" / "1" / "10" / "1-10.trans.txt", "ab") as f:
        f.write(b"1-10-0099 AN EDIT\n")
    built.clear()
    builder = build.build(str(manual), data_dir)
    assert built == ["dev-clean", "dev-other", "test-clean"]  # dev-clean's kept copy no longer matched
    assert build.reports(builder)["dev_clean"]["transcripts_without_audio"] >= 1  # built from the edit


def test_a_full_disk_during_the_build_is_the_projects_disk_full_line(tmp_path, monkeypatch):
    """issue 40: a full disk while tfds writes the records was a traceback from inside tfds; now the
    disk-full line (errors.disk_full, the one training uses) naming data_dir, with nothing half-built left."""
    import errno

    from array_record.python import array_record_module

    from ds2_jax import errors

    real = array_record_module.ArrayRecordWriter

    class FullDisk:  # the records' writer, on a disk that fills after a few records
        def __init__(self, path, options):
            self.writer, self.count = real(path, options), 0

        def write(self, record):
            self.count += 1
            if self.count > 2:
                raise OSError(errno.ENOSPC, "No space left on device", "the record file")
            self.writer.write(record)

        def close(self):
            self.writer.close()

    manual = tmp_path / "manual"
    td.write_bad_inputs(str(manual / "LibriSpeech" / "dev-clean"))
    monkeypatch.setattr(array_record_module, "ArrayRecordWriter", FullDisk)
    data_dir = tmp_path / "tfds"
    with pytest.raises(errors.DiskFull) as full:
        build.build(str(manual), str(data_dir))
    message = str(full.value)
    assert (
        message.startswith(f"building librispeech_local in {data_dir} from {manual}: disk full (")
        and "MiB free in" in message
        and "--config.dataset.data_dir" in message
    ), message
    monkeypatch.undo()
    assert build.build(str(manual), str(data_dir)).is_prepared()  # the rerun after freeing space builds it


def test_a_second_build_into_one_fresh_data_dir_waits_for_the_first_and_uses_its_dataset(tmp_path, caplog):
    """issue 40: two builds (or two runs) into one fresh data_dir raced in tfds's temporary folders."""
    import fcntl
    import threading
    import time

    manual = tmp_path / "manual"
    td.write_bad_inputs(str(manual / "LibriSpeech" / "dev-clean"))
    data_dir = tmp_path / "tfds"
    data_dir.mkdir()
    built = []
    with open(data_dir / build.BUILD_LOCK, "a") as held:  # a first build holds the lock
        fcntl.flock(held, fcntl.LOCK_EX)
        with caplog.at_level("WARNING", logger="ds2_jax"):
            second = threading.Thread(target=lambda: built.append(build.build(str(manual), str(data_dir))))
            second.start()
            deadline = time.time() + 60
            while "another process is building" not in caplog.text and time.time() < deadline:
                second.join(0.05)
        second.join(3.0)  # a build of this corpus takes about a second: still waiting
        assert "another process is building librispeech_local" in caplog.text and not built  # it waits
        fcntl.flock(held, fcntl.LOCK_UN)
    second.join(120)
    assert built and built[0].is_prepared()


def test_a_kept_splits_key_changes_with_any_input_of_the_split(tmp_path):
    """kept_splits.key is the split's identity: the builder version, the split, where it is, and each
    file's name, size and mtime (a same-size edit too). Any one changed gives another key."""
    tree = tmp_path / "LibriSpeech" / "dev-clean"
    td.write_bad_inputs(str(tree))

    def key(version="1.1.0", split="dev-clean", kind="tree", path=str(tree)):
        return kept_splits.key(version, split, kind, path, librispeech_local.walk)

    transcript = tree / "1" / "10" / "1-10.trans.txt"
    seen = {key()}
    assert key() in seen  # the same files: the same key

    def changed(label: str) -> None:
        new = key()
        assert new not in seen, label
        seen.add(new)

    data = transcript.read_bytes()
    transcript.write_bytes(data.replace(b"1-10-0000", b"1-10-0009", 1))  # same size, new content
    os.utime(transcript, ns=(1, 10**18))  # and a new mtime
    changed("a same-size edit")
    os.utime(transcript, ns=(1, 2 * 10**18))
    changed("only the mtime")
    (tree / "1" / "10" / "1-10-0000.flac").rename(tree / "1" / "10" / "1-10-0020.flac")
    changed("a renamed file")
    (tree / "1" / "10" / "extra.flac").write_bytes(b"x")
    changed("an added file")
    before = os.stat(tree / "1" / "10" / "extra.flac")
    with open(tree / "1" / "10" / "extra.flac", "ab") as f:
        f.write(b"y")
    os.utime(tree / "1" / "10" / "extra.flac", ns=(before.st_atime_ns, before.st_mtime_ns))
    changed("only the size")
    for other in (key(version="1.2.0"), key(split="test-clean")):
        assert other not in seen
    archive = tmp_path / "dev-clean.tar.gz"
    td.tar_split(str(tree), str(archive))
    first = key(kind="tar", path=str(archive))
    before = os.stat(archive)
    with open(archive, "ab") as f:  # a longer download, its mtime kept
        f.write(b"\0")
    os.utime(archive, ns=(before.st_atime_ns, before.st_mtime_ns))
    grown = key(kind="tar", path=str(archive))
    os.utime(archive, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))  # touched
    assert len({first, grown, key(kind="tar", path=str(archive))}) == 3


def test_a_kept_split_of_several_shards_comes_back_in_its_order(tmp_path, monkeypatch):
    """A split written as 3 shards, kept by a failed build and taken back by the next one, reads the
    same records in the same order as the same split built whole in one go."""
    import functools

    monkeypatch.setattr(
        build.tfds.download, "DownloadConfig", functools.partial(build.tfds.download.DownloadConfig, num_shards=3)
    )
    manual = tmp_path / "manual"
    td.write_bad_inputs(str(manual / "LibriSpeech" / "dev-clean"))
    whole = build.build(str(manual), str(tmp_path / "whole"))
    staging = tmp_path / "staging" / "dev-other"
    td.write_bad_inputs(str(staging))
    archive = manual / "dev-other.tar.gz"
    td.tar_split(str(staging), str(archive))
    good = archive.read_bytes()
    archive.write_bytes(good[: len(good) // 2])
    with pytest.raises(errors.DamagedArchive):
        build.build(str(manual), str(tmp_path / "kept"))
    archive.write_bytes(good)
    built = _counting_generators(monkeypatch)
    again = build.build(str(manual), str(tmp_path / "kept"))
    assert built == ["dev-other"]  # dev-clean taken back
    assert again.info.splits["dev_clean"].shard_lengths == whole.info.splits["dev_clean"].shard_lengths
    assert len(whole.info.splits["dev_clean"].shard_lengths) == 3

    def ids(builder) -> list[str]:
        source = builder.as_data_source("dev_clean")
        return [source[i]["id"] for i in range(len(source))]

    assert ids(again) == ids(whole)


# ----------------------------------------------------------------------------- feasibility at equality, each builder


def _samples_for_frames(frames: int) -> int:
    """The fewest samples whose 2-conv model output has `frames` frames (the builders' CTC check)."""
    from ds2_jax import geometry

    n = 0
    while geometry.output_frames(geometry.num_frames(n), 2) < frames:
        n += 16
    while n > 0 and geometry.output_frames(geometry.num_frames(n - 1), 2) >= frames:
        n -= 1
    return n


@pytest.mark.parametrize("builder", ["librispeech_local", "manifest"])
def test_each_builder_keeps_an_utterance_whose_frames_equal_what_its_labels_need(tmp_path, builder):
    """The build-time CTC check of each builder at equality: frames exactly what the labels need (one
    per label, one more per repeat) are kept; one frame fewer is a counted ctc_infeasible skip."""
    import soundfile

    from ds2_jax import geometry, text
    from ds2_jax.datasets import build, manifest
    from ds2_jax.pipeline.source import DataSettings

    cases = []  # (id, samples, transcript, kept)
    for k, transcript in enumerate(["abcdefghij", "aabbcc ddee"]):  # 10 labels; 11 labels + 4 repeats
        need = geometry.ctc_min_frames(text.encode(transcript))
        n = _samples_for_frames(need)
        assert geometry.output_frames(geometry.num_frames(n - 1), 2) == need - 1
        cases += [(f"1-10-{2 * k:04d}", n, transcript, True), (f"1-10-{2 * k + 1:04d}", n - 1, transcript, False)]
    manual = tmp_path / "manual"
    if builder == "librispeech_local":
        td.write_chapter(
            str(manual / "LibriSpeech" / "train-clean-100"),
            1,
            10,
            {f"{i}.flac": td.flac_bytes(td.tone(n)) for i, n, _, _ in cases},
            "".join(f"{i} {t.upper()}\n" for i, _, t, _ in cases).encode(),
        )
        prepared = build.build(str(manual), str(tmp_path / "tfds"), "librispeech_local")
        split = "train_clean_100"
        report = json.load(open(librispeech_local.report_path(os.fspath(prepared.data_dir), split)))
    else:
        (manual / "clips").mkdir(parents=True)
        for i, n, _, _ in cases:
            soundfile.write(str(manual / "clips" / f"{i}.wav"), td.tone(n), td.RATE, subtype="PCM_16")
        (manual / "train.tsv").write_text("path\tsentence\n" + "".join(f"clips/{i}.wav\t{t}\n" for i, _, t, _ in cases))
        config = settings.override(
            settings.Settings(),
            {"dataset.name": "manifest", "dataset.manual_dir": str(manual), "dataset.train_splits": "train"},
        )
        options = manifest.Options.of(DataSettings.of(config).dataset, config.features.spectrogram)
        options = dataclasses.replace(options, workers=0, alphabet_min_count=1)
        prepared = build.build(str(manual), str(tmp_path / "tfds"), "manifest", options)
        split = "train"
        report = json.load(open(manifest.report_path(os.fspath(prepared.data_dir), split)))
    assert prepared.info.splits[split].num_examples == 2, report
    assert report["kept"] == 2 and report["skipped"]["ctc_infeasible"] == 2, report


def test_a_duplicate_utterance_id_is_a_counted_skip_not_a_tensorflow_error(tmp_path):
    """The same utterance id twice in a split (a chapter copied into another folder): the first kept,
    the second a duplicate_id skip; tfds would have stopped at its writer with an error that imports
    TensorFlow ("No module named 'tensorflow'")."""
    split_dir = str(tmp_path / "manual" / "LibriSpeech" / "dev-clean")
    td.write_chapter(split_dir, 1, 10, {"1-10-0000.flac": td.flac_bytes(td.tone(16000))}, b"1-10-0000 HELLO\n")
    d = os.path.join(split_dir, "1", "11")  # a copy of chapter 10's file under another chapter's folder
    td.write_chapter(split_dir, 1, 11, {"1-10-0000.flac": td.flac_bytes(td.tone(17000))}, None)
    with open(os.path.join(d, "1-10.trans.txt"), "wb") as f:
        f.write(b"1-10-0000 HELLO\n")
    builder = build.build(str(tmp_path / "manual"), str(tmp_path / "tfds"))
    with open(librispeech_local.report_path(os.fspath(builder.data_dir), "dev_clean")) as f:
        report = json.load(f)
    assert report["kept"] == 1 and report["skipped"]["duplicate_id"] == 1
    assert report["examples"]["duplicate_id"][0].startswith("1-10-0000")
    ds = builder.as_data_source("dev_clean")
    assert len(ds) == 1 and ds[0]["num_samples"] == 16000
