#!/bin/bash
# GPU call B (one GPU): (1) the Mosaic pads-and-chunks cases against float32 (the test now measures
# both bfloat16 implementations against float32 at hidden 2048, where element-by-element failed on
# ReLU zero crossings in call A's run4), with each case's errors printed; (2) alone on the GPU,
# issue 51's step time per update, K=1 at batch 16 against K=4 micro-batches of 4 (benchmarks.train_recipe,
# seed 0, 400 updates). From the repository root, OUT set, .whl carried.
set -u
. benchmarks/gpu_host.sh || exit 1
R=/tmp/rb; mkdir -p $R
trap 'cp /tmp/rt/*.json /tmp/rt/*.md $R/ 2>/dev/null; tar -czf $OUT/run_b.tgz -C /tmp rb' EXIT
JAX_PLATFORMS=cuda timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_recurrence.py \
  -k "mosaic and pads_and_chunks" > $R/pads.log 2>&1; echo "pads_and_chunks: rc $? | $(tail -1 $R/pads.log)"
JAX_PLATFORMS=cuda timeout 150 python3 - > $R/errors.txt 2>&1 <<'PY'
import jax.numpy as jnp
from tests import test_recurrence as T
import numpy as np, jax
for b in (40, 64, 100):
    xs, w, dys = T.problem(jnp.bfloat16, t=11, b=b, h=2048, shared=True)
    with jax.default_matmul_precision("highest"):
        truth = T.outputs_and_grads("scan_vjp", xs.astype(jnp.float32), w.astype(jnp.float32), dys)
    for impl in ("mosaic", "scan_vjp", "scan"):
        e = [float(np.linalg.norm(a - t) / np.linalg.norm(t)) for a, t in zip(T.outputs_and_grads(impl, xs, w, dys), truth)]
        print(b, impl, " ".join(f"{x:.2e}" for x in e), flush=True)
PY
cat $R/errors.txt | tail -12
timeout 200 python3 -m benchmarks.train_recipe --out=/tmp/rt --seeds=0 --steps=400 --batch=16 > $R/recipe-alone.log 2>&1
echo "recipe alone: rc $?"; cat /tmp/rt/results.md 2>/dev/null || tail -5 $R/recipe-alone.log
