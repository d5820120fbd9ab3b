#!/bin/bash
# GPU box: trains demo-config models (unidirectional / bidirectional, 160 / 400 steps), then robust.py.
set -u
. benchmarks/gpu_host.sh || exit 1
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.15
R=/tmp/rob; mkdir -p $R
trap 'tar -czf $OUT/robust.tgz -C /tmp rob' EXIT
read MANUAL DATA < <(python3 -c "from configs import demo; d = demo.get_config().dataset; print(d.manual_dir, d.data_dir)")
python3 -m ds2_jax.datasets.build --config.dataset.manual_dir=$MANUAL --config.dataset.data_dir=$DATA > $R/build.log 2>&1 || { tail -5 $R/build.log; exit 1; }
run() {  # name steps bidirectional seed [extra]
  python3 launch.py --config=configs/demo.py --workdir=/tmp/m/$1 --config.num_train_steps=$2 \
    --config.optimizer.decay_steps=$2 --config.eval_every_steps=0 --config.checkpoint_every_steps=$2 \
    --config.num_devices=1 --config.model.bidirectional=$3 --config.seed=$4 ${5:-} > $R/train-$1.log 2>&1
  echo "$1: rc $?"; tail -2 $R/train-$1.log
}
run u160s0 160 False 0 & run b160s0 160 True 0 & run u800s0 800 False 0 &

wait
JAX_PLATFORMS=cpu python3 benchmarks/results/2026-12-06-gpu-page-robustness/robust.py /tmp/m/u160s0 /tmp/m/b160s0 /tmp/m/u800s0 2>$R/robust.err | tee $R/robust.jsonl
tail -3 $R/robust.err
