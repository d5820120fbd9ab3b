#!/bin/bash
# Call 4 (the session's last device seconds): the kernel-test cases call 1's cap left unrun (64 rows in 4 and
# in 8 pieces at hidden 2048, 32 rows in 4 pieces at 512, the padded and chunked batches), then the
# whole Mosaic set again while time is left. From the repository root, OUT set, .whl carried.
set -u
START=$SECONDS
left() { echo $(( ${BUDGET_S:-250} - (SECONDS - START) )); }
. benchmarks/gpu_host.sh || exit 1
run() {  # name, -k expression
  [ $(left) -lt 30 ] && { echo "$1: out of time"; return; }
  JAX_PLATFORMS=cuda JAX_DEFAULT_MATMUL_PRECISION=highest timeout $(left) python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_recurrence.py -k "$2" > $OUT/$1.log 2>&1
  echo "$1: rc $? | $(tail -1 $OUT/$1.log) | $((SECONDS - START)) s"; grep -E "^FAILED" $OUT/$1.log | head -5
}
run rest "(matches_float32 and (267-2048-64-4 or 267-2048-64-8 or 9-512-32-4)) or (mosaic and pads_and_chunks)"
run again "mosaic and matches_float32"
