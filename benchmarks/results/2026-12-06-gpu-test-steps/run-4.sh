. benchmarks/gpu_host.sh||exit 1
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.05
W=/w
python3 -m ds2_jax.datasets.build --config=configs/demo.py --config.dataset.data_dir=/tmp/d &>-
cat >/tmp/r.py <<'P'
import glob,sys,numpy as np,soxr
from ds2_jax import audio,metrics,settings
from ds2_jax.infer import jax_backend
w=sys.argv[1];e=jax_backend.JaxEngine(w,settings.Decoding(beam_width=0));c=[];pg=0
for p in sorted(glob.glob("corpora/*/*/test-clean/*/*/*.flac")):
 s=audio.read(p,16000);x=np.concatenate([np.zeros(16000,np.int16),s,np.zeros(24000,np.int16)])
 R=soxr.resample;r=R(R(x/32768,16000,48000),48000,16000)
 r=np.clip(np.round(r*32768),-32768,32767).astype(np.int16);t=e.transcribe([x,r[148:],r[628:],x[320:]])
 k=[metrics.error_rates([t[0]],[u])["cer"] for u in t[1:]];c+=k
 if "118-1180-0001" in p:pg=k
c=np.array(c);print(w,round(c.mean(),3),round(float((c>.4).mean()),3),pg)
P
t(){ n=$1 c=$2 s=$3 k=$4;a="--config=configs/$c.py --workdir=$W/$n --config.num_train_steps=$k --config.optimizer.decay_steps=$k --config.optimizer.warmup_steps=$5 --config.eval_every_steps=0 --config.checkpoint_every_steps=$k --config.num_devices=1 --config.dataset.data_dir=/tmp/d";shift 5
python3 launch.py $a "$@" &>-;[ $s = r ]&&{ JAX_PLATFORMS=cpu python3 /tmp/r.py $W/$n>>$OUT/res.txt;return;}
python3 launch.py $a "$@" --mode=eval --config.eval.split=$s &>-
echo $n $(python3 -c "import json,glob;r=json.load(open(glob.glob('$W/$n/eval-*.json')[0]));print(r['cer'])") >>$OUT/res.txt;}
B=--config.per_device_batch_size=8;U=--config.model.bidirectional=False;V="--config.dataset.train_splits=dev-clean --config.optimizer.learning_rate=5e-4"
t src demo test-clean 160 30 &
for S in 0 1;do for K in 160 120;do t u$K$S demo r $K 30 $U $B --config.seed=$S & done;done
until grep -q ^src $OUT/res.txt;do sleep 2;done
for S in 0 1;do for K in 30 60;do
t f${K}s$S demo test-clean $K 0 --config.seed=$S $V $B --config.init_from=$W/src &
t c${K}s$S demo test-clean $K 0 --config.seed=$S $V $B &
done;done;wait
