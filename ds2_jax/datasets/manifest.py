"""`manifest`: a tfds builder over your own speech, read from the manifests you have.

Every `<split>.tsv`, `.csv`, `.jsonl` or `.json` (JSON lines) file of the manual directory
is a split named `<split>` (characters other than letters, digits and '_' become '_'):

- Common Voice: TSV with `path` and `sentence` columns, audio under `clips/`;
- NeMo: JSON lines with `audio_filepath`, `text` (and `duration`, unused: the audio counts);
- any CSV/TSV with a header (Mozilla DeepSpeech's `wav_filename,wav_filesize,transcript` too):
  the audio and text columns are known names (`PATH_COLUMNS`, `TEXT_COLUMNS`) or
  dataset.path_column / dataset.text_column.

Relative audio paths resolve against the manifest's folder, then its `clips/`. An
utterance's id is its audio path relative to that folder without the extension
(`clips/common_voice_es_1`), so the same clips listed by two layouts get the same ids.
Common Voice's supersets and side files (`CV_SIDE_FILES`: validated, invalidated, ...) are
built only when dataset.manifest_splits names them.

Audio (FLAC, WAV, OGG/Opus, MP3) is decoded and resampled once to features.sample_rate, and
each shard of array_record examples written whole, by worker processes (datasets.shards;
dataset.build_workers); the records and their order are tfds's own, whatever the worker
count. Transcripts go through text.normalize (dataset.lower_case,
dataset.strip_punctuation); the alphabet is dataset.vocabulary's or the characters of the
train splits' transcripts seen at least dataset.alphabet_min_count times (a rarer one is
left out, named in the build reports, and its utterances are `unknown_chars` skips: a label
seen once cannot be learnt, and dropping it from the text would teach wrong transcripts),
written to `alphabet.txt` beside the prepared data. Every utterance is kept or skipped with a counted
reason (`REASONS`, with its file and line); characters outside the alphabet are counted
too (`build_report_<split>.json`). A manifest that cannot be read as one (no text column,
an asked split without a file) is a ValueError naming the file and line.
Host code: no jax, no TensorFlow.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
from typing import Iterator, NamedTuple

import numpy as np
import tensorflow_datasets as tfds

from ds2_jax import settings, text
from ds2_jax.datasets import shards

SUFFIXES = (".tsv", ".csv", ".jsonl", ".json")
PATH_COLUMNS = ("path", "audio_filepath", "audio_path", "wav_filename", "audio", "file", "filename", "wav")
TEXT_COLUMNS = ("sentence", "text", "transcript", "transcription", "normalized_text")
SPEAKER_COLUMNS = ("client_id", "speaker", "speaker_id")
# Common Voice files that are no split of their own (supersets of train/dev/test, or side lists).
CV_SIDE_FILES = (
    "validated",
    "invalidated",
    "other",
    "reported",
    "clip_durations",
    "validated_sentences",
    "unvalidated_sentences",
)
ALPHABET_FILE = "alphabet.txt"  # beside the prepared data: the labels' alphabet (text.read_vocabulary)
# Why an utterance was skipped; the build report counts each one.
REASONS = (
    "bad_line",  # a manifest line that does not parse, or lacks the audio path or text
    "duplicate_id",  # an id (audio path) listed before in the same manifest
    "missing_audio",  # the audio file is not there
    "corrupt_audio",  # soundfile could not decode it (anywhere in it), or it holds NaN or infinite samples
    "truncated_audio",  # shorter than its header declares (a cut download or copy)
    "empty_audio",  # zero samples
    "not_mono",  # several channels with dataset.stereo='skip'
    "empty_transcript",  # nothing left after normalization
    "unknown_chars",  # characters outside the alphabet (a given dataset.vocabulary)
    "ctc_infeasible",  # more labels than the 2-conv model emits frames for the audio
    "failed",  # the file's build work raised (the error named in the report): that file alone is left out
)
REPORT_EXAMPLES = 5  # Utterances named per skip reason in the report.
TOP_UNKNOWN = 10  # Characters outside the alphabet named in a summary.


def tfds_split(name: str) -> str:
    """A manifest's split name as tfds spells it: 'train-clean' -> 'train_clean'."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


# ----------------------------------------------------------------------------- options


