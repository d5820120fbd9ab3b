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
p(){ while [ $(jobs -r|wc -l) -ge 9 ];do sleep 1;done; }
t src demo test-clean 160 30 &
for S in 0 1 2;do for N in 100 130 200;do p;t es${N}s$S tiny_es test $N 30 --config.seed=$S & done;done
until grep -q ^src $OUT/res.txt 2>/dev/null;do sleep 2;done
I=--config.init_from=$W/src
for S in 0 1 2;do for K in 30 40 60;do
p;t esft${K}s$S tiny_es test $K 0 --config.seed=$S $I &
p;t esscr${K}s$S tiny_es test $K 0 --config.seed=$S &
done;done
V="--config.dataset.train_splits=dev-clean"
for S in 0 1;do for R in 5e-4 1e-3;do for K in 30 60;do
p;t dft${K}r${R}s$S demo test-clean $K 0 --config.seed=$S $V --config.optimizer.learning_rate=$R $I &
done;p;t dscr30r${R}s$S demo test-clean 30 0 --config.seed=$S $V --config.optimizer.learning_rate=$R &
done;done
wait;sort $OUT/res.txt
