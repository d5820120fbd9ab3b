"""Builds `librispeech_local` or `manifest` from a manual dir and prints what was kept and skipped.

    python -m ds2_jax.datasets.build --config.dataset.manual_dir=DIR [--config.dataset.data_dir=D]
    python -m ds2_jax.datasets.build --config=configs/tiny_es.py [--config.KEY=VALUE ...]  # as training reads it
    python -m ds2_jax.datasets.build --config.dataset.name=manifest --config.dataset.manual_dir=DIR
        --config.dataset.train_splits=train [--config.dataset.data_dir=D] [--config.dataset.vocabulary=V]
        [--config.features.sample_rate=16000] [--config.dataset.build_workers=-1] [--config.dataset.KEY=VALUE ...]

The build reads the settings a training run reads (ds2_jax/settings.py), from the same
`--config=FILE` and `--config.dataset.*` / `--config.features.sample_rate` flags (without a
FILE: the defaults, dataset.name librispeech_local). DIR holds LibriSpeech/<split>/... or <split>.tar.gz (see
librispeech_local.py), or, with dataset.name=manifest, <split>.tsv/.csv/.jsonl/.json manifests
(see manifest.py); D is the tfds data dir ('' = tfds default, ~/tensorflow_datasets).
Splits already built are kept: delete D/<name> to rebuild. A librispeech_local build that
fails (a damaged archive, a full disk, Ctrl-C) keeps the splits it finished for the next
build (datasets.kept_splits).

The prepared dataset records the manual dir it was built from and a fingerprint of its
file list (names and sizes; `SOURCE_RECORD`). Opening it with a manual dir whose files
differ is refused, naming both dirs: D may be shared by several projects, so it is never
rebuilt in place behind a user's back; the way out is a fresh D, the old DIR, or
deleting D/librispeech_local. A manifest build also records each split's fingerprint (its manifest
and every audio file it lists by path, size and mtime): when the files of the same manual dir
change, `build` builds the changed splits again and takes the others from the previous build.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import resource
import shutil
import sys
import types

import tensorflow_datasets as tfds

from ds2_jax import errors, files
from ds2_jax.datasets import librispeech_local, manifest, shards

SOURCE_RECORD = "ds2_source.json"  # in the prepared dataset's dir: manual_dir and its fingerprint


NAMES = ("librispeech_local", "manifest")  # the builders this module builds (dataset.name)


def get_builder(data_dir: str = "", name: str = "librispeech_local", options: manifest.Options | None = None):
    """The tfds builder of dataset.name `name` in `data_dir` (manifest: with its build options)."""
    if name == "manifest":
        return manifest.ManifestDataset(options=options, data_dir=data_dir or None)
    return librispeech_local.LibrispeechLocal(data_dir=data_dir or None)


# tfds keeps up to 1 GB of a split's examples in memory, then spills them to 1000 temp
# files through tf.io.gfile (tensorflow_datasets/core/shuffle.py), which needs TensorFlow.
# For local data dirs, plain files do the same job, so a build never needs TensorFlow.
_LOCAL_TF = types.SimpleNamespace(
    io=types.SimpleNamespace(gfile=types.SimpleNamespace(GFile=open, exists=os.path.exists, remove=os.remove)),
    errors=types.SimpleNamespace(ResourceExhaustedError=type("ResourceExhaustedError", (OSError,), {})),
)


@contextlib.contextmanager
def _local_shuffle_files(data_dir: str):
    if "://" in (data_dir or ""):  # remote data dir: leave it to tfds (and TensorFlow)
        yield
        return
    from tensorflow_datasets.core import shuffle

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = shuffle.BUCKETS_NUMBER + 256  # one open file per spill bucket
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
    old = shuffle.tf
    shuffle.tf = _LOCAL_TF
    try:
        yield
    finally:
        shuffle.tf = old


@contextlib.contextmanager
def _uncompressed_records():
    """tfds's array_record writer with shards.RECORD_OPTIONS (the librispeech_local build; manifest
    builds write their own shards)."""
    from array_record.python import array_record_module
    from tensorflow_datasets.core import file_adapters

    adapter = file_adapters.ArrayRecordFileAdapter
    old = adapter.__dict__["write_examples"]

    def write_examples(cls, path, iterator):
        writer = array_record_module.ArrayRecordWriter(os.fspath(path), shards.RECORD_OPTIONS)
        for _, serialized_example in iterator:
            writer.write(serialized_example)
        writer.close()

    adapter.write_examples = classmethod(write_examples)
    try:
        yield
    finally:
        adapter.write_examples = old


TEXT_SUFFIXES = (".txt",)  # transcripts (and SPEAKERS.TXT): hashed by content, audio by size


def source_of(manual_dir: str) -> dict:
    """{manual_dir, splits, files, fingerprint, content_fingerprint} of the splits a manual dir
    holds. fingerprint hashes every file's path (relative to its split) and size;
    content_fingerprint also hashes the transcripts' text, so a same-size edit of a
    transcript is seen (audio stays by size: hashing hundreds of GB each start is too slow)."""
    found = librispeech_local.find_splits(manual_dir) if manual_dir and os.path.isdir(manual_dir) else {}
    entries, texts = [], hashlib.sha256()
    for split, (kind, path) in sorted(found.items()):
        if kind == "tar":
            entries.append((split, os.path.basename(path), os.path.getsize(path)))
            continue
        for root, _, names in librispeech_local.walk(path):  # the build's walk: linked folders too
            for name in names:
                full = os.path.join(root, name)
                size = os.path.getsize(full) if os.path.exists(full) else -1  # -1: a broken link
                entries.append((split, os.path.relpath(full, path), size))
                if name.lower().endswith(TEXT_SUFFIXES):
                    with open(full, "rb") as f:
                        texts.update(entries[-1][1].encode() + b"\0" + f.read() + b"\0")
    sizes = json.dumps(entries).encode()
    return {
        "manual_dir": os.path.abspath(manual_dir) if manual_dir else "",
        "splits": sorted(found),
        "files": len(entries),
        "fingerprint": hashlib.sha256(sizes).hexdigest()[:16],
        "content_fingerprint": hashlib.sha256(sizes + texts.digest()).hexdigest()[:16],
    }


def _source_of(builder, manual_dir: str) -> dict:
    if builder.name == "manifest":
        return manifest.source_of(manual_dir, builder.options)
    return source_of(manual_dir)


def _record_path(builder) -> str:
    return os.path.join(os.fspath(builder.data_dir), SOURCE_RECORD)


def recorded_source(builder) -> dict | None:
    """The prepared dataset's record of its manual dir; None where it has none. A record that is
    there but cannot be read is refused, never taken for none: the data would go unchecked."""
    path = _record_path(builder)
    way_out = "or set dataset.data_dir to a directory of your own"
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise OSError(
            f"{path}, the record of the files this prepared dataset was built from, is unreadable "
            f"({e.strerror or e}), so the data cannot be checked against dataset.manual_dir: ask its owner "
            f"to make it readable (chmod a+r), {way_out}"
        ) from e
    except ValueError as e:
        raise ValueError(
            f"{path}, the record of the files this prepared dataset was built from, is not JSON ({e}): "
            f"delete it to record dataset.manual_dir as it is now (unchecked), {way_out}"
        ) from e


def record_source(builder, source: dict) -> None:
    try:
        files.write_text(_record_path(builder), json.dumps(source, indent=1))  # atomic: never a torn record
    except OSError as e:
        logging.warning("could not record the manual dir in %s (%s)", _record_path(builder), e)


def check_source(builder, manual_dir: str) -> None:
    """Says which manual dir the prepared dataset was built from; a DatasetMismatch when
    `manual_dir` (if set) holds other files."""
    where = os.fspath(builder.data_dir)
    recorded = recorded_source(builder)
    if recorded is None:
        if manual_dir:
            logging.warning(
                "%s has no record of the manual dir it was built from (prepared before ds2_jax "
                "kept one); recording dataset.manual_dir=%r, unchecked",
                where,
                manual_dir,
            )
            record_source(builder, _source_of(builder, manual_dir))
        return
    built_from = (
        f"{recorded['manual_dir']} ({recorded['files']} files of {', '.join(recorded['splits'])}, "
        f"fingerprint {recorded['fingerprint']})"
    )
    if not manual_dir:
        logging.info("%s in %s was built from %s", builder.name, where, built_from)
        return
    current = _source_of(builder, manual_dir)
    key = "content_fingerprint" if "content_fingerprint" in recorded else "fingerprint"  # older records: sizes only
    if current.get("options") != recorded.get("options"):
        was, now = recorded.get("options") or {}, current["options"]
        differ = {
            k: (was.get(k, "not recorded"), now.get(k, "not recorded"))
            for k in {**was, **now}
            if was.get(k) != now.get(k)
        }
        raise errors.DatasetMismatch(
            f"the prepared {builder.name} in {where} was built with other settings: "
            + ", ".join(f"{k} {a!r} (built) vs {b!r} (now)" for k, (a, b) in differ.items())
            + f". Set dataset.data_dir to a fresh directory to build with these, set them back, or delete "
            f"{os.path.dirname(where)} to rebuild it there"
        )
    changed = _changed_splits(recorded, current)
    if changed:
        missing = current["missing_audio"]
        raise errors.SourceChanged(
            f"the files of {manual_dir} changed since {where} was built from them: split(s) "
            f"{', '.join(changed)} (a manifest, or an audio file it lists edited, replaced, added or deleted)"
            + (
                f"; {missing['count']} listed audio files are missing (e.g. {', '.join(missing['examples'])}): "
                "each is a missing_audio skip"
                if missing["count"]
                else ""
            )
            + f". Build them again: {command(builder.name, manual_dir, os.path.dirname(os.path.dirname(where)))}"
            " (a run does so itself)",
            changed,
        )
    if current[key] == recorded[key]:
        logging.info(
            "%s in %s was built from %s; dataset.manual_dir=%r holds the same files",
            builder.name,
            where,
            built_from,
            manual_dir,
        )
        if key == "fingerprint":
            logging.warning(
                "%s recorded its manual dir's file sizes only (prepared before ds2_jax hashed the "
                "transcripts): recording them as they are now, unchecked",
                where,
            )
            record_source(builder, {**recorded, "content_fingerprint": current["content_fingerprint"]})
        elif "split_fingerprints" in current and "split_fingerprints" not in recorded:
            logging.warning(
                "%s recorded its manifests only (prepared before ds2_jax listed the audio files): recording "
                "the audio files as they are now, unchecked",
                where,
            )
            record_source(builder, {**recorded, **current})
        return
    has = (
        f"{current['files']} files of {', '.join(current['splits'])}, fingerprint {current['fingerprint']}"
        + (", the same sizes but other transcript text" if current["fingerprint"] == recorded["fingerprint"] else "")
        if current["files"]
        else f"no {'manifest' if builder.name == 'manifest' else 'LibriSpeech split'}"
    )
    raise errors.DatasetMismatch(
        f"the prepared {builder.name} in {where} was built from {built_from}, but dataset.manual_dir="
        f"{manual_dir!r} holds other files ({has}). Set dataset.data_dir to a fresh directory to build from "
        f"{manual_dir!r}, set dataset.manual_dir back to {recorded['manual_dir']!r}, or delete "
        f"{os.path.dirname(where)} to rebuild it there"
    )


def _changed_splits(recorded: dict, current: dict) -> list[str] | None:
    """The splits of the same manual dir whose files changed since `recorded` (manifest builds that
    recorded each split's fingerprint; [] for none); None where it is another dir, or the record cannot tell."""
    was, now = recorded.get("split_fingerprints"), current.get("split_fingerprints")
    if was is None or now is None or recorded["manual_dir"] != current["manual_dir"]:
        return None
    return sorted(s for s in {*was, *now} if was.get(s) != now.get(s))


BUILD_LOCK = ".build.lock"  # in the dataset's folder of the tfds data dir: one build at a time


@contextlib.contextmanager
def _one_build_at_a_time(builder):
    """Holds data_dir's build lock (flock: released when a holder dies); a second build (or a second run
    starting on a fresh data_dir) says so and waits, then finds the dataset the first one prepared."""
    root = os.path.dirname(os.path.dirname(os.fspath(builder.data_dir)))  # <data_dir>/<name>/<version>
    if "://" in root:  # a remote data dir: tfds's own rules
        yield
        return
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, BUILD_LOCK), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logging.getLogger("ds2_jax").warning(
                "another process is building %s in %s: waiting for it to finish (%s)", builder.name, root, f.name
            )
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build(
    manual_dir: str, data_dir: str = "", name: str = "librispeech_local", options: manifest.Options | None = None
):
    """Prepares the dataset `name` (only checks check_source if already prepared); returns its builder."""
    with librispeech_local.quiet_tfds():
        builder = get_builder(data_dir, name, options)
        prepared = builder.is_prepared()
    if prepared:
        try:
            check_source(builder, manual_dir)
        except errors.SourceChanged as e:
            return rebuild(builder, manual_dir, data_dir, options, e)
        return builder
    if not manual_dir or not os.path.isdir(manual_dir) or not os.listdir(manual_dir):
        holding = (
            "<split>.tsv/.csv/.jsonl/.json manifests"
            if name == "manifest"
            else "LibriSpeech/<split>/... or <split>.tar.gz archives"
        )
        raise FileNotFoundError(
            f"dataset.manual_dir={manual_dir!r} is missing or empty: point it at a directory holding {holding}"
        )
    with _one_build_at_a_time(builder):
        with librispeech_local.quiet_tfds():
            builder = get_builder(data_dir, name, options)  # afresh: the build this one waited for may have prepared it
            prepared = builder.is_prepared()
        if prepared:
            check_source(builder, manual_dir)
            return builder
        try:
            with librispeech_local.quiet_tfds(), _local_shuffle_files(data_dir), _uncompressed_records():
                builder.download_and_prepare(
                    download_config=tfds.download.DownloadConfig(manual_dir=os.path.abspath(manual_dir))
                )
        except Exception as e:
            if errors.is_disk_full(e):  # tfds removed its unfinished folder: nothing half-built stays
                root = os.path.dirname(os.path.dirname(os.fspath(builder.data_dir)))
                raise errors.disk_full(
                    f"building {name} in {root} from {manual_dir}",
                    root,
                    "set dataset.data_dir (--config.dataset.data_dir) to a disk with room",
                ) from e
            raise
        record_source(builder, _source_of(builder, manual_dir))
    logging.getLogger("ds2_jax").info("%s: built %s from %s", name, builder.data_dir, manual_dir)
    return builder