@dataclasses.dataclass(frozen=True)
class Options:
    """What a manifest build reads (from dataset.* and features.*: `of`)."""

    sample_rate: int = 16_000
    window: int = 320  # samples (the CTC feasibility check)
    hop: int = 160
    vocabulary: str = ""
    lower_case: bool = True
    strip_punctuation: bool = True
    path_column: str = ""
    text_column: str = ""
    stereo: str = "downmix"
    train_splits: str = "train"
    manifest_splits: str = ""
    workers: int = -1
    alphabet_min_count: int = 2

    @classmethod
    def of(cls, d: settings.Dataset, spec: settings.Spectrogram) -> Options:
        """From a run's dataset.* settings and its spectrogram (features.*)."""
        return cls(
            sample_rate=spec.sample_rate,
            window=spec.window,
            hop=spec.hop,
            vocabulary=d.vocabulary,
            lower_case=d.lower_case,
            strip_punctuation=d.strip_punctuation,
            path_column=d.path_column,
            text_column=d.text_column,
            stereo=d.stereo,
            train_splits=d.train_splits,
            manifest_splits=d.manifest_splits,
            workers=d.build_workers,
            alphabet_min_count=d.alphabet_min_count,
        )

    def normalize(self, transcript: str) -> str:
        return text.normalize(transcript, self.lower_case, self.strip_punctuation)

    def record(self) -> dict:
        """The options that shape the prepared data (compared when it is opened again)."""
        vocab = ""
        if self.vocabulary:
            with open(self.vocabulary, "rb") as f:
                vocab = hashlib.sha256(f.read()).hexdigest()[:16]
        return {
            "sample_rate": self.sample_rate,
            "vocabulary": vocab,
            "lower_case": self.lower_case,
            "strip_punctuation": self.strip_punctuation,
            "path_column": self.path_column,
            "text_column": self.text_column,
            "stereo": self.stereo,
            "alphabet_min_count": 0 if self.vocabulary else self.alphabet_min_count,
        }

    def num_workers(self) -> int:
        return (os.cpu_count() or 1) if self.workers < 0 else self.workers


# ----------------------------------------------------------------------------- reading manifests


@dataclasses.dataclass
class Entry:
    """One utterance line of a manifest."""

    line: int
    id: str
    audio: str  # the resolved path
    text: str  # as written
    speaker: str = ""
    normalized: str = ""  # text.normalize'd with the build's options (read_manifests)


@dataclasses.dataclass
class Manifest:
    """A manifest file read: its utterances and the lines that gave none."""

    split: str
    path: str
    entries: list[Entry]
    bad_lines: list[tuple[int, str]]  # (line, why)

    @property
    def where(self) -> str:
        return self.path


def split_of(path: str) -> str:
    return tfds_split(os.path.basename(path).rsplit(".", 1)[0])


def find_manifests(manual_dir: str, wanted: str = "", every: bool = False) -> dict[str, str]:
    """tfds split -> manifest path of every manifest in `manual_dir` (or the '+'-separated
    `wanted` ones: a name without a file is a ValueError naming the files there; `every`: all
    manifests there, side files included)."""
    found: dict[str, str] = {}
    for name in sorted(os.listdir(manual_dir)):
        full = os.path.join(manual_dir, name)
        if name.lower().endswith(SUFFIXES) and os.path.isfile(full):
            split = split_of(name)
            if split in found:
                raise ValueError(
                    f"{full}: split {split!r} has two manifests ({os.path.basename(found[split])} and "
                    f"{name}) in {manual_dir}: keep one"
                )
            found[split] = full
    if every:
        return found
    if wanted:
        names = [tfds_split(s.strip()) for s in wanted.split("+") if s.strip()]
        missing = [s for s in names if s not in found]
        if missing:
            raise ValueError(
                f"dataset.manifest_splits={wanted!r}: no manifest for {missing} in {manual_dir} (it has "
                f"{sorted(found) or 'none'}: <split>.tsv, .csv, .jsonl or .json)"
            )
        return {s: found[s] for s in names}
    return {s: p for s, p in found.items() if s not in CV_SIDE_FILES}


def no_manifest(manual_dir: str, options: Options) -> str:
    """Why `manual_dir` gives no split: no manifest with utterances, or only Common Voice's side files
    (validated.tsv, ...), which are built when dataset.manifest_splits names them."""
    side = [s for s in CV_SIDE_FILES if s in find_manifests(manual_dir, every=True)]
    if side and not options.manifest_splits:
        return (
            f"{manual_dir} holds no train/dev/test manifest, only Common Voice's {', '.join(side)} (supersets and "
            f"side lists, not built unless asked): to train on {side[0]}.tsv set dataset.manifest_splits={side[0]} "
            f"and dataset.train_splits={side[0]} (--config.dataset.manifest_splits=... for the build too), or "
            "split it into train.tsv, dev.tsv and test.tsv"
        )
    return (
        f"no manifest with utterances in {manual_dir} (<split>.tsv, .csv, .jsonl or .json with an audio path and "
        "a text column)"
    )


