#!/bin/bash
# Call 3 (one GPU): make converge-gpu's protocol at 32 and 64 per device (the wide Mosaic calls):
# float32 scan_vjp (the reference) and bfloat16 'auto', 600 steps, cosine to 0, deterministic ops,
# the bundled corpus; SEEDS (default 0 1 2) x 2 batch sizes, one process each, all at once sharing
# the GPU (deterministic ops: sharing changes no number, only the ms/step column).
# From the repository root, OUT set, .whl carried.
set -u
. benchmarks/gpu_host.sh || exit 1
SEEDS=${SEEDS:-0 1 2}
n=$(( $(echo $SEEDS | wc -w) * 2 ))
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / $n, 3))")
mkdir -p /tmp/r3
trap 'tar -czf $OUT/run3.tgz -C /tmp r3' EXIT  # what there is, also when the call's limit stops it
read MANUAL DATA < <(python3 -c "from configs import demo; d = demo.get_config().dataset; print(d.manual_dir, d.data_dir)")
python3 -m ds2_jax.datasets.build --config.dataset.manual_dir=$MANUAL --config.dataset.data_dir=$DATA > /tmp/r3/build.log 2>&1 || { tail -5 /tmp/r3/build.log; exit 1; }
for b in 32 64; do for s in $SEEDS; do
  ( timeout ${RUN_S:-560} python3 -m benchmarks.precision --out=/tmp/conv/b$b-s$s --seeds=$s --steps=600 --evals=3 \
      --config.deterministic=True --config.per_device_batch_size=$b --runs=float32:scan_vjp,bfloat16:auto \
      > /tmp/r3/converge-b$b-s$s.log 2>&1; echo "b$b seed $s: rc $?" ) &
done; done
wait
for b in 32 64; do for s in $SEEDS; do
  cp /tmp/conv/b$b-s$s/precision.json /tmp/r3/precision-b$b-s$s.json 2>/dev/null; cp /tmp/conv/b$b-s$s/NOTES.md /tmp/r3/NOTES-b$b-s$s.md 2>/dev/null
  echo "b$b seed $s:"; grep -h "^| .*:" /tmp/conv/b$b-s$s/NOTES.md 2>/dev/null | cut -c1-160
done; done
grep -h "recurrence:" /tmp/r3/*.log | sort | uniq -c
