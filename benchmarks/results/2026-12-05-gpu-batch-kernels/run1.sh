#!/bin/bash
# Mosaic kernels for 16-64 rows per call (the state whole, or in pieces through two buffers
# above 32 rows at hidden 2048): numerics; one layer at 64 and 128 rows (calls x rows x pieces
# against scan_vjp); the seed step at 16 / 32 / 64 per device ('auto'; 64 also with scan_vjp).
set -u
START=$SECONDS
left() { echo $(( 570 - (SECONDS - START) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-} JAX_COMPILATION_CACHE_DIR=/tmp/xla_cache
nvidia-smi -L > $OUT/gpu.txt
JAX_PLATFORMS=cuda JAX_DEFAULT_MATMUL_PRECISION=highest timeout 210 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_recurrence.py -k "mosaic" > $OUT/test-mosaic.txt 2>&1; echo "tests rc=$?" >> $OUT/test-mosaic.txt
grep -E "passed|failed|PASS|FAIL|Error|rc=" $OUT/test-mosaic.txt | tail -15
for spec in "64 32/1,64/4,64/8" "128 64/4,64/8,32/1"; do
  set -- $spec
  timeout $(( $(left) < 75 ? $(left) : 75 )) python3 -m benchmarks.recurrence_kernel --out=$OUT/layer-b$1 --shape=267,2,$1,2048 \
      --kernels= --mosaic_plans=$2 --steps=20 > $OUT/layer-b$1.log 2>&1
  cat $OUT/layer-b$1/recurrence_kernel.md 2>/dev/null || tail -3 $OUT/layer-b$1.log
done
for run in "16 auto" "32 auto" "64 auto" "64 scan_vjp"; do
  set -- $run
  [ $(left) -lt 30 ] && { echo "out of time before b$1 $2"; break; }
  timeout $(( $(left) < 100 ? $(left) : 100 )) python3 -m benchmarks.scaling --config=configs/ds2_8gpu.py --variants=jax \
      --dtype=bfloat16 --config.per_device_batch_size=$1 --config.model.rnn_impl=$2 --steps=30 --warmup=5 \
      --out=$OUT/scaling-b$1-$2 > $OUT/scaling-b$1-$2.log 2>&1
  echo "b$1 $2: $(grep -E '^\| jax' $OUT/scaling-b$1-$2/results.md 2>/dev/null | head -1 | cut -c1-160)"
  grep -E "recurrence: auto" $OUT/scaling-b$1-$2.log | head -1
done
