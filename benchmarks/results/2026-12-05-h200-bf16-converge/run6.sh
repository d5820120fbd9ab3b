#!/bin/bash
# The sixth H200 call: make converge-gpu's third run, bfloat16 scan_vjp, under run5's schedule
# (cosine to 0 over the 600 steps, no warm-up), seeds 0-9 in two waves of five; then
# make test-gpu at the same commit, less its determinism test (114 s; passed in call 2) (after the architecture pass). One archive back.
set -u
. benchmarks/gpu_host.sh || exit 1  # wheels, PYTHONPATH, compilation cache, $OUT/gpu.txt
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.15 JAX_COMPILATION_CACHE_DIR=/tmp/xla_cache
CONV="--steps=600 --evals=3 --config.deterministic=True --runs=bfloat16:scan_vjp
      --config.optimizer.schedule=cosine --config.optimizer.warmup_steps=0 --config.optimizer.decay_steps=600"
mkdir -p /tmp/r6
for wave in "0 1 2 3 4" "5 6 7 8 9"; do
  for s in $wave; do
    ( timeout 150 python3 -m benchmarks.precision --out=/tmp/conv/s$s --seeds=$s $CONV > /tmp/r6/converge-s$s.log 2>&1 ) &
  done
  wait
done
for s in 0 1 2 3 4 5 6 7 8 9; do cp /tmp/conv/s$s/precision.json /tmp/r6/precision-s$s.json 2>/dev/null; done
unset XLA_PYTHON_CLIENT_MEM_FRACTION
timeout 200 make test-gpu GPU_PYTHON=python3 PYTEST_ARGS="-k 'not deterministic'" > /tmp/r6/test-gpu.txt 2>&1
tar -czf $OUT/run6.tgz -C /tmp r6
for s in 0 1 2 3 4 5 6 7 8 9; do grep -h "^| .*:" /tmp/conv/s$s/NOTES.md | tail -1; done; tail -3 /tmp/r6/test-gpu.txt
