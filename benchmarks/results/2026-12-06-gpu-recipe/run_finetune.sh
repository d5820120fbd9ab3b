#!/bin/bash
# Issue 51 item 4 on one GPU: benchmarks.finetune_study (English demo model -> the bundled Spanish
# corpus, every variant against scratch at 150 updates), SEEDS (default 0 1 2) one process each, all
# at once sharing the GPU, then a last call that collects results.json/.md. A second call on the same
# warm machine goes on where this one stopped: STUDY lies in the repository root (ignored, kept
# between calls), runs already scored are read back and unfinished ones resume from their checkpoint.
# From the repository root, OUT set, .whl carried. VARIANTS (comma-separated) and ARGS pass through.
set -u
. benchmarks/gpu_host.sh || exit 1
SEEDS=${SEEDS:-0 1 2}
STUDY=${STUDY:-.finetune_study}
n=$(echo $SEEDS | wc -w)
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / $n, 3))")
mkdir -p $STUDY/logs
# scores, results, logs and the runs' metrics, not their checkpoints nor the corpora's builds
trap 'tar -czf $OUT/finetune.tgz --exclude=checkpoints --exclude="tfds-*" $STUDY' EXIT
FLAGS="--out=$STUDY ${VARIANTS:+--variants=$VARIANTS} ${ARGS:-}"
python3 -m benchmarks.finetune_study $FLAGS --prepare > $STUDY/logs/prepare.log 2>&1 || { tail -5 $STUDY/logs/prepare.log; exit 1; }
for s in $SEEDS; do
  ( timeout ${RUN_S:-470} python3 -m benchmarks.finetune_study $FLAGS --seeds=$s >> $STUDY/logs/seed$s.log 2>&1
    echo "seed $s: rc $?" ) &
done
wait
grep -h '^{"variant"' $STUDY/logs/seed*.log
python3 -m benchmarks.finetune_study $FLAGS --seeds=$(echo $SEEDS | tr ' ' ,) --collect > $STUDY/logs/collect.log 2>&1 || tail -5 $STUDY/logs/collect.log
cat $STUDY/results.md