def rebuild(builder, manual_dir: str, data_dir: str, options: manifest.Options, changed: errors.SourceChanged):
    """Builds a manifest dataset again after its files changed: the changed splits from the files, the
    others taken from the previous build (which is moved aside meanwhile, and back if the build fails)."""
    log = logging.getLogger("ds2_jax")
    log.warning("%s: building again", changed)
    current = os.fspath(builder.data_dir)
    previous = current + ".previous"
    with _one_build_at_a_time(builder):
        shutil.rmtree(previous, ignore_errors=True)
        os.replace(current, previous)
        try:
            unchanged = frozenset(builder.info.splits.keys()) - set(changed.splits)
            with librispeech_local.quiet_tfds():
                fresh = manifest.ManifestDataset(
                    options=options, reuse=(previous, unchanged), data_dir=data_dir or None
                )
                fresh.download_and_prepare(
                    download_config=tfds.download.DownloadConfig(manual_dir=os.path.abspath(manual_dir))
                )
        except BaseException:
            if not os.path.exists(current):
                os.replace(previous, current)
            raise
        record_source(fresh, _source_of(fresh, manual_dir))
        shutil.rmtree(previous, ignore_errors=True)
    log.info("%s: built %s again from %s (split(s) %s)", builder.name, current, manual_dir, ", ".join(changed.splits))
    return fresh


