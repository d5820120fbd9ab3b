#!/bin/bash
# One device call on the GPU host (16 vCPUs), the two parts measured only on the 2-core CPU before:
#   1. benchmarks.augmentation: the input pipeline's cost of noise/speed/SpecAugment and a short training;
#   2. benchmarks.manifest_build: the bundled LibriSpeech tree (FLAC), joined and copied, built with
#      1-16 processes against the bare decode.
# Run from the repository root with OUT set and .whl carried (fetch-wheels.sh, with tensorboardX==2.6.4).
set -u
START=$SECONDS
. benchmarks/gpu_host.sh || exit 1  # wheels, PYTHONPATH, compilation cache, $OUT/gpu.txt
nproc | tee $OUT/nproc.txt
timeout 280 python3 -m benchmarks.augmentation --out=/tmp/aug --steps=20 --batch=16 --train_steps=40 --num_workers=2 \
    > $OUT/augmentation.log 2>&1; echo "augmentation: rc $? ($((SECONDS - START)) s)"
cp /tmp/aug/*.md $OUT/ 2>/dev/null
timeout 250 python3 -m benchmarks.manifest_build --librispeech=corpora/tiny_librispeech --join=10 --copies=200 \
    --processes=1,2,4,8,16 --out=/tmp/ls-flac > $OUT/build.log 2>&1; echo "build: rc $? ($((SECONDS - START)) s)"
cp /tmp/ls-flac/*.md $OUT/ 2>/dev/null
ls $OUT; grep -h "^|" $OUT/*.md | cut -c1-160
