#!/bin/bash
# The third H200 call: run2.sh's float32 and bfloat16 'auto' runs (10) again with a warm-up and a cosine decay to 0 at the last
# step (warmup_steps=50, decay_steps=550), so that the final CER is a settled model's rather than
# wherever a constant-rate run's loss spikes (run2: spikes in float32 and bfloat16 alike) left it.
# Everything returned in one archive (the machine returns few files).
set -u
. benchmarks/gpu_host.sh || exit 1  # wheels, PYTHONPATH, compilation cache, $OUT/gpu.txt
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.15 JAX_COMPILATION_CACHE_DIR=/tmp/xla_cache
CONV="--steps=600 --evals=3 --config.deterministic=True --runs=float32:scan_vjp,bfloat16:auto
      --config.optimizer.schedule=cosine --config.optimizer.warmup_steps=50 --config.optimizer.decay_steps=550"
mkdir -p /tmp/r3
for s in 0 1 2 3 4; do
  ( timeout 190 python3 -m benchmarks.precision --out=/tmp/conv/s$s --seeds=$s $CONV > /tmp/r3/converge-s$s.log 2>&1 ) &
done
wait
for s in 0 1 2 3 4; do cp /tmp/conv/s$s/precision.json /tmp/r3/precision-s$s.json 2>/dev/null; done
tar -czf $OUT/run3.tgz -C /tmp r3
for s in 0 1 2 3 4; do grep -h "^| .*:" /tmp/conv/s$s/NOTES.md | tail -3; done