def unknown_line(split_reports: dict[str, dict]) -> str:
    """The build's one-line summary of the characters outside the alphabet ('' if none)."""
    counts: collections.Counter = collections.Counter()
    for report in split_reports.values():
        counts.update(report.get("unknown_chars", {}))
    if not counts:
        return ""
    skipped = sum(r["skipped"].get("unknown_chars", 0) for r in split_reports.values())
    return (
        f"characters outside the alphabet skipped {skipped} utterances: {manifest.unknown_summary(dict(counts))} "
        "(build reports: unknown_chars; add them to dataset.vocabulary, or derive the alphabet from the train "
        "splits)"
    )


def reports(builder) -> dict[str, dict]:
    """tfds split -> its build report (see librispeech_local.SplitReport.to_json)."""
    out = {}
    for split in builder.info.splits:
        path = librispeech_local.report_path(os.fspath(builder.data_dir), split)  # the same name for both builders
        if os.path.exists(path):
            with open(path) as f:
                out[split] = json.load(f)
    return out


def summary(report: dict) -> str:
    if "manifest" in report:
        return manifest.summary(report)
    counts = {**report["skipped"], "missing_audio": report.get("transcripts_without_audio", 0)}
    skipped = ", ".join(f"{r}={n}" for r, n in counts.items() if n) or "none"
    total = report["kept"] + sum(counts.values())
    return (
        f"{report['split']}: kept {report['kept']} of {total} utterances "
        f"({report['kept_hours']:.2f} h); skipped: {skipped}"
    )