def _column(columns: list[str], setting: str, known: tuple[str, ...]) -> str | None:
    if setting:
        return setting if setting in columns else None
    lower = {c.lower(): c for c in columns}
    return next((lower[k] for k in known if k in lower), None)


def _no_column(path: str, line: int, kind: str, setting: str, known, columns) -> ValueError:
    if setting:
        return ValueError(
            f"{path}:{line}: no {kind} column {setting!r} (dataset.{kind}_column); its columns are {columns}"
        )
    return ValueError(
        f"{path}:{line}: no {kind} column (none of {list(known)}; its columns are {columns}): set "
        f"dataset.{kind}_column to the column holding the {kind}"
    )


def _resolve(folder: str, audio_path: str) -> str:
    """The audio file a manifest names: absolute, or relative to its folder, then folder/clips/."""
    if os.path.isabs(audio_path):
        return audio_path
    first = os.path.normpath(os.path.join(folder, audio_path))
    if os.path.exists(first):
        return first
    clips = os.path.normpath(os.path.join(folder, "clips", audio_path))
    return clips if os.path.exists(clips) else first


def _utterance_id(folder: str, resolved: str) -> str:
    rel = os.path.relpath(resolved, folder)
    if rel.startswith(".."):
        rel = resolved
    return os.path.splitext(rel)[0].replace(os.sep, "/")


class _NotJson(NamedTuple):
    msg: str


def _json_array(path: str, data: str) -> Iterator[tuple[int, object]]:
    """(line, item) of a file that is one JSON array (NeMo's tools write JSON lines, people write arrays)."""
    decoder, i = json.JSONDecoder(), data.index("[") + 1
    try:
        while True:
            while i < len(data) and data[i].isspace():
                i += 1
            if data.startswith("]", i):
                return
            item, end = decoder.raw_decode(data, i)
            yield data.count("\n", 0, i) + 1, item
            i = end
            while i < len(data) and data[i].isspace():
                i += 1
            if data.startswith(",", i):
                i += 1
            elif not data.startswith("]", i):
                raise json.JSONDecodeError("expected ',' or ']'", data, i)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path}:{e.lineno}: the file is one JSON array (it starts with '[') that does not parse: {e.msg} "
            f"(column {e.colno}). Fix it, or write the manifest as JSON lines: one object a line"
        ) from e


def _json_records(path: str, lines) -> Iterator[tuple[int, object]]:
    """(line, object or _NotJson) of a JSON-lines manifest, or of the items of a JSON-array one."""
    lines = list(lines)
    first = next((line for line in lines if line.strip()), "")
    if first.lstrip().startswith("["):
        yield from _json_array(path, "".join(lines))
        return
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue  # a blank line is no utterance
        try:
            yield number, json.loads(line)
        except ValueError as e:
            yield number, _NotJson(e.msg)


