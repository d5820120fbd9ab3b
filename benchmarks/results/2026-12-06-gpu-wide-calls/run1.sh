#!/bin/bash
# Call 1 (one GPU): are the 32-64-row Mosaic calls right with rank 1's partial sent by
# async_store_smem (A, the committed kernel), and with the input added in registers on rank 0
# only, no identity product (B: variant-b-input-in-registers.patch on top)? Each: the kernel tests
# (forward and backward against float32, 3 calls agree bit for bit) run 3 times, the teacher-forced
# step diagnosis, and the seed layer's fwd / fwd+bwd time per call width.
# From the repository root, OUT set, .whl carried:  bash benchmarks/results/2026-12-06-gpu-wide-calls/run1.sh
set -u
START=$SECONDS
left() { echo $(( ${BUDGET_S:-585} - (SECONDS - START) )); }
cap() { local l=$(left); echo $(( l < $1 ? l : $1 )); }
R=benchmarks/results/2026-12-06-gpu-wide-calls
. benchmarks/gpu_host.sh || exit 1
SITE=${SITE:-/tmp/site}
P=$PWD/$R/variant-b-input-in-registers.patch
rm -rf /tmp/B && mkdir /tmp/B && cp -r ds2_jax benchmarks tests configs pytest.ini /tmp/B/ \
  && (cd /tmp/B && (git apply "$P" 2>/dev/null || patch -p1 < "$P")) \
  && grep -q "_input(in_smem, in_bar)" /tmp/B/ds2_jax/kernels/mosaic_rnn.py && echo "B: patch applied" || echo "B: PATCH FAILED"
kernel_tests() {  # variant dir run
  [ $(left) -lt 40 ] && { echo "$1 tests $3: out of time"; return; }
  (cd $2 && PYTHONPATH=$SITE:$2 JAX_PLATFORMS=cuda JAX_DEFAULT_MATMUL_PRECISION=highest timeout $(cap 170) \
    python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_recurrence.py -k "mosaic and (matches_float32 or pads_and_chunks)" \
    > $OUT/$1-tests-$3.log 2>&1)
  echo "$1 tests run $3: rc $? | $(tail -1 $OUT/$1-tests-$3.log) | $((SECONDS - START)) s"
  grep -E "^FAILED|Error" $OUT/$1-tests-$3.log | head -5
}
diag() {
  [ $(left) -lt 30 ] && { echo "$1 diag: out of time"; return; }
  (cd $2 && PYTHONPATH=$SITE:$2 timeout $(cap 60) python3 $PWD/$R/diagnose_exchange.py > $OUT/$1-diagnose.txt 2>&1)
  echo "$1 diagnose: rc $? ($((SECONDS - START)) s)"; grep -B1 "first bad\|Error" $OUT/$1-diagnose.txt | head -12
  echo "  cases all right: $(grep -c 'every step matches' $OUT/$1-diagnose.txt) directions"
}
layer() {
  [ $(left) -lt 45 ] && { echo "$1 layer: out of time"; return; }
  (cd $2 && PYTHONPATH=$SITE:$2 timeout $(cap 100) python3 -m benchmarks.recurrence_kernel --out=$OUT/$1-layer \
    --shape=267,2,64,2048 --mosaic_plans=16/1,32/1,64/4,64/8 --steps=20 > $OUT/$1-layer.log 2>&1)
  echo "$1 layer: rc $? ($((SECONDS - START)) s)"; cat $OUT/$1-layer/*.md 2>/dev/null | cut -c1-200 | head -20
}
trap 'tar -czf $OUT/layers.tgz -C $OUT A-layer B-layer 2>/dev/null' EXIT  # the machine returns a few files only
kernel_tests A $PWD 1
diag A $PWD
kernel_tests B /tmp/B 1
diag B /tmp/B
layer A $PWD
layer B /tmp/B
kernel_tests A $PWD 2
kernel_tests B /tmp/B 2
kernel_tests A $PWD 3
kernel_tests B /tmp/B 3
echo "done at $((SECONDS - START)) s"
