"""Builds `librispeech_local` from a manual dir and prints what was kept and skipped.

    python -m ds2_jax.datasets.build --manual_dir=DIR [--data_dir=D]

DIR holds LibriSpeech/<split>/... or <split>.tar.gz (see librispeech_local.py); D is the
tfds data dir ('' = tfds default, ~/tensorflow_datasets). Splits already built are kept:
delete D/librispeech_local to rebuild.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import resource
import sys
import types

import tensorflow_datasets as tfds

from ds2_jax.datasets import librispeech_local


def get_builder(data_dir: str = "") -> librispeech_local.LibrispeechLocal:
    return librispeech_local.LibrispeechLocal(data_dir=data_dir or None)


# tfds keeps up to 1 GB of a split's examples in memory, then spills them to 1000 temp
# files through tf.io.gfile (tensorflow_datasets/core/shuffle.py), which needs TensorFlow.
# For local data dirs, plain files do the same job, so a build never needs TensorFlow.
_LOCAL_TF = types.SimpleNamespace(
    io=types.SimpleNamespace(
        gfile=types.SimpleNamespace(GFile=open, exists=os.path.exists, remove=os.remove)
    ),
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


# tfds writes array_record with the format's default compression (brotli). Int16 speech
# barely compresses (~10%), and brotli decoding is ~4/5 of a random read (~340 vs ~80 us
# for a 7 s clip), so the records are written uncompressed: a build-time setting only,
# readers find it in each file.
RECORD_OPTIONS = "group_size:1,uncompressed"


@contextlib.contextmanager
def _uncompressed_records():
    from array_record.python import array_record_module
    from tensorflow_datasets.core import file_adapters

    adapter = file_adapters.ArrayRecordFileAdapter
    old = adapter.__dict__["write_examples"]

    def write_examples(cls, path, iterator):
        writer = array_record_module.ArrayRecordWriter(os.fspath(path), RECORD_OPTIONS)
        for _, serialized_example in iterator:
            writer.write(serialized_example)
        writer.close()

    adapter.write_examples = classmethod(write_examples)
    try:
        yield
    finally:
        adapter.write_examples = old


def build(manual_dir: str, data_dir: str = "") -> librispeech_local.LibrispeechLocal:
    """Prepares the dataset (no-op if already prepared) and returns its builder."""
    if not manual_dir or not os.path.isdir(manual_dir) or not os.listdir(manual_dir):
        raise FileNotFoundError(
            f"dataset.manual_dir={manual_dir!r} is missing or empty: point it at a directory "
            "holding LibriSpeech/<split>/... or <split>.tar.gz archives"
        )
    with librispeech_local.quiet_tfds():
        builder = get_builder(data_dir)
        if builder.is_prepared():
            return builder
        with _local_shuffle_files(data_dir), _uncompressed_records():
            builder.download_and_prepare(
                download_config=tfds.download.DownloadConfig(manual_dir=os.path.abspath(manual_dir))
            )
    logging.getLogger("ds2_jax").info("librispeech_local: built %s from %s", builder.data_dir, manual_dir)
    return builder


def reports(builder) -> dict[str, dict]:
    """tfds split -> its build report (see librispeech_local.SplitReport.to_json)."""
    out = {}
    for split in builder.info.splits:
        path = librispeech_local.report_path(os.fspath(builder.data_dir), split)
        if os.path.exists(path):
            with open(path) as f:
                out[split] = json.load(f)
    return out


def summary(report: dict) -> str:
    skipped = ", ".join(f"{r}={n}" for r, n in report["skipped"].items() if n) or "none"
    total = report["kept"] + report["skipped_total"]
    return (
        f"{report['split']}: kept {report['kept']} of {total} utterances "
        f"({report['kept_hours']:.2f} h); skipped: {skipped}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--manual_dir", required=True, help="LibriSpeech tree or *.tar.gz archives")
    parser.add_argument("--data_dir", default="", help="tfds data dir ('' = tfds default)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    builder = build(args.manual_dir, args.data_dir)
    print(f"librispeech_local prepared in {builder.data_dir}")
    for split, report in sorted(reports(builder).items()):
        print(f"  {summary(report)}")
        print(f"    report: {librispeech_local.report_path(os.fspath(builder.data_dir), split)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