def read_manifest(path: str, options: Options) -> Manifest | None:
    """The utterances of one manifest; None for a table with no audio column but a text one
    (a list of sentences, e.g. Common Voice's reported.tsv), which is no split."""
    folder = os.path.dirname(os.path.abspath(path))
    entries: list[Entry] = []
    bad: list[tuple[int, str]] = []

    def add(line: int, audio_path, transcript, speaker="") -> None:
        if not isinstance(audio_path, str) or not audio_path.strip():
            bad.append((line, "no audio path"))
        elif not isinstance(transcript, str):
            bad.append((line, "no text"))
        else:
            resolved = _resolve(folder, audio_path.strip())
            entries.append(Entry(line, _utterance_id(folder, resolved), resolved, transcript, str(speaker or "")))

    with contextlib.closing(text.text_lines(path)) as f:  # UTF-8 or UTF-16 with a BOM, else a ValueError
        if path.lower().endswith((".jsonl", ".json")):
            path_key = text_key = None
            for number, obj in _json_records(path, f):
                if isinstance(obj, _NotJson):
                    bad.append((number, f"not JSON ({obj.msg})"))
                    continue
                if not isinstance(obj, dict):
                    bad.append((number, f"a JSON {type(obj).__name__}, not an object"))
                    continue
                if path_key is None:  # the first object names the columns
                    columns = list(obj)
                    path_key = _column(columns, options.path_column, PATH_COLUMNS)
                    text_key = _column(columns, options.text_column, TEXT_COLUMNS)
                    if text_key is None:
                        raise _no_column(path, number, "text", options.text_column, TEXT_COLUMNS, columns)
                    if path_key is None:
                        raise _no_column(path, number, "path", options.path_column, PATH_COLUMNS, columns)
                speaker_key = next((k for k in SPEAKER_COLUMNS if k in obj), None)
                add(number, obj.get(path_key), obj.get(text_key), obj.get(speaker_key, "") if speaker_key else "")
        else:
            tsv = path.lower().endswith(".tsv")
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if tsv else csv.reader(f)
            header = next(reader, None)
            if header is None:
                return Manifest(split_of(path), path, [], [])
            path_col = _column(header, options.path_column, PATH_COLUMNS)
            text_col = _column(header, options.text_column, TEXT_COLUMNS)
            if path_col is None and text_col is not None and not options.path_column:
                return None
            if text_col is None:
                raise _no_column(path, 1, "text", options.text_column, TEXT_COLUMNS, header)
            if path_col is None:
                raise _no_column(path, 1, "path", options.path_column, PATH_COLUMNS, header)
            p, t = header.index(path_col), header.index(text_col)
            s = next((header.index(c) for c in header if c.lower() in SPEAKER_COLUMNS), None)
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    break
                except csv.Error as e:
                    bad.append((reader.line_num, f"not {'TSV' if tsv else 'CSV'} ({e})"))
                    continue
                if not any(cell.strip() for cell in row):
                    continue  # a blank line is no utterance
                if len(row) != len(header):
                    bad.append((reader.line_num, f"{len(row)} fields, the header has {len(header)}"))
                    continue
                add(reader.line_num, row[p], row[t], row[s] if s is not None else "")
    return Manifest(split_of(path), path, entries, bad)


def read_manifests(manual_dir: str, options: Options) -> dict[str, Manifest]:
    """split -> Manifest of every manifest to build (find_manifests); tables of sentences
    without audio and manifests without utterances are left out with a warning."""
    out = {}
    for split, path in find_manifests(manual_dir, options.manifest_splits).items():
        m = read_manifest(path, options)
        if m is None:
            logging.warning("manifest: ignoring %s: no audio path column (a list of sentences, not a split)", path)
        elif not m.entries and not m.bad_lines:
            logging.warning("manifest: %s lists no utterances (a header at most): split %r not built", path, split)
        else:
            for e in m.entries:
                e.normalized = options.normalize(e.text)
            out[split] = m
    return out


# ----------------------------------------------------------------------------- the alphabet


def make_alphabet(manifests: dict[str, Manifest], options: Options) -> tuple[text.Alphabet, str, dict[str, int]]:
    """(alphabet, where it came from, the rare characters left out -> their count): dataset.vocabulary's,
    else the characters of the normalized transcripts of the train splits (dataset.train_splits) present,
    less those seen fewer than dataset.alphabet_min_count times there."""
    if options.vocabulary:
        try:
            return text.read_vocabulary(options.vocabulary), f"dataset.vocabulary={options.vocabulary}", {}
        except OSError as e:
            raise FileNotFoundError(f"dataset.vocabulary={options.vocabulary!r}: {e.strerror or e}") from e
    wanted = [tfds_split(s.strip()) for s in options.train_splits.split("+") if s.strip()]
    present = [s for s in wanted if s in manifests]
    if not present:
        raise ValueError(
            f"dataset.train_splits={options.train_splits!r} names no manifest to derive the alphabet "
            f"from (the manifests are {sorted(manifests) or 'none'}): set dataset.train_splits to the "
            "training split(s), or give dataset.vocabulary"
        )
    counts = collections.Counter()
    for s in present:
        for e in manifests[s].entries:
            counts.update(e.normalized)
    if not counts:  # no transcript at all: the manifests' fault, not the minimum count's
        bad = [f"{manifests[s].path}:{n}: {why}" for s in present for n, why in manifests[s].bad_lines]
        raise ValueError(
            f"{' and '.join(manifests[s].path for s in present)} hold no transcript to derive the alphabet from"
            f" ({sum(len(manifests[s].entries) for s in present)} utterances with text, {len(bad)} lines that "
            f"are none{': e.g. ' + '; '.join(bad[:3]) if bad else ''}): fix the manifest"
        )
    rare = {c: n for c, n in sorted(counts.items(), key=lambda kv: (kv[1], kv[0])) if n < options.alphabet_min_count}
    if len(rare) == len(counts):
        raise ValueError(
            f"no character of the transcripts of {'+'.join(present)} is seen dataset.alphabet_min_count="
            f"{options.alphabet_min_count} times: lower it, or give dataset.vocabulary"
        )
    alphabet = text.derive([c for c in counts if c not in rare])
    source = f"the transcripts of {'+'.join(present)}"
    if options.alphabet_min_count > 1:
        source += f", characters seen >= {options.alphabet_min_count} times (dataset.alphabet_min_count)"
    return alphabet, source, rare


