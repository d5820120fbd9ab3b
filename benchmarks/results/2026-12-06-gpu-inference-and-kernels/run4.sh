#!/bin/bash
# Call 4 (one GPU, the session's last device seconds, on call 1's warm machine and compile cache):
# make test-gpu (every GPU-marked test: the kernels, CTC, space-to-depth, the batch axis, the bf16
# step), then the Mosaic kernel tests once more while time is left. From the repository root, OUT set,
# .whl carried.
set -u
START=$SECONDS
left() { echo $(( ${BUDGET_S:-450} - (SECONDS - START) )); }
. benchmarks/gpu_host.sh || exit 1
timeout $(left) make test-gpu GPU_PYTHON=python3 PYTEST_ARGS="-p no:cacheprovider" > $OUT/test-gpu.log 2>&1
echo "make test-gpu: rc $? | $(tail -1 $OUT/test-gpu.log) | $((SECONDS - START)) s"; grep -E "^FAILED|^ERROR" $OUT/test-gpu.log | head -8
if [ $(left) -gt 60 ]; then
  JAX_PLATFORMS=cuda JAX_DEFAULT_MATMUL_PRECISION=highest timeout $(left) python3 -m pytest -q -p no:cacheprovider \
    -m gpu tests/test_recurrence.py -k mosaic > $OUT/tests-4.log 2>&1
  echo "tests run 4: rc $? | $(tail -1 $OUT/tests-4.log) | $((SECONDS - START)) s"
fi
