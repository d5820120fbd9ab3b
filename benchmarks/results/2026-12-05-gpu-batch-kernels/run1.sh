#!/bin/bash
# Mosaic kernels taking 16-32 rows per call (64: two calls): numerics, then the seed step at
# 16 / 32 / 64 per device against torch_cudnn_graphs in the same run, then one layer at 64 and
# 128 rows (Mosaic in row chunks against scan_vjp: where 'auto' stops taking Mosaic).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-} JAX_COMPILATION_CACHE_DIR=/tmp/xla_cache
nvidia-smi -L > $OUT/gpu.txt
JAX_PLATFORMS=cuda JAX_DEFAULT_MATMUL_PRECISION=highest timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_recurrence.py -k mosaic > $OUT/test-mosaic.txt 2>&1; echo "tests rc=$?" >> $OUT/test-mosaic.txt
tail -3 $OUT/test-mosaic.txt
for b in 16 32 64; do
  timeout 150 python3 -m benchmarks.scaling --config=configs/ds2_8gpu.py --variants=jax,torch_cudnn_graphs \
      --dtype=bfloat16 --config.per_device_batch_size=$b --steps=30 --warmup=5 --out=$OUT/scaling-b$b > $OUT/scaling-b$b.log 2>&1
  grep -E "^\| (jax|torch)" $OUT/scaling-b$b/results.md | cut -c1-200
done
for b in 64 128; do
  timeout 90 python3 -m benchmarks.recurrence_kernel --out=$OUT/layer-b$b --shape=267,2,$b,2048 --kernels= --steps=20 > $OUT/layer-b$b.log 2>&1
  cat $OUT/layer-b$b/recurrence_kernel.md
done