def read_alphabet(data_dir: str) -> text.Alphabet:
    """The alphabet stored with a prepared manifest dataset."""
    path = os.path.join(data_dir, ALPHABET_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} is missing: the prepared manifest data in {data_dir} is incomplete; delete "
            f"{os.path.dirname(data_dir)} to rebuild it"
        )
    return text.read_vocabulary(path)


# ----------------------------------------------------------------------------- the build report


@dataclasses.dataclass
class Report:
    """What happened to every line of one manifest."""

    split: str
    manifest: str
    sample_rate: int
    kept: int = 0
    kept_samples: int = 0
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    examples: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    unknown: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # char -> utterances
    rare: dict = dataclasses.field(default_factory=dict)  # char -> times in the train splits, left out of the alphabet
    clipped: dict = dataclasses.field(default_factory=dict)  # "file:line: audio" -> samples clipped (kept)
    shared: list = dataclasses.field(default_factory=list)  # "file:line: audio (also in split S)": in two splits

    def skip(self, reason: str, where: str, detail: str = "") -> None:
        assert reason in REASONS, reason
        self.skipped[reason] += 1
        if len(self.examples[reason]) < REPORT_EXAMPLES:
            self.examples[reason].append(f"{where}: {detail}" if detail else where)

    def to_json(self) -> dict:
        return {
            "split": self.split,
            "manifest": self.manifest,
            "kept": self.kept,
            "kept_hours": round(self.kept_samples / self.sample_rate / 3600, 4),
            "sample_rate": self.sample_rate,
            "skipped": {r: self.skipped[r] for r in REASONS},
            "skipped_total": sum(self.skipped.values()),
            "examples": dict(self.examples),
            "unknown_chars": dict(self.unknown.most_common()),
            "rare_chars": self.rare,
            "audio_in_other_splits": len(self.shared),
            "audio_in_other_splits_examples": self.shared[:REPORT_EXAMPLES],
            "clipped_utterances": len(self.clipped),
            "clipped_samples": sum(self.clipped.values()),
            "clipped_examples": dict(list(self.clipped.items())[:REPORT_EXAMPLES]),
            "transcripts_without_audio": 0,
        }

    def summary(self) -> str:
        return summary(self.to_json())


def unknown_summary(counts: dict) -> str:
    """ "'ß' in 3 utterances, 'ø' in 1" of the most frequent characters outside the alphabet."""
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:TOP_UNKNOWN]
    more = f" and {len(counts) - TOP_UNKNOWN} more" if len(counts) > TOP_UNKNOWN else ""
    return ", ".join(f"{c!r} in {n}" for c, n in top) + more


def rare_summary(rare: dict) -> str:
    """ "'ø' 1 time, 'ß' 1 time" of the characters left out of a derived alphabet (dataset.alphabet_min_count)."""
    more = f" and {len(rare) - TOP_UNKNOWN} more" if len(rare) > TOP_UNKNOWN else ""
    return ", ".join(f"{c!r} {n} time{'s' * (n != 1)}" for c, n in list(rare.items())[:TOP_UNKNOWN]) + more


def summary(report: dict) -> str:
    """One line: kept, skipped by reason, the characters outside the alphabet."""
    skipped = ", ".join(f"{r}={n}" for r, n in report["skipped"].items() if n) or "none"
    total = report["kept"] + report["skipped_total"]
    line = (
        f"manifest/{report['split']}: kept {report['kept']} of {total} utterances ({report['kept_hours']:.2f} h)"
        f"; skipped: {skipped}"
    )
    if report.get("unknown_chars"):
        line += f"; outside the alphabet: {unknown_summary(report['unknown_chars'])}"
    if report.get("audio_in_other_splits"):
        line += (
            f"; {report['audio_in_other_splits']} audio files also listed in another split (e.g. "
            f"{report['audio_in_other_splits_examples'][0]}): a split scored on audio another trains on"
        )
    if report.get("clipped_utterances"):
        line += (
            f"; clipped to int16: {report['clipped_samples']} samples beyond [-1, 1] in "
            f"{report['clipped_utterances']} kept utterances (e.g. {next(iter(report['clipped_examples']))})"
        )
    if report.get("rare_chars"):
        line += f"; too rare for the alphabet (dataset.alphabet_min_count): {rare_summary(report['rare_chars'])}"
    return line


