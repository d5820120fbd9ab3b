#!/bin/bash
# The honest PyTorch comparison (issue 42) in one device call: benchmarks.scaling, jax 'auto' against
# torch_cudnn_graphs (cuDNN + CUDA graphs, the strongest PyTorch twin) in the same process, float32 and
# bfloat16, at 16 / 32 / 64 per device; 16 s utterances at 16; launch.py's trainer against its step at 64.
#   run from the repository root with BUDGET_S (default 480) and OUT set; .whl carried (fetch-wheels.sh);
#   BATCHES (default '16 32 64') picks the per-device batches, LONG=0 leaves out the last two parts
set -u
START=$SECONDS
left() { echo $(( ${BUDGET_S:-480} - (SECONDS - START) )); }
cap() { local l=$(left); echo $(( l < $1 ? l : $1 )); }
. benchmarks/gpu_host.sh || exit 1  # wheels, PYTHONPATH, compilation cache, $OUT/gpu.txt
scaling() {  # name, flags...
  local name=$1; shift
  [ $(left) -lt 45 ] && { echo "$name: out of time"; return; }
  timeout $(cap 130) python3 -m benchmarks.scaling --config=configs/ds2_8gpu.py --config.dataset.name=synthetic \
      --steps=30 --warmup=3 --profile_steps=0 --out=$OUT/$name "$@" > $OUT/$name.log 2>&1
  echo "$name ($((SECONDS - START)) s):"; grep -E '^\| (jax|torch|bfloat16|float32|any) ' $OUT/$name/results.md 2>/dev/null | cut -c1-150
}
for b in ${BATCHES:-16 32 64}; do
  scaling b$b --variants=jax,torch_cudnn_graphs --dtype=bfloat16,float32 --config.per_device_batch_size=$b \
      --profile_steps=$([ $b = 16 ] && echo 2 || echo 0)
done
[ ${LONG:-1} = 1 ] && scaling b16-16s --variants=jax,torch_cudnn_graphs --dtype=bfloat16 --config.per_device_batch_size=16 \
    --config.dataset.synthetic_min_duration_s=16 --config.dataset.synthetic_max_duration_s=16
[ ${LONG:-1} = 1 ] && [ $(left) -gt 60 ] && timeout $(cap 120) python3 -m benchmarks.trainer_vs_step --config=configs/ds2_8gpu.py \
    --config.per_device_batch_size=64 --sources=synthetic --steps=150 --step_steps=30 \
    --out=$OUT/trainer-b64 > $OUT/trainer-b64.log 2>&1
cat $OUT/trainer-b64/trainer_vs_step.md 2>/dev/null | grep -E '^\|' | cut -c1-160
echo "done at $((SECONDS - START)) s"
