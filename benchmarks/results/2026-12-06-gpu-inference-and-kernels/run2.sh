#!/bin/bash
# Call 2 (one GPU, sequential, timings): the seed step with 'auto' taking the wide Mosaic calls.
#   1. benchmarks.scaling, jax 'auto' against torch_cudnn_graphs in the same process, bfloat16, at
#      SCALING_BATCHES per device (30 timed steps after 3 warm-up, median; counted model FLOPs and MFU);
#      16 per device also profiled (2 steps: the top kernels);
#   2. launch.py (what users run), seed config, bf16, synthetic 6-8 s data, at LAUNCH_BATCHES per
#      device: 200 steps, median of the 20-step intervals after the first, utterances per second.
# From the repository root, OUT set, .whl carried (fetch-wheels.sh tensorboardX==2.6.4).
set -u
START=$SECONDS
left() { echo $(( ${BUDGET_S:-585} - (SECONDS - START) )); }
cap() { local l=$(left); echo $(( l < $1 ? l : $1 )); }
. benchmarks/gpu_host.sh || exit 1
scaling() {  # name, flags...
  local name=$1; shift
  [ $(left) -lt 45 ] && { echo "$name: out of time"; return; }
  timeout $(cap 120) python3 -m benchmarks.scaling --config=configs/ds2_8gpu.py --config.dataset.name=synthetic \
      --steps=30 --warmup=3 --out=$OUT/$name --variants=jax,torch_cudnn_graphs --dtype=bfloat16 "$@" > $OUT/$name.log 2>&1
  echo "$name ($((SECONDS - START)) s):"; grep -E '^\| (jax|torch|bfloat16)' $OUT/$name/results.md 2>/dev/null | cut -c1-250
}
SEED="--config=configs/ds2_8gpu.py --config.dataset.name=synthetic --config.model.dtype=bfloat16 --config.num_train_steps=200 --config.log_every_steps=20 --config.eval_every_steps=0 --config.checkpoint_every_steps=100000"
launch() {  # per-device batch
  [ $(left) -lt 50 ] && { echo "launch b$1: out of time"; return; }
  timeout $(cap 110) python3 launch.py $SEED --config.per_device_batch_size=$1 --workdir=/tmp/w/b$1 > $OUT/launch-b$1.log 2>&1
  echo "launch b$1: rc $? ($((SECONDS - START)) s)"
  python3 -c "
import json, statistics, sys
b = int(sys.argv[2]); t = [r['step_time_s'] for r in map(json.loads, open(sys.argv[1])) if 'step_time_s' in r][1:]
m = statistics.median(t)
print(f'| {b} | {1e3 * m:.2f} | {b / m:,.0f} | {len(t)} |')" /tmp/w/b$1/metrics.jsonl $1 | tee -a $OUT/launch.md
}
echo "| per device | launch.py ms/step | utt/s | intervals |" > $OUT/launch.md
# The machine returns a few files only: every scaling folder comes back in one archive.
trap 'tar -czf $OUT/run2.tgz -C $OUT $(cd $OUT && ls -d b*/ *.log launch.md gpu.txt 2>/dev/null) 2>/dev/null' EXIT
for b in ${SCALING_BATCHES:-64 32 16}; do
  if [ $b = 16 ]; then scaling b$b --config.per_device_batch_size=$b --profile_steps=2
  else scaling b$b --config.per_device_batch_size=$b --profile_steps=0; fi
done
for b in ${LAUNCH_BATCHES:-64}; do launch $b; done
grep -h "recurrence:\|ctc:\|error:" $OUT/launch-*.log $OUT/*.log 2>/dev/null | sort | uniq -c | head
echo "done at $((SECONDS - START)) s"
