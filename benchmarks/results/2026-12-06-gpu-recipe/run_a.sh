#!/bin/bash
# GPU call A (one GPU), two sets of processes sharing it at once, everything back in one archive:
#  1. make converge-gpu's protocol at 32 and 64 per device (issue 48's wide Mosaic calls, now what
#     'auto' runs there): float32 scan_vjp against bfloat16 'auto', 600 steps, deterministic ops,
#     the bundled corpus, seeds 0-2 (benchmarks/results/2026-12-06-gpu-wide-calls/run3.sh's runs);
#  2. issue 51's recipe table on the demo (benchmarks.train_recipe): per seed 0-2, K=1 at batch 16
#     with EMA and the average of the last 5 checkpoints, and K=4 micro-batches of 4, 400 updates.
# Step times here are of processes sharing one GPU: only the CER columns are this call's figures.
# From the repository root, OUT set, .whl carried.
set -u
. benchmarks/gpu_host.sh || exit 1
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.1
R=/tmp/ra; mkdir -p $R
trap 'cp /tmp/recipe/*.json /tmp/recipe/*.md $R/ 2>/dev/null; for d in /tmp/recipe/s*/run-*; do mkdir -p $R/$(basename $(dirname $d))-$(basename $d); cp $d/*.jsonl $d/*.json $R/$(basename $(dirname $d))-$(basename $d)/ 2>/dev/null; done; tar -czf $OUT/run_a.tgz -C /tmp ra' EXIT
read MANUAL DATA < <(python3 -c "from configs import demo; d = demo.get_config().dataset; print(d.manual_dir, d.data_dir)")
python3 -m ds2_jax.datasets.build --config.dataset.manual_dir=$MANUAL --config.dataset.data_dir=$DATA > $R/build.log 2>&1 || { tail -5 $R/build.log; exit 1; }
for b in 32 64; do for s in 0 1 2; do
  ( timeout ${RUN_S:-540} python3 -m benchmarks.precision --out=/tmp/conv/b$b-s$s --seeds=$s --steps=600 --evals=3 \
      --config.deterministic=True --config.per_device_batch_size=$b --runs=float32:scan_vjp,bfloat16:auto \
      > $R/converge-b$b-s$s.log 2>&1; echo "converge b$b seed $s: rc $?" ) &
done; done
for s in 0 1 2; do
  ( timeout ${RUN_S:-540} python3 -m benchmarks.train_recipe --out=/tmp/recipe/s$s --seeds=$s --steps=400 --batch=16 \
      > $R/recipe-s$s.log 2>&1; echo "recipe seed $s: rc $?"; cp /tmp/recipe/s$s/row-seed$s.json /tmp/recipe/ 2>/dev/null ) &
done
wait
for b in 32 64; do for s in 0 1 2; do
  cp /tmp/conv/b$b-s$s/precision.json $R/precision-b$b-s$s.json 2>/dev/null; cp /tmp/conv/b$b-s$s/NOTES.md $R/NOTES-b$b-s$s.md 2>/dev/null
  echo "b$b seed $s:"; grep -h "^| .*:" /tmp/conv/b$b-s$s/NOTES.md 2>/dev/null | cut -c1-160
done; done
grep -h "recurrence:" $R/*.log | sort | uniq -c
mkdir -p /tmp/recipe/all && cp /tmp/recipe/row-seed*.json /tmp/recipe/all/ 2>/dev/null
python3 -m benchmarks.train_recipe --out=/tmp/recipe/all --seeds=0,1,2 --steps=400 --batch=16 > $R/recipe-collect.log 2>&1
cat /tmp/recipe/all/results.md 2>/dev/null || tail -5 $R/recipe-*.log
