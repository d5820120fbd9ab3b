#!/bin/bash
# One device call, sequential (timings): 'auto' at every batch size since dispatch.MOSAIC_AUTO_ROWS = 48.
#   1. benchmarks.scaling: jax 'auto' against torch_cudnn_graphs in the same process at 32 and 48 per
#      device, bfloat16 and float32 (30 timed steps after 3 warm-up, median);
#   2. launch.py (what users run), seed config, bf16, synthetic 6-8 s data, at 16 / 32 / 48 / 64 per
#      device: 200 steps, median of the 20-step intervals after the first, and utterances per second;
#   3. 16 s utterances at 16 per device, jax against torch_cudnn_graphs, bf16.
# Run from the repository root with OUT set and .whl carried (fetch-wheels.sh, with tensorboardX==2.6.4);
# BUDGET_S (default 560); PARTS (default 'scaling launch long') picks the parts, SCALING_BATCHES (default
# '32 48') and LAUNCH_BATCHES (default '16 32 48 64') the per-device batches of parts 1 and 2.
set -u
START=$SECONDS
left() { echo $(( ${BUDGET_S:-560} - (SECONDS - START) )); }
cap() { local l=$(left); echo $(( l < $1 ? l : $1 )); }
. benchmarks/gpu_host.sh || exit 1  # wheels, PYTHONPATH, compilation cache, $OUT/gpu.txt
scaling() {  # name, flags...
  local name=$1; shift
  [ $(left) -lt 45 ] && { echo "$name: out of time"; return; }
  timeout $(cap 130) python3 -m benchmarks.scaling --config=configs/ds2_8gpu.py --config.dataset.name=synthetic \
      --steps=30 --warmup=3 --profile_steps=0 --out=/tmp/s/$name "$@" > $OUT/$name.log 2>&1
  cp /tmp/s/$name/results.md $OUT/$name.md 2>/dev/null
  echo "$name ($((SECONDS - START)) s):"; grep -E '^\| (jax|torch)' /tmp/s/$name/results.md 2>/dev/null | cut -c1-150
}
SEED="--config=configs/ds2_8gpu.py --config.dataset.name=synthetic --config.model.dtype=bfloat16 --config.num_train_steps=200 --config.log_every_steps=20 --config.eval_every_steps=0 --config.checkpoint_every_steps=100000"
launch() {  # per-device batch
  [ $(left) -lt 50 ] && { echo "launch b$1: out of time"; return; }
  timeout $(cap 120) python3 launch.py $SEED --config.per_device_batch_size=$1 --workdir=/tmp/w/b$1 > $OUT/launch-b$1.log 2>&1
  echo "launch b$1: rc $? ($((SECONDS - START)) s)"
  python3 -c "
import json, statistics, sys
b = int(sys.argv[2]); t = [r['step_time_s'] for r in map(json.loads, open(sys.argv[1])) if 'step_time_s' in r][1:]
m = statistics.median(t)
print(f'| {b} | {1e3 * m:.2f} | {b / m:,.0f} | {len(t)} |')" /tmp/w/b$1/metrics.jsonl $1 | tee -a $OUT/launch.md
}
has() { [[ " ${PARTS:-scaling launch long} " == *" $1 "* ]]; }
has scaling && for b in ${SCALING_BATCHES:-32 48}; do scaling b$b --variants=jax,torch_cudnn_graphs --dtype=bfloat16,float32 --config.per_device_batch_size=$b; done
has launch && echo "| per device | launch.py ms/step | utt/s | intervals |" > $OUT/launch.md
has launch && for b in ${LAUNCH_BATCHES:-16 32 48 64}; do launch $b; done
has long && scaling b16-16s --variants=jax,torch_cudnn_graphs --dtype=bfloat16 --config.per_device_batch_size=16 \
    --config.dataset.synthetic_min_duration_s=16 --config.dataset.synthetic_max_duration_s=16
grep -h "recurrence:\|ctc:\|error:" $OUT/launch-*.log | sort | uniq -c
echo "done at $((SECONDS - START)) s"
