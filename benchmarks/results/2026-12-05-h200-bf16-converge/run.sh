#!/bin/bash
# One H200 call: make test-gpu, the seed-0..4 convergence (make converge-gpu's runs, split into
# three processes by seed so that it fits one call; merged afterwards with merge.py) and the
# per-part error on seed 1, all at once on the one GPU (each process 0.18 of its memory).
# Run from the repository root with .whl and .demo/tfds carried; results under $OUT.
set -u
. benchmarks/gpu_host.sh || exit 1  # wheels, PYTHONPATH, compilation cache, $OUT/gpu.txt
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.18 JAX_COMPILATION_CACHE_DIR=/tmp/xla_cache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/nvidia-smi.txt
python3 -c "import jax, flax, optax, matplotlib; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" > $OUT/versions.txt 2>&1
CONV="--steps=600 --evals=3 --config.deterministic=True --runs=float32:scan_vjp,bfloat16:scan_vjp,bfloat16:auto"
( timeout 540 python3 -m benchmarks.precision --out=/tmp/conv/a --seeds=0,1 $CONV > $OUT/converge-a.log 2>&1 ) &
( timeout 540 python3 -m benchmarks.precision --out=/tmp/conv/b --seeds=2,3 $CONV > $OUT/converge-b.log 2>&1 ) &
( timeout 540 python3 -m benchmarks.precision --out=/tmp/conv/c --seeds=4 $CONV > $OUT/converge-c.log 2>&1 ) &
( timeout 540 make test-gpu GPU_PYTHON=python3 > $OUT/gpu-numerics.txt 2>&1 ) &
( timeout 540 python3 -m benchmarks.precision_parts --out=/tmp/parts --batches=2 --track_steps=600 \
    --config.seed=1 > $OUT/parts.log 2>&1 ) &
wait
for d in a b c; do mkdir -p $OUT/converge-$d; cp /tmp/conv/$d/precision.json /tmp/conv/$d/NOTES.md /tmp/conv/$d/precision.png $OUT/converge-$d/ 2>/dev/null; done
mkdir -p $OUT/parts; cp /tmp/parts/parts.json /tmp/parts/NOTES.md $OUT/parts/ 2>/dev/null
tail -3 $OUT/gpu-numerics.txt; for d in a b c; do tail -12 $OUT/converge-$d/NOTES.md 2>/dev/null || tail -5 $OUT/converge-$d.log; done