def command(name: str, manual_dir: str, data_dir: str) -> str:
    """The build's command line for dataset `name` (with a run's --config=FILE and other flags, it
    builds what that run reads)."""
    return (
        f"python -m ds2_jax.datasets.build --config.dataset.name={name} "
        f"--config.dataset.manual_dir={manual_dir or 'DIR'} --config.dataset.data_dir={data_dir or 'D'}"
    )


def _config_file(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the FILE of --config=FILE in argv or None, argv without it)."""
    path, rest, args = None, [], iter(argv)
    for a in args:
        if a.startswith("--config="):
            path = a.split("=", 1)[1]
        elif a == "--config":
            path = next(args, None)
        else:
            rest.append(a)
    return path, rest


def build_defaults(config_file: str | None = None):
    """The ConfigDict the build's --config.* flags override: a config file's get_config() (FILE[:ARG],
    as launch.py reads it), else every setting's default with dataset.name librispeech_local
    (synthetic data needs no build)."""
    import importlib.util

    from ds2_jax import cli, settings

    if not config_file:
        config = settings.to_config_dict()
        config.dataset.name = NAMES[0]
        return config
    path, _, arg = config_file.partition(":")
    if message := cli.missing_config_file_message("config", config_file):
        cli.usage_error(message)
    spec = importlib.util.spec_from_file_location("_ds2_build_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(*([arg] if arg else []))


def define_flags(fv, argv: list[str], config_file: str | None = None) -> None:
    """--config.KEY=VALUE for every setting, as a training run takes them (ml_collections config
    flags over build_defaults(config_file)); `argv`: the arguments the flags are parsed from."""
    from ml_collections import config_flags

    from ds2_jax import cli

    defaults = build_defaults(config_file)
    try:
        config_flags.DEFINE_config_dict(
            "config",
            defaults,
            "Settings (ds2_jax/settings.py): --config.dataset.KEY=VALUE and --config.features.sample_rate, "
            "as a training run takes them.",
            flag_values=fv,
            lock_config=True,
            sys_argv=["ds2-build", *argv],
        )
    except (AttributeError, KeyError) as e:  # an override of a key the settings lack
        cli.usage_error(cli.unknown_config_key_message(argv, "config", defaults) or f"bad config override: {e}")


def settings_of_argv(argv: list[str]):
    """The checked Settings of the build's command line (`argv`: without the program name); a
    mistake in it, a dataset.name the build does not prepare, or no dataset.manual_dir, is a
    usage error (exit 2); a bad value a ValueError naming the setting."""
    from ds2_jax import cli, settings

    config_file, argv = _config_file(argv)
    args, _ = cli.parse_args(argv, lambda fv: define_flags(fv, argv, config_file), __doc__)
    config_dict = args.config
    if config_dict.dataset.name not in NAMES:
        cli.usage_error(
            f"--config.dataset.name={config_dict.dataset.name}: the build prepares {' or '.join(NAMES)} "
            "(synthetic data needs none; librispeech is tfds's own build)"
        )
    if not config_dict.dataset.manual_dir:
        cli.usage_error(
            "--config.dataset.manual_dir is required: the LibriSpeech tree or *.tar.gz archives, or with "
            "--config.dataset.name=manifest the manifests' folder"
        )
    return settings.from_config_dict(config_dict)


def options_of(config) -> manifest.Options | None:
    """The manifest build options of a run's Settings (None for librispeech_local: it has none)."""
    if config.dataset.name != "manifest":
        return None
    return manifest.Options.of(config.dataset, config.features.spectrogram)


def main(argv=None) -> int:

    config = settings_of_argv(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # plain lines, as every command prints
    d = config.dataset
    builder = build(d.manual_dir, d.data_dir, d.name, options_of(config))
    print(f"{d.name} prepared in {builder.data_dir}")
    if d.name == "manifest":
        print(
            f"  alphabet: {manifest.read_alphabet(os.fspath(builder.data_dir)).describe()} "
            f"({os.path.join(os.fspath(builder.data_dir), manifest.ALPHABET_FILE)})"
        )
    split_reports = reports(builder)
    for split, report in sorted(split_reports.items()):
        print(f"  {summary(report)}")
        print(f"    report: {librispeech_local.report_path(os.fspath(builder.data_dir), split)}")
    unknown = unknown_line(split_reports)
    if unknown:  # the build's last line
        print(unknown)
    return 0


if __name__ == "__main__":
    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
