#!/bin/bash
# One H200 call, sequential (timings): the seed config on synthetic data through launch.py
# (what users run), 300 steps, median of the 20-step intervals after the first:
#   bf16 now; bf16 now with 32 steps in flight (the bound before issue 29); bf16 before the
#   precision fix (a096dd6, extracted to bench_old/); float32 now;
# then per_device_batch_size=4096 (float32): refused by the device-memory estimate, and how fast.
set -u
. benchmarks/gpu_host.sh || exit 1  # wheels, PYTHONPATH, compilation cache, $OUT/gpu.txt
SEED="--config=configs/ds2_8gpu.py --config.dataset.name=synthetic --config.num_train_steps=300 --config.log_every_steps=20 --config.eval_every_steps=0 --config.checkpoint_every_steps=100000"
median() { python3 -c "
import json, statistics, sys
t = [r['step_time_s'] for r in map(json.loads, open(sys.argv[1])) if 'step_time_s' in r][1:]
print(f'{sys.argv[2]}: median {1e3 * statistics.median(t):.2f} ms/step over {len(t)} intervals of 20 steps')" "$1" "$2"; }
inflight() { n=$1; shift; python3 -c "
import runpy, sys
from ds2_jax import resilience
resilience.STEPS_IN_FLIGHT = int(sys.argv[1]); sys.argv = ['launch.py'] + sys.argv[2:]
runpy.run_path('launch.py', run_name='__main__')" $n "$@"; }
run() { name=$1; shift; t0=$(date +%s.%N); "$@" > $OUT/$name.log 2>&1; rc=$?
  echo "$name: rc $rc, $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s wall" | tee -a $OUT/walls.txt; }
( export PYTHONPATH=$PWD:$PYTHONPATH
  run bf16 python3 launch.py $SEED --config.model.dtype=bfloat16 --workdir=/tmp/w/bf16
  run bf16-inflight32 inflight 32 $SEED --config.model.dtype=bfloat16 --workdir=/tmp/w/bf16-32
  run float32 python3 launch.py $SEED --workdir=/tmp/w/f32
  run batch4096 timeout 90 python3 launch.py $SEED --config.per_device_batch_size=4096 --workdir=/tmp/w/b4096 )
( cd bench_old && export PYTHONPATH=$PWD:$PYTHONPATH
  run bf16-before-fix python3 launch.py $SEED --config.model.dtype=bfloat16 --workdir=/tmp/w/old )
for n in bf16:bf16 bf16-inflight32:bf16-32 float32:f32; do median /tmp/w/${n##*:}/metrics.jsonl ${n%%:*}; done | tee $OUT/medians.txt
median /tmp/w/old/metrics.jsonl bf16-before-fix | tee -a $OUT/medians.txt
grep -h "device memory\|error:\|recurrence:\|ctc:" $OUT/*.log | sort | uniq -c | tee $OUT/lines.txt
