#!/bin/bash
# The measurements of NOTES.md, run from the repository root (2 cores, shared).
set -e
R=benchmarks/results/2026-12-05-cpu-manifest-build
for run in 1 2; do
  uptime > $R/load-$run.txt
  python -m benchmarks.manifest_build --manual_dir=data/tiny_es/common_voice --copies=60 --workers=0,1,2 --out=$R/cv-mp3-48k-run$run
  python -m benchmarks.manifest_build --librispeech=data/tiny_librispeech --join=10 --copies=40 --workers=0,1,2 --out=$R/librispeech-flac-16k-run$run
  uptime >> $R/load-$run.txt
done
