#!/bin/bash
# The last device minutes: where the 32-64-row Mosaic calls go wrong (diagnose.py), then the seed
# step at 16 per device, jax 'auto' against torch_cudnn_graphs in the same run (bf16).
set -u
. benchmarks/gpu_host.sh || exit 1  # wheels, PYTHONPATH, compilation cache, $OUT/gpu.txt
timeout 50 python3 benchmarks/results/2026-12-05-gpu-batch-kernels/diagnose.py 2>&1 | grep -E "^h=" | tee $OUT/diagnose.txt
timeout 95 python3 -m benchmarks.scaling --config=configs/ds2_8gpu.py --config.dataset.name=synthetic --steps=20 \
    --warmup=3 --variants=jax,torch_cudnn_graphs --dtype=bfloat16 --out=$OUT/scaling-b16 > $OUT/scaling-b16.log 2>&1
grep -E '^\| (jax|torch)' $OUT/scaling-b16/results.md | cut -c1-160