def report_path(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, f"build_report_{tfds_split(split)}.json")


# ----------------------------------------------------------------------------- building


def features() -> tfds.features.FeaturesDict:
    """The examples' features (the builder's, and each build worker's encoder)."""
    return tfds.features.FeaturesDict(
        {
            "audio": tfds.features.Tensor(shape=(None,), dtype=np.int16, encoding=tfds.features.Encoding.BYTES),
            "text": tfds.features.Text(),
            "id": tfds.features.Text(),
            "speaker": tfds.features.Text(),
            "num_samples": np.int64,
        }
    )


def to_write(
    m: Manifest, alphabet: text.Alphabet, report: Report, fixed_alphabet: bool, rare: dict[str, int] | None = None
) -> list[tuple]:
    """(position, id, audio path, normalized text, speaker) of the utterances of `m` whose audio is to be
    read, in manifest order; every line left out before that is a skip counted in `report`."""
    for number, why in m.bad_lines:
        report.skip("bad_line", f"{m.path}:{number}", why)
    todo, seen = [], {}
    for e in m.entries:
        where = f"{m.path}:{e.line}"
        if e.id in seen:
            report.skip("duplicate_id", where, f"{e.id} (first on line {seen[e.id]})")
            continue
        seen[e.id] = e.line
        if not e.normalized:
            report.skip("empty_transcript", where, e.id)
            continue
        bad = alphabet.unknown_chars(e.normalized)
        if bad:
            report.unknown.update(bad)
            why = (
                ""
                if fixed_alphabet
                else " (seen fewer than dataset.alphabet_min_count times in the train splits)"
                if rare and bad <= rare.keys()
                else " (not in the train splits)"
            )
            report.skip("unknown_chars", where, "".join(sorted(bad)) + why)
            continue
        todo.append((len(todo), e.id, e.audio, e.normalized, e.speaker))
    return todo


def shared_audio(manifests: dict[str, Manifest], reports: dict[str, Report]) -> int:
    """Counts, in each split's report, its utterances whose audio file another split lists too (the
    same clip in train and test); their number (each file once)."""
    splits_of: dict[str, list[str]] = collections.defaultdict(list)
    for split, m in manifests.items():
        for audio in dict.fromkeys(os.path.realpath(e.audio) for e in m.entries):
            splits_of[audio].append(split)
    shared = {a: s for a, s in splits_of.items() if len(s) > 1}
    for split, m in manifests.items():
        for e in m.entries:
            others = [s for s in shared.get(os.path.realpath(e.audio), ()) if s != split]
            if others and split in reports:  # (a split taken from the previous build keeps its report)
                reports[split].shared.append(f"{m.path}:{e.line}: {e.audio} (also in {', '.join(others)})")
    return len(shared)


def count_outcomes(m: Manifest, todo: list[tuple], outcomes: dict[int, object], report: Report) -> None:
    """Counts each written utterance (shards.Kept) or skip (audio.Skip) in `report`, in manifest order."""
    lines = {e.id: e.line for e in m.entries}
    for position, key, audio_path, _, _ in todo:
        got = outcomes[position]
        if isinstance(got, shards.Kept):
            report.kept += 1
            report.kept_samples += got.samples
            if got.clipped:
                report.clipped[f"{m.path}:{lines[key]}: {audio_path}"] = got.clipped
        else:
            report.skip(got.reason, f"{m.path}:{lines[key]}", f"{audio_path}: {got.detail}")


def finish_split(m: Manifest, report: Report, data_dir: str) -> None:
    """Writes the split's build report and logs its summary; a split that kept nothing is a ValueError."""
    with open(report_path(data_dir, m.split), "w") as f:
        json.dump(report.to_json(), f, indent=1, ensure_ascii=False)
    dropped = sum(report.skipped.values()) + len(report.clipped) + len(report.shared)
    logging.log(logging.WARNING if dropped else logging.INFO, "%s", report.summary())
    if not report.kept:
        examples = [e for r in REASONS for e in report.examples.get(r, [])][:REPORT_EXAMPLES]
        raise ValueError(
            f"{report.summary()}: every utterance of {m.path} was skipped, nothing to build (e.g. "
            f"{'; '.join(examples)}). Fix that manifest or leave it out (dataset.manifest_splits)"
        )


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copy2(source, target)


