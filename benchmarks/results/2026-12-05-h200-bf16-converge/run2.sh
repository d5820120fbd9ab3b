#!/bin/bash
# The second H200 call (the first lacked tensorboardX on the machine, and the determinism test's
# subprocess lost the wheels' PYTHONPATH): make converge-gpu's 15 runs as 5 processes, one per
# seed, on the one GPU at once (0.15 of its memory each), the reference first and bfloat16 'auto'
# next in each; beside them the GPU determinism test; then, alone, the step-time script.
set -u
. benchmarks/gpu_host.sh || exit 1  # wheels, PYTHONPATH, compilation cache, $OUT/gpu.txt
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.15 JAX_COMPILATION_CACHE_DIR=/tmp/xla_cache
CONV="--steps=600 --evals=3 --config.deterministic=True --runs=float32:scan_vjp,bfloat16:auto,bfloat16:scan_vjp"
for s in 0 1 2 3 4; do
  ( timeout 340 python3 -m benchmarks.precision --out=/tmp/conv/s$s --seeds=$s $CONV > $OUT/converge-s$s.log 2>&1 ) &
done
( timeout 340 env JAX_PLATFORMS=cuda python3 -m pytest -q -m gpu tests/test_bf16_step.py -k deterministic > $OUT/gpu-determinism.txt 2>&1 ) &
wait
for s in 0 1 2 3 4; do mkdir -p $OUT/converge-s$s; cp /tmp/conv/s$s/precision.json $OUT/converge-s$s/ 2>/dev/null; done
tail -2 $OUT/gpu-determinism.txt; for s in 0 1 2 3 4; do grep -h "^| " /tmp/conv/s$s/NOTES.md | tail -3; tail -2 $OUT/converge-s$s.log; done
unset XLA_PYTHON_CLIENT_MEM_FRACTION
bash benchmarks/results/2026-12-05-h200-step-time/run.sh
