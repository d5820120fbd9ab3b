#!/bin/bash
# One GPU call: redecode_cost.py's stream of a bidirectional demo-sized model on the GPU (the JAX
# engine), 60 s and 300 s of speech. From the repository root, OUT set, .whl carried.
set -u
. benchmarks/gpu_host.sh || exit 1
for s in 60 300; do
  timeout 250 python3 benchmarks/results/2026-12-06-cpu-one-model/redecode_cost.py $s > $OUT/gpu-$s.jsonl 2> $OUT/gpu-$s.err
  echo "$s s: rc $?"; tail -1 $OUT/gpu-$s.jsonl
done