class ManifestDataset(tfds.core.GeneratorBasedBuilder):
    """Your own speech from manifests (Common Voice, NeMo, CSV/TSV): int16 at one rate, no TF.

    A normal tfds dataset (array_record shards, dataset_info.json, read by as_data_source), but
    written by `_download_and_prepare` through datasets.shards, each shard by one worker."""

    name = "manifest"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Manifests of any layout, resampled int16 audio, the alphabet stored beside."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = "Put <split>.tsv/.csv/.jsonl/.json manifests in the manual dir (dataset.manual_dir)."

    def __init__(self, options: Options | None = None, reuse: tuple[str, frozenset] = ("", frozenset()), **kwargs):
        self.options = options or Options()
        self.reuse = reuse  # (a previous build's data dir, its splits whose files are unchanged: taken, not built)
        kwargs.setdefault("file_format", "array_record")  # random access without TF
        super().__init__(**kwargs)

    def is_prepared(self) -> bool:
        from ds2_jax.datasets.librispeech_local import quiet_tfds

        with quiet_tfds():
            return super().is_prepared()

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(features=features(), supervised_keys=("audio", "text"))

    def _split_generators(self, dl_manager):
        raise NotImplementedError("manifest splits are written by _download_and_prepare (datasets.shards)")

    def _generate_examples(self):
        raise NotImplementedError("manifest splits are written by _download_and_prepare (datasets.shards)")

    def _download_and_prepare(self, dl_manager, download_config=None) -> None:
        """Reads the manifests, derives or reads the alphabet, has the workers write every split's
        shards, then names them as tfds does and records the splits (tfds writes dataset_info.json)."""
        manual_dir, data_dir = os.fspath(dl_manager.manual_dir), os.fspath(self.data_dir)  # the build's temp dir
        manifests = read_manifests(manual_dir, self.options)
        if not manifests:
            raise FileNotFoundError(no_manifest(manual_dir, self.options))
        alphabet, source, rare = make_alphabet(manifests, self.options)
        logging.info("manifest: alphabet of %s from %s", alphabet.describe(), source)
        if rare:
            logging.warning(
                "manifest: left out of the alphabet, seen fewer than dataset.alphabet_min_count=%d times "
                "in the train splits: %s",
                self.options.alphabet_min_count,
                rare_summary(rare),
            )
        with open(os.path.join(data_dir, ALPHABET_FILE), "w", encoding="utf-8") as f:
            f.write(f"# the alphabet of these labels ({source})\n" + alphabet.to_lines())
        o, jobs, todos, reports = self.options, [], {}, {}
        taken = self._take_unchanged(alphabet, manifests)
        for split, m in manifests.items():
            if split in taken:
                continue
            trains = {tfds_split(t.strip()) for t in o.train_splits.split("+")}
            reports[split] = Report(m.split, m.path, o.sample_rate, rare=dict(rare) if split in trains else {})
            todos[split] = to_write(m, alphabet, reports[split], bool(o.vocabulary), rare)
            ordered = [todos[split][i] for i in shards.tfds_order([t[1] for t in todos[split]], split)]
            jobs += shards.shard_jobs(
                split,
                ordered,
                data_dir,
                symbols=alphabet.symbols,
                sample_rate=o.sample_rate,
                stereo=o.stereo,
                window=o.window,
                hop=o.hop,
            )
        outcomes = {split: {} for split in todos}
        written = {split: [] for split in todos}  # (temp path, records) of each shard, in order
        for job, got in shards.run(jobs, o.num_workers()):
            outcomes[job.split].update((item[0], g) for item, g in zip(job.items, got))
            written[job.split].append((job.path, sum(isinstance(g, shards.Kept) for g in got)))
        shared = shared_audio(manifests, reports)
        if shared:
            logging.warning(
                "manifest: %d audio files are listed in more than one split (e.g. %s): each split keeps them, "
                "so a split may be scored on audio another one trains on (build reports: audio_in_other_splits)",
                shared,
                next(r.shared[0] for r in reports.values() if r.shared),
            )
        infos = list(taken.values())
        for split, m in manifests.items():
            if split in taken:
                continue
            count_outcomes(m, todos[split], outcomes[split], reports[split])
            finish_split(m, reports[split], data_dir)
            infos.append(self._name_shards(split, written[split]))
        self.info.set_splits(tfds.core.SplitDict(infos))

    def _take_unchanged(self, alphabet: text.Alphabet, manifests: dict) -> dict[str, tfds.core.SplitInfo]:
        """The splits of the previous build (`reuse`) whose files did not change, linked into this one
        with their build reports, when the alphabet is the same (else every split is built again)."""
        previous, unchanged = self.reuse
        if not previous or not unchanged:
            return {}
        try:
            if read_alphabet(previous).symbols != alphabet.symbols:
                logging.warning("manifest: the alphabet changed with the files: building every split again")
                return {}
            old = tfds.builder_from_directory(previous).info.splits
        except Exception as e:  # noqa: BLE001 - a previous build that cannot be read is built again
            logging.warning("manifest: the previous build in %s is unreadable (%s): building every split", previous, e)
            return {}
        taken = {}
        for split in sorted(unchanged & set(manifests) & set(old.keys())):
            info = old[split]
            template = self._get_filename_template(split_name=split)
            sources = info.filename_template.sharded_filepaths(len(info.shard_lengths))
            for source, target in zip(sources, template.sharded_filepaths(len(info.shard_lengths))):
                _link_or_copy(os.fspath(source), os.fspath(target))
            name = os.path.basename(report_path(previous, split))
            _link_or_copy(report_path(previous, split), os.path.join(os.fspath(self.data_dir), name))
            taken[split] = tfds.core.SplitInfo(
                name=split, shard_lengths=list(info.shard_lengths), num_bytes=info.num_bytes, filename_template=template
            )
            logging.info("manifest/%s: its files are unchanged: taken from the previous build", split)
        return taken

    def _name_shards(self, split: str, written: list[tuple[str, int]]) -> tfds.core.SplitInfo:
        """Renames a split's non-empty shards to tfds's file names; its SplitInfo."""
        for path, records in written:
            if not records:
                os.remove(path)
        kept = [(path, n) for path, n in written if n]
        template = self._get_filename_template(split_name=split)
        for (path, _), final in zip(kept, template.sharded_filepaths(len(kept))):
            os.replace(path, os.fspath(final))
        return tfds.core.SplitInfo(
            name=split,
            shard_lengths=[n for _, n in kept],
            filename_template=template,
            num_bytes=sum(os.path.getsize(os.fspath(p)) for p in template.sharded_filepaths(len(kept))),
        )


