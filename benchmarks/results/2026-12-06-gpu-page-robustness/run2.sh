#!/bin/bash
# GPU box: the demo config with zero-padding augmentation (DS2_PAD_S hack), robust.py on each.
set -u
. benchmarks/gpu_host.sh || exit 1
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.12
R=/tmp/rob2; mkdir -p $R
trap 'tar -czf $OUT/robust2.tgz -C /tmp rob2' EXIT
rm -rf /tmp/hack && mkdir /tmp/hack && cp -r configs ds2_jax launch.py corpora benchmarks /tmp/hack/ && cd /tmp/hack && patch -p1 < benchmarks/results/2026-12-06-gpu-page-robustness/pad.patch > /dev/null || exit 1
export PYTHONPATH=/tmp/hack:$PYTHONPATH
read MANUAL DATA < <(python3 -c "from configs import demo; d = demo.get_config().dataset; print(d.manual_dir, d.data_dir)")
python3 -m ds2_jax.datasets.build --config.dataset.manual_dir=$MANUAL --config.dataset.data_dir=$DATA > $R/build.log 2>&1 || { tail -5 $R/build.log; exit 1; }
run() {  # name steps bidirectional pad_s pad_p
  DS2_PAD_S=$4 DS2_PAD_P=$5 python3 launch.py --config=configs/demo.py --workdir=/tmp/m2/$1 --config.num_train_steps=$2 \
    --config.optimizer.decay_steps=$2 --config.eval_every_steps=0 --config.checkpoint_every_steps=$2 \
    --config.num_devices=1 --config.model.bidirectional=$3 > $R/train-$1.log 2>&1
  echo "$1: rc $?"; tail -1 $R/train-$1.log | cut -c1-100
}
run u160p1 160 False 1.0 0.5 & run b160p1 160 True 1.0 0.5 & run u400p1 400 False 1.0 0.5 & run b400p1 400 True 1.0 0.5 &
run b160p2 160 True 2.0 0.8 & run u400p2 400 False 2.0 0.8 &
wait
JAX_PLATFORMS=cpu python3 benchmarks/results/2026-12-06-gpu-page-robustness/robust.py /tmp/m2/u160p1 /tmp/m2/b160p1 /tmp/m2/u400p1 /tmp/m2/b400p1 /tmp/m2/b160p2 /tmp/m2/u400p2 2>$R/robust.err | grep -v '^"\|^{$\|^}$' | tee $R/robust.jsonl
tail -3 $R/robust.err
