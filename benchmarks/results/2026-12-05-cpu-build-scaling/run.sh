#!/bin/bash
# The 2-core measurements of NOTES.md, run from the repository root (2 cores, shared with 3 other jobs).
set -e
R=benchmarks/results/2026-12-05-cpu-build-scaling
for run in 1 2; do
  uptime > $R/load-$run.txt
  python -m benchmarks.manifest_build --librispeech=corpora/tiny_librispeech --join=10 --copies=40 --processes=1,2 \
    --out=$R/librispeech-flac-16k-run$run
  python -m benchmarks.manifest_build --manual_dir=corpora/tiny_es/common_voice --copies=60 --processes=1,2 \
    --out=$R/cv-mp3-48k-run$run
  uptime >> $R/load-$run.txt
done
# where the inline build's time goes (cProfile: inflates the calls it counts; a separate run)
python -m benchmarks.manifest_build --librispeech=corpora/tiny_librispeech --join=10 --copies=40 --processes=1 \
  --out=/tmp/manifest_build_profile --profile=/tmp/manifest_build_profile/inline.prof
