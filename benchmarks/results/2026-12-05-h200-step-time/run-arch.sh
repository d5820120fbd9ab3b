#!/bin/bash
# The GPU step time before and after the architecture pass (issue 31): the seed config, bf16,
# synthetic data, 300 steps through launch.py; now, then 1dc5b36 (extracted to bench_old/).
set -u
. benchmarks/gpu_host.sh || exit 1  # wheels, PYTHONPATH, compilation cache, $OUT/gpu.txt
SEED="--config=configs/ds2_8gpu.py --config.dataset.name=synthetic --config.num_train_steps=300 --config.log_every_steps=20 --config.eval_every_steps=0 --config.checkpoint_every_steps=100000 --config.model.dtype=bfloat16"
median() { python3 -c "
import json, statistics, sys
t = [r['step_time_s'] for r in map(json.loads, open(sys.argv[1])) if 'step_time_s' in r][1:]
print(f'{sys.argv[2]}: median {1e3 * statistics.median(t):.2f} ms/step over {len(t)} intervals of 20 steps')" "$1" "$2"; }
( export PYTHONPATH=$PWD:$PYTHONPATH; timeout 100 python3 launch.py $SEED --workdir=/tmp/w/now > $OUT/arch-now.log 2>&1 )
( cd bench_old && export PYTHONPATH=$PWD:$PYTHONPATH; timeout 100 python3 launch.py $SEED --workdir=/tmp/w/old > $OUT/arch-before.log 2>&1 )
( median /tmp/w/now/metrics.jsonl "after the architecture pass"; median /tmp/w/old/metrics.jsonl "before (1dc5b36)" ) | tee $OUT/arch-medians.txt
