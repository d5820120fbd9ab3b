#!/bin/bash
# Issue 43 in one call (the device time is short): the Mosaic kernels' numerics at 16-64 rows;
# benchmarks.scaling, jax 'auto' against torch_cudnn_graphs in the same run, bf16 at 16 / 32 / 64
# per device and float32 at 16; one layer at 64 rows (one call, state in 4 or 8 pieces, against
# two calls of 32 and scan_vjp); 16 s utterances; launch.py's trainer against its step at 64.
set -u
START=$SECONDS
left() { echo $(( ${BUDGET_S:-380} - (SECONDS - START) )); }
cap() { local l=$(left); echo $(( l < $1 ? l : $1 )); }
. benchmarks/gpu_host.sh || exit 1  # wheels, PYTHONPATH, compilation cache, $OUT/gpu.txt
JAX_PLATFORMS=cuda JAX_DEFAULT_MATMUL_PRECISION=highest timeout 130 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_recurrence.py -k "mosaic_kernel_matches or pads_and_chunks" > $OUT/test-mosaic.txt 2>&1
echo "tests rc=$?" >> $OUT/test-mosaic.txt; grep -E "passed|failed|FAILED|rc=" $OUT/test-mosaic.txt | tail -12
scaling() {  # name, flags...
  local name=$1; shift
  [ $(left) -lt 45 ] && { echo "$name: out of time"; return; }
  timeout $(cap 100) python3 -m benchmarks.scaling --config=configs/ds2_8gpu.py --config.dataset.name=synthetic \
      --steps=20 --warmup=3 \
      --out=$OUT/$name "$@" > $OUT/$name.log 2>&1
  echo "$name:"; grep -E '^\| (jax|torch)' $OUT/$name/results.md 2>/dev/null | cut -c1-140
  grep -m1 "recurrence: " $OUT/$name.log
}
for b in 16 32 64; do  # 'auto' takes Mosaic up to 16 rows (dispatch.MOSAIC_AUTO_ROWS): above, asked for
  impl=$([ $b -le 16 ] && echo auto || echo mosaic)
  scaling scaling-b$b --variants=jax,torch_cudnn_graphs --dtype=bfloat16 --config.per_device_batch_size=$b \
      --config.model.rnn_impl=$impl
done
[ $(left) -gt 50 ] && timeout $(cap 70) python3 -m benchmarks.recurrence_kernel --out=$OUT/layer-b64 \
    --shape=267,2,64,2048 --kernels= --mosaic_plans=64/4,64/8,32/1 --steps=15 > $OUT/layer-b64.log 2>&1
cat $OUT/layer-b64/recurrence_kernel.md 2>/dev/null
scaling scaling-b16-f32 --variants=jax,torch_cudnn_graphs --dtype=float32 --config.per_device_batch_size=16
scaling scaling-b16-16s --variants=jax --dtype=bfloat16 --config.per_device_batch_size=16 \
    --config.dataset.synthetic_min_duration_s=16 --config.dataset.synthetic_max_duration_s=16
[ $(left) -gt 60 ] && timeout $(cap 120) python3 -m benchmarks.trainer_vs_step --config=configs/ds2_8gpu.py \
    --config.model.dtype=bfloat16 --config.per_device_batch_size=64 --sources=synthetic --steps=120 \
    --step_steps=20 --out=$OUT/trainer-b64 > $OUT/trainer-b64.log 2>&1
cat $OUT/trainer-b64/trainer_vs_step.md 2>/dev/null
echo "done at $((SECONDS - START)) s"
