. benchmarks/gpu_host.sh||exit 1
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.05 PYTHONUNBUFFERED=1
L=/tmp/log;mkdir -p $L;W=/tmp/w;trap 'tar czf $OUT/logs.tgz -C /tmp log' EXIT
python3 -m ds2_jax.datasets.build --config=configs/demo.py --config.dataset.data_dir=/tmp/d >$L/b1 2>&1
cat >/tmp/r.py <<'P'
import glob,json,sys,numpy as np,soxr
from ds2_jax import audio,metrics,settings
from ds2_jax.infer import jax_backend
fs=sorted(glob.glob("corpora/tiny_librispeech/LibriSpeech/test-clean/*/*/*.flac"))
w=sys.argv[1];e=jax_backend.JaxEngine(w,settings.Decoding(beam_width=0));c=[];emp=0;pg=None
for p in fs:
 s=audio.read(p,16000);x=np.concatenate([np.zeros(16000,np.int16),s,np.zeros(24000,np.int16)])
 r=soxr.resample(soxr.resample(x.astype(np.float32)/32768,16000,48000),48000,16000)
 r=np.clip(np.round(r*32768),-32768,32767).astype(np.int16)
 t=e.transcribe([x,r[148:],r[628:],x[320:]]);emp+=not t[0].strip()
 k=[metrics.error_rates([t[0]],[u])["cer"] if t[0].strip() else 9 for u in t[1:]];c+=k
 if "118-1180-0001" in p:pg=(t[0],k)
c=np.array(c);print(json.dumps({"w":w,"empty":emp,"mean":round(c.mean(),3),"p90":round(float(np.quantile(c,.9)),3),"over04":round(float((c>.4).mean()),3),"page":pg}))
P
t(){ n=$1 k=$2;shift 2
python3 launch.py --config=configs/demo.py --workdir=$W/$n --config.num_train_steps=$k --config.optimizer.decay_steps=$k --config.eval_every_steps=0 --config.checkpoint_every_steps=$k --config.num_devices=1 --config.dataset.data_dir=/tmp/d --config.model.bidirectional=False "$@" >$L/$n.t 2>&1
JAX_PLATFORMS=cpu python3 /tmp/r.py $W/$n >>$OUT/res.txt 2>$L/$n.r;}
for S in 0 1;do for K in 160 100 80 60;do t u${K}s$S $K --config.seed=$S & done
t u80lr3s$S 80 --config.seed=$S --config.optimizer.learning_rate=3e-3 &
t u60r128s$S 60 --config.seed=$S --config.model.rnn_size=128 --config.optimizer.learning_rate=3e-3 &
done;wait;cat $OUT/res.txt
