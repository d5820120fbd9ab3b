#!/bin/bash
# Call 1 (one GPU): the wide Mosaic calls checked again (meant for an H200; an H100 came). The whole Mosaic
# kernel-test set (forward and backward against float32, three calls equal bit for bit, the padded
# and chunked batches) run 3 times, the teacher-forced step diagnosis of ../2026-12-06-gpu-wide-calls/,
# and the seed layer's time per call width. Everything comes back in one archive (the machine
# returns a few files only). From the repository root, OUT set, .whl carried.
set -u
START=$SECONDS
left() { echo $(( ${BUDGET_S:-585} - (SECONDS - START) )); }
cap() { local l=$(left); echo $(( l < $1 ? l : $1 )); }
R=/tmp/r1; mkdir -p $R
trap 'cp $OUT/gpu.txt $R/ 2>/dev/null; tar -czf $OUT/run1.tgz -C /tmp r1' EXIT
. benchmarks/gpu_host.sh || exit 1
kernel_tests() {  # run number
  [ $(left) -lt 40 ] && { echo "tests run $1: out of time"; return; }
  JAX_PLATFORMS=cuda JAX_DEFAULT_MATMUL_PRECISION=highest timeout $(cap 330) python3 -m pytest -q -p no:cacheprovider \
    -m gpu tests/test_recurrence.py -k "mosaic" > $R/tests-$1.log 2>&1
  echo "tests run $1: rc $? | $(tail -1 $R/tests-$1.log) | $((SECONDS - START)) s"
  grep -E "^FAILED|^ERROR" $R/tests-$1.log | head -8
}
diag() {
  [ $(left) -lt 30 ] && { echo "diag: out of time"; return; }
  timeout $(cap 80) python3 benchmarks/results/2026-12-06-gpu-wide-calls/diagnose_exchange.py > $R/diagnose.txt 2>&1
  echo "diagnose: rc $? ($((SECONDS - START)) s); directions right at every step: $(grep -c 'every step matches' $R/diagnose.txt) of 26"
  grep -B1 "first bad\|Error" $R/diagnose.txt | head -12
}
layer() {
  [ $(left) -lt 45 ] && { echo "layer: out of time"; return; }
  timeout $(cap 100) python3 -m benchmarks.recurrence_kernel --out=$R/layer \
    --shape=267,2,64,2048 --mosaic_plans=16/1,32/1,64/4,64/8 --steps=20 > $R/layer.log 2>&1
  echo "layer: rc $? ($((SECONDS - START)) s)"; cat $R/layer/*.md 2>/dev/null | cut -c1-200 | head -20
}
kernel_tests 1
diag
layer
kernel_tests 2
kernel_tests 3
echo "done at $((SECONDS - START)) s"
