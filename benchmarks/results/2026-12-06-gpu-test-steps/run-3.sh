. benchmarks/gpu_host.sh||exit 1
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.05 PYTHONUNBUFFERED=1
L=/tmp/log;mkdir -p $L;W=/tmp/w;trap 'tar czf $OUT/logs.tgz -C /tmp log' EXIT
python3 -m ds2_jax.datasets.build --config=configs/demo.py --config.dataset.data_dir=/tmp/d >$L/b1 2>&1
python3 -m ds2_jax.datasets.build --config=configs/tiny_es.py --config.dataset.data_dir=/tmp/t >$L/b2 2>&1
t(){ # name config split steps warmup extra...
n=$1 c=$2 s=$3 k=$4;a="--config=configs/$c.py --workdir=$W/$n --config.num_train_steps=$k --config.optimizer.decay_steps=$k --config.optimizer.warmup_steps=$5 --config.eval_every_steps=0 --config.checkpoint_every_steps=$k --config.num_devices=1 --config.dataset.num_workers=0 --config.dataset.data_dir=/tmp/${c:0:1}";shift 5
python3 launch.py $a "$@" >$L/$n.t 2>&1;python3 launch.py $a "$@" --mode=eval --config.eval.split=$s >$L/$n.e 2>&1
echo $n $(python3 -c "import json,glob;r=json.load(open(glob.glob('$W/$n/eval-$s-*.json')[0]));print(round(r['cer'],4),round(r['wer'],4))") >>$OUT/res.txt
}
p(){ while [ $(jobs -r|wc -l) -ge 10 ];do sleep 1;done; }
t src demo test-clean 160 30 &
B="--config.per_device_batch_size=8"
for S in 0 1 2;do
p;t es130b8s$S tiny_es test 130 30 --config.seed=$S $B &
p;t es100r3s$S tiny_es test 100 30 --config.seed=$S --config.optimizer.learning_rate=3e-3 &
done
until grep -q ^src $OUT/res.txt 2>/dev/null;do sleep 2;done
I=--config.init_from=$W/src
for S in 0 1 2;do for v in "60b8 60 $B" "40r3 40 --config.optimizer.learning_rate=3e-3" "30r4 30 --config.optimizer.learning_rate=4e-3";do set -- $v;n=$1;k=$2;shift 2
p;t esft${n}s$S tiny_es test $k 0 --config.seed=$S $I "$@" &
p;t esscr${n}s$S tiny_es test $k 0 --config.seed=$S "$@" &
done;done
wait;sort $OUT/res.txt
