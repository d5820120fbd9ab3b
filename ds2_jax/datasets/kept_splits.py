"""Splits that a failed build finished, kept for the next build of the same files.

tfds writes a build into a temporary folder and deletes it whole when anything fails, so a
.tar.gz cut short, a full disk or a Ctrl-C in the fifth split threw away the four built before
it. librispeech_local builds one split at a time instead, and as each is finished it is linked
(hard links: no second copy on disk) into `<data_dir>/<name>/kept_splits/<split>/` with its
shard lengths and its build report. The next build takes a kept split back instead of building
it again, when its key still matches: the builder's version, the split, where it came from and
every source file's name, size and modification time. A key that no longer matches is dropped,
with a line in the log. A build that succeeds removes the kept splits.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil

import tensorflow_datasets as tfds

from ds2_jax import files

FOLDER = "kept_splits"  # beside the dataset's version folders: <data_dir>/<name>/kept_splits
META = "kept.json"


def folder(dataset_root: str, split: str) -> str:
    return os.path.join(dataset_root, FOLDER, split)


def key(version: str, split: str, kind: str, path: str, walk) -> str:
    """A fingerprint of what a split is built from: an archive's size and mtime, or every file of a
    tree (`walk`: the build's own walk, linked folders included) by relative name, size and mtime."""
    entries: list = [version, split, kind, os.path.abspath(path)]
    if kind == "tar":
        stat = os.stat(path)
        entries.append((stat.st_size, stat.st_mtime_ns))
    else:
        for root, _, names in walk(path):
            for name in sorted(names):
                full = os.path.join(root, name)
                stat = os.stat(full) if os.path.exists(full) else None  # a broken link: counted, not kept
                entries.append((os.path.relpath(full, path), stat and stat.st_size, stat and stat.st_mtime_ns))
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()[:16]


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copy2(source, target)


def save(dataset_root: str, info: tfds.core.SplitInfo, split_key: str, data_dir: str, extra: list[str]) -> None:
    """Links a finished split's shards (and the `extra` files of data_dir, its report) into its kept
    folder, written under a temporary name and renamed: a kept split is whole or absent."""
    final = folder(dataset_root, info.name)
    partial = final + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    shards = [os.fspath(p) for p in info.filename_template.sharded_filepaths(len(info.shard_lengths))]
    for path in shards + [os.path.join(data_dir, name) for name in extra]:
        _link_or_copy(path, os.path.join(partial, os.path.basename(path)))
    meta = {
        "key": split_key,
        "shard_lengths": list(info.shard_lengths),
        "num_bytes": int(info.num_bytes),
        "shards": [os.path.basename(p) for p in shards],
        "extra": extra,
    }
    files.write_text(os.path.join(partial, META), json.dumps(meta, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)


def take(dataset_root: str, split: str, split_key: str, template) -> tfds.core.SplitInfo | None:
    """The kept split `split` linked into the folder of `template` (a tfds ShardedFileTemplate), and
    its SplitInfo; None where none is kept or its key no longer matches (then it is dropped)."""
    kept = folder(dataset_root, split)
    try:
        with open(os.path.join(kept, META)) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    if meta.get("key") != split_key:
        logging.info("%s: the split kept from a failed build no longer matches its files: building it again", split)
        shutil.rmtree(kept, ignore_errors=True)
        return None
    targets = [os.fspath(p) for p in template.sharded_filepaths(len(meta["shard_lengths"]))]
    data_dir = os.path.dirname(targets[0])
    for name, target in zip(meta["shards"], targets):
        _link_or_copy(os.path.join(kept, name), target)
    for name in meta["extra"]:
        _link_or_copy(os.path.join(kept, name), os.path.join(data_dir, name))
    logging.warning(
        "%s: taken from a failed build of the same files (%d examples), not built again",
        split,
        sum(meta["shard_lengths"]),
    )
    return tfds.core.SplitInfo(
        name=split, shard_lengths=meta["shard_lengths"], num_bytes=meta["num_bytes"], filename_template=template
    )


def clear(dataset_root: str) -> None:
    """Removes every kept split (the build they were kept for has succeeded)."""
    shutil.rmtree(os.path.join(dataset_root, FOLDER), ignore_errors=True)
