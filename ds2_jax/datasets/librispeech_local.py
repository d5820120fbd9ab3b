"""`librispeech_local`: a tfds builder over a LibriSpeech-layout manual directory.

The manual directory holds, for each split, either the extracted tree

    LibriSpeech/<split>/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac
    LibriSpeech/<split>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt

(`<split>/...` directly under the manual directory works too) or the archive
`<split>.tar.gz` as downloaded from openslr.org/12, which is streamed, never extracted.
Only the splits present are built. tfds split names cannot contain '-', so LibriSpeech's
`train-clean-100` becomes `train_clean_100` (every '-' -> '_'; `tfds_split` maps).

Every example is kept or skipped with a counted reason (`REASONS`); the counts and a few
example ids per reason go to `build_report_<split>.json` in the dataset's data dir.
Host code: no jax, no TensorFlow (audio is stored as raw int16 bytes, not tfds Audio).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import json
import logging
import os
import re
import tarfile
import zlib
from typing import Iterator

import numpy as np
import soundfile
import tensorflow_datasets as tfds

from ds2_jax import errors, files, geometry, text
from ds2_jax.datasets import kept_splits

SAMPLE_RATE = 16_000
# The conv stack the CTC feasibility check assumes (the default model's).
BUILD_NUM_CONV_LAYERS = 2
LIBRISPEECH_SPLITS = (
    "train-clean-100",
    "train-clean-360",
    "train-other-500",
    "dev-clean",
    "dev-other",
    "test-clean",
    "test-other",
)
# Why an utterance was skipped; the build report counts each one.
REASONS = (
    "corrupt_audio",  # soundfile could not decode the file
    "empty_audio",  # zero samples
    "wrong_sample_rate",  # not 16 kHz
    "not_mono",  # more than one channel
    "missing_transcript",  # no line for the utterance in its chapter's .trans.txt
    "empty_transcript",  # a line with an id but no words
    "unknown_chars",  # characters outside text.SYMBOLS after normalization
    "ctc_infeasible",  # more labels than the 2-conv model emits frames for the audio
    "duplicate_id",  # a second file of an utterance id in the split (a copied chapter): the first is kept
)
REPORT_EXAMPLES = 5  # Utterance ids kept per skip reason in the report.
_UTT_RE = re.compile(r"^(\d+)-(\d+)-(\d+)$")


def tfds_split(name: str) -> str:
    """'train-clean-100' or 'train_clean_100' -> 'train_clean_100'."""
    return name.replace("-", "_")


def report_path(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, f"build_report_{tfds_split(split)}.json")


def no_examples_message(report: "SplitReport", path: str) -> str:
    """Why a split has nothing to write, with a few of the skipped utterances."""
    examples = [e for reason in REASONS for e in report.examples.get(reason, [])][:REPORT_EXAMPLES]
    return (
        f"{report.summary()}: every utterance of {path} was skipped, nothing to build "
        f"(e.g. {'; '.join(examples) or 'no transcripts found'}). Fix or remove that split in dataset.manual_dir"
    )


@dataclasses.dataclass
class SplitReport:
    """What happened to every utterance of one split."""

    split: str
    kept: int = 0
    kept_samples: int = 0
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    examples: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    transcripts_without_audio: int = 0  # lines whose .flac is absent (summary: missing_audio)

    def skip(self, reason: str, utt_id: str, detail: str = "") -> None:
        assert reason in REASONS, reason
        self.skipped[reason] += 1
        if len(self.examples[reason]) < REPORT_EXAMPLES:
            self.examples[reason].append(f"{utt_id}: {detail}" if detail else utt_id)

    def to_json(self) -> dict:
        return {
            "split": self.split,
            "kept": self.kept,
            "kept_hours": round(self.kept_samples / SAMPLE_RATE / 3600, 4),
            "skipped": {r: self.skipped[r] for r in REASONS},
            "skipped_total": sum(self.skipped.values()),
            "examples": dict(self.examples),
            "transcripts_without_audio": self.transcripts_without_audio,
        }

    def summary(self) -> str:
        counts = {**self.skipped, "missing_audio": self.transcripts_without_audio}
        skipped = ", ".join(f"{r}={n}" for r, n in sorted(counts.items()) if n) or "none"
        total = self.kept + sum(counts.values())
        return (
            f"librispeech_local/{tfds_split(self.split)}: kept {self.kept} of {total} utterances "
            f"({self.kept_samples / SAMPLE_RATE / 3600:.2f} h); skipped: {skipped}"
        )


def parse_transcripts(data: bytes, where: str = ".trans.txt") -> dict[str, str]:
    """A chapter's .trans.txt -> {utterance id: raw transcript ('' if the line has none)}; text that is
    not UTF-8 is a ValueError naming `where` and the line (text.decode_file), never replaced."""
    out = {}
    for line in text.decode_file(data, where).splitlines():
        parts = line.strip().split(maxsplit=1)
        if parts:
            out[parts[0]] = parts[1] if len(parts) > 1 else ""
    return out


def make_example(utt_id: str, flac: bytes, transcript: str | None, report: SplitReport):
    """(key, example) for one utterance, or None after counting why it was skipped."""
    if transcript is None:
        return report.skip("missing_transcript", utt_id)
    normalized = text.normalize(transcript, strip_punctuation=False)  # LibriSpeech's: characters kept, then checked
    if not normalized:
        return report.skip("empty_transcript", utt_id)
    bad = text.unknown_chars(normalized)
    if bad:
        return report.skip("unknown_chars", utt_id, "".join(sorted(bad)))
    if not flac:  # libsndfile writes a 0-frame FLAC as a 0-byte file
        return report.skip("empty_audio", utt_id, "0 bytes")
    try:
        audio, rate = soundfile.read(io.BytesIO(flac), dtype="int16", always_2d=True)
    except Exception as e:  # noqa: BLE001 - any decoder failure is a corrupt file
        return report.skip("corrupt_audio", utt_id, f"{type(e).__name__}: {e}"[:200])
    if audio.shape[0] == 0:
        return report.skip("empty_audio", utt_id)
    if rate != SAMPLE_RATE:
        return report.skip("wrong_sample_rate", utt_id, str(rate))
    if audio.shape[1] != 1:
        return report.skip("not_mono", utt_id, f"{audio.shape[1]} channels")
    audio = np.ascontiguousarray(audio[:, 0])
    labels = text.encode(normalized)
    out_frames = geometry.output_frames(geometry.num_frames(len(audio)), BUILD_NUM_CONV_LAYERS)
    if out_frames < geometry.ctc_min_frames(labels):
        return report.skip("ctc_infeasible", utt_id, f"{len(labels)} labels, {out_frames} frames")
    speaker, chapter, _ = utt_id.split("-")
    report.kept += 1
    report.kept_samples += len(audio)
    return utt_id, {
        "audio": audio,
        "text": normalized,
        "speaker_id": int(speaker),
        "chapter_id": int(chapter),
        "id": utt_id,
        "num_samples": len(audio),
    }


def _utt_id(name: str) -> str | None:
    stem = os.path.basename(name)[: -len(".flac")]
    return stem if _UTT_RE.match(stem) else None


def walk(top: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """os.walk in sorted order, following symbolic links to folders (a speaker linked in from
    another disk belongs to the split), each real folder read once: a link to a folder already
    read (a loop, or a second link) is named in a warning and not read again."""
    seen: set[str] = set()
    for root, dirs, names in os.walk(top, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            logging.warning(
                "%s links to %s, which is already read: not read again (a loop or a second link)", root, real
            )
            dirs[:] = []
            continue
        seen.add(real)
        dirs.sort()
        yield root, dirs, sorted(names)


def generate_from_tree(split_dir: str, report: SplitReport) -> Iterator:
    """Walks <split>/<speaker>/<chapter>/ in sorted order (`walk`); one chapter in memory at a time."""
    for root, dirs, names in walk(split_dir):
        flacs = sorted(f for f in names if f.endswith(".flac"))
        trans_files = [f for f in names if f.endswith(".trans.txt")]
        transcripts = {}
        for name in trans_files:
            with open(os.path.join(root, name), "rb") as f:
                transcripts.update(parse_transcripts(f.read(), os.path.join(root, name)))
        seen = set()
        for name in flacs:
            utt_id = _utt_id(name)
            if utt_id is None:
                logging.warning("ignoring %s: not named <speaker>-<chapter>-<utt>.flac", name)
                continue
            seen.add(utt_id)
            try:
                with open(os.path.join(root, name), "rb") as f:
                    flac = f.read()
            except OSError as e:  # a broken link, a file of another user's: counted, never a silent drop
                report.skip("corrupt_audio", utt_id, f"unreadable: {e.strerror or e}")
                continue
            ex = make_example(utt_id, flac, transcripts.get(utt_id), report)
            if ex is not None:
                yield ex
        report.transcripts_without_audio += len(set(transcripts) - seen)


def generate_from_tar(path: str, report: SplitReport) -> Iterator:
    """Streams a LibriSpeech .tar.gz (mode 'r|gz': sequential, nothing extracted).

    A chapter's .flac files may come before its .trans.txt, so they wait in memory until
    it arrives; archives are grouped by chapter, so that is one chapter at most.
    """
    try:
        yield from _generate_from_tar(path, report)
    except (EOFError, tarfile.TarError, zlib.error, OSError) as e:  # cut short mid-download, or damaged
        raise damaged_archive(path, e) from e


def damaged_archive(path: str, cause: BaseException) -> errors.DamagedArchive:
    return errors.DamagedArchive(
        f"{path} is truncated or damaged ({type(cause).__name__}: {cause}): download it again (and check "
        "its size against openslr.org/12); the other splits were built and are kept (datasets.kept_splits), "
        "so the next build makes only this one"
    )


def damaged_in(error: BaseException) -> errors.DamagedArchive | None:
    """The DamagedArchive that `error` is or was raised from (tfds's writer may wrap it), if any."""
    while error is not None:
        if isinstance(error, errors.DamagedArchive):
            return error
        error = error.__cause__ or error.__context__
    return None


def _generate_from_tar(path: str, report: SplitReport) -> Iterator:
    transcripts: dict[str, dict[str, str]] = {}  # chapter -> {utt id: text}
    pending: dict[str, list[tuple[str, bytes]]] = collections.defaultdict(list)
    seen: set[str] = set()
    with tarfile.open(path, mode="r|gz") as tar:
        for member in tar:
            if not member.isfile():
                continue
            name = member.name
            if name.endswith(".trans.txt"):
                chapter = os.path.basename(name)[: -len(".trans.txt")]
                transcripts[chapter] = parse_transcripts(tar.extractfile(member).read(), f"{path}:{name}")
                for utt_id, flac in pending.pop(chapter, []):
                    ex = make_example(utt_id, flac, transcripts[chapter].get(utt_id), report)
                    if ex is not None:
                        yield ex
            elif name.endswith(".flac"):
                utt_id = _utt_id(name)
                if utt_id is None:
                    logging.warning("ignoring %s: not named <speaker>-<chapter>-<utt>.flac", name)
                    continue
                seen.add(utt_id)
                chapter = utt_id.rsplit("-", 1)[0]
                flac = tar.extractfile(member).read()
                if chapter in transcripts:
                    ex = make_example(utt_id, flac, transcripts[chapter].get(utt_id), report)
                    if ex is not None:
                        yield ex
                else:
                    pending[chapter].append((utt_id, flac))
    for chapter, utts in sorted(pending.items()):  # chapters that never got a .trans.txt
        for utt_id, _ in utts:
            report.skip("missing_transcript", utt_id)
    report.transcripts_without_audio += sum(1 for lines in transcripts.values() for u in lines if u not in seen)


def find_splits(manual_dir: str) -> dict[str, tuple[str, str]]:
    """LibriSpeech split -> ('tree' | 'tar', path) for every split present in manual_dir.

    An extracted tree wins over an archive of the same split.
    """
    found = {}
    for split in LIBRISPEECH_SPLITS:
        for d in (os.path.join(manual_dir, "LibriSpeech", split), os.path.join(manual_dir, split)):
            if os.path.isdir(d):
                found[split] = ("tree", d)
                break
        else:
            archive = os.path.join(manual_dir, f"{split}.tar.gz")
            if os.path.isfile(archive):
                found[split] = ("tar", archive)
    return found


@contextlib.contextmanager
def quiet_tfds():
    """Hides what tfds says about a download that a local build does not make: its
    'Downloading and preparing dataset Unknown size' and 'downloaded and prepared' prints
    (stdout) and its 'Variant folder ... has no dataset_info.json' warnings (absl), which
    only mean 'not built yet'. Our own per-split reports (the root logger) still show."""
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        absl_logger.setLevel(level)


class LibrispeechLocal(tfds.core.GeneratorBasedBuilder):
    """LibriSpeech from a local tree or local .tar.gz archives (16 kHz int16, no TF)."""

    name = "librispeech_local"
    VERSION = tfds.core.Version("1.1.0")
    RELEASE_NOTES = {
        "1.0.0": "Raw int16 audio, normalized text, skipped-utterance reports.",
        "1.1.0": "Records stored uncompressed (ds2_jax.datasets.build): no brotli decoding per random read.",
    }
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Put LibriSpeech/<split>/... (extracted) or <split>.tar.gz archives from "
        "https://www.openslr.org/12 in the manual dir (config.dataset.manual_dir)."
    )

    def __init__(self, **kwargs):
        kwargs.setdefault("file_format", "array_record")  # random access without TF
        super().__init__(**kwargs)
        self._building: dict[str, tuple[str, str]] = {}  # the split being built: LibriSpeech name -> (kind, path)

    def is_prepared(self) -> bool:
        with quiet_tfds():
            return super().is_prepared()

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {
                    "audio": tfds.features.Tensor(shape=(None,), dtype=np.int16, encoding=tfds.features.Encoding.BYTES),
                    "text": tfds.features.Text(),
                    "speaker_id": np.int64,
                    "chapter_id": np.int64,
                    "id": tfds.features.Text(),
                    "num_samples": np.int64,
                }
            ),
            supervised_keys=("audio", "text"),
            homepage="https://www.openslr.org/12",
        )

    def _split_generators(self, dl_manager):
        """The one split _download_and_prepare is building now."""
        return {tfds_split(s): self._generate_examples(s, kind, path) for s, (kind, path) in self._building.items()}

    def _download_and_prepare(self, dl_manager, download_config=None) -> None:
        """Builds the manual dir's splits one at a time, keeping each as it is finished
        (datasets.kept_splits) and taking back those a failed build of the same files kept. A damaged
        archive skips its split and the others still build; then it is raised."""
        manual_dir = os.fspath(dl_manager.manual_dir)
        found = find_splits(manual_dir)
        if not found:
            raise FileNotFoundError(
                f"no LibriSpeech split (LibriSpeech/<split>/ or <split>.tar.gz for <split> in "
                f"{', '.join(LIBRISPEECH_SPLITS)}) in manual dir {manual_dir!r}"
            )
        logging.info("librispeech_local: building %s", {s: p for s, (_, p) in found.items()})
        data_dir = os.fspath(self.data_dir)  # the build's temporary folder
        dataset_root = os.path.dirname(os.path.normpath(data_dir))  # <data_dir>/librispeech_local
        infos, damaged = [], []
        for split, (kind, path) in found.items():
            name = tfds_split(split)
            split_key = kept_splits.key(str(self.VERSION), split, kind, path, walk)
            info = kept_splits.take(dataset_root, name, split_key, self._get_filename_template(split_name=name))
            if info is None:
                self._building = {split: (kind, path)}
                try:
                    super()._download_and_prepare(dl_manager, download_config or tfds.download.DownloadConfig())
                except Exception as e:
                    archive_error = damaged_in(e)
                    if archive_error is None:
                        raise
                    logging.error("%s", archive_error)
                    damaged.append(archive_error)
                    continue
                info = self.info.splits[name]
                extra = [os.path.basename(report_path(data_dir, split))]
                kept_splits.save(dataset_root, info, split_key, data_dir, extra)
            infos.append(info)
        if damaged:
            raise damaged[0]
        self.info.set_splits(tfds.core.SplitDict(infos))
        kept_splits.clear(dataset_root)

    def _generate_examples(self, split: str, kind: str, path: str):
        report = SplitReport(split)
        gen = generate_from_tree if kind == "tree" else generate_from_tar
        seen: set[str] = set()
        for key, example in gen(path, report):
            if key in seen:  # tfds would stop the build at its writer, with an error that needs TensorFlow
                report.kept -= 1
                report.kept_samples -= example["num_samples"]
                report.skip("duplicate_id", key, "a second file of this utterance id in the split: the first kept")
                continue
            seen.add(key)
            yield key, example
        # Runs once the writer has drained the generator; data_dir is the build's
        # temporary dir here, which tfds renames to the final one on success.
        files.write_text(report_path(os.fspath(self.data_dir), split), json.dumps(report.to_json(), indent=1))
        # A warning when anything was dropped, so a skip is never silent.
        dropped = sum(report.skipped.values()) + report.transcripts_without_audio
        logging.log(logging.WARNING if dropped else logging.INFO, "%s", report.summary())
        if not report.kept:  # tfds would fail with "No examples were yielded"
            raise ValueError(no_examples_message(report, path))