def audio_fingerprint(m: Manifest) -> tuple[str, list[str]]:
    """(a hash of every listed audio file's path, size and mtime, the files missing) of a manifest."""
    h, missing = hashlib.sha256(), []
    for e in m.entries:
        try:
            stat = os.stat(e.audio)
            h.update(f"{e.audio}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        except OSError:
            missing.append(e.audio)
            h.update(f"{e.audio}\0missing\n".encode())
    return h.hexdigest()[:16], missing


def source_of(manual_dir: str, options: Options) -> dict:
    """{manual_dir, splits, files, fingerprint, content_fingerprint, split_fingerprints, missing_audio,
    options} of the manifests a manual dir holds: their names, sizes and text, every audio file they
    list by path, size and mtime (a stat each: an edited, replaced, deleted or added clip is seen), and
    the options that shape the build."""
    found = find_manifests(manual_dir, options.manifest_splits) if manual_dir and os.path.isdir(manual_dir) else {}
    entries, texts, splits, missing = [], hashlib.sha256(), {}, []
    for split, path in sorted(found.items()):
        entries.append((split, os.path.basename(path), os.path.getsize(path)))
        with open(path, "rb") as f:
            data = f.read()
        texts.update(data + b"\0")
        m = read_manifest(path, options)
        audio, gone = audio_fingerprint(m) if m is not None else ("", [])
        splits[split] = hashlib.sha256(data + audio.encode()).hexdigest()[:16]
        missing += gone
    sizes = json.dumps(entries).encode()
    record = options.record()
    return {
        "manual_dir": os.path.abspath(manual_dir) if manual_dir else "",
        "splits": sorted(found),
        "files": len(entries),
        "fingerprint": hashlib.sha256(sizes).hexdigest()[:16],
        "content_fingerprint": hashlib.sha256(sizes + texts.digest()).hexdigest()[:16],
        "split_fingerprints": splits,
        "missing_audio": {"count": len(missing), "examples": missing[:REPORT_EXAMPLES]},
        "options": record,
    }
