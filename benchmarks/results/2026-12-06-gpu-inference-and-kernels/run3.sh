#!/bin/bash
# Call 3 (one GPU; timings): inference measured, `ds2-transcribe` over many files (benchmarks.export_rtf):
#   1. the bundled corpus built (tfds, no TensorFlow), the demo model trained on the GPU (configs/demo.py
#      through launch.py, STEPS steps), its trigram LM (tools.build_lm) and its ONNX export (ds2_jax.export);
#   2. RTFx (audio seconds per second, median of REPEATS passes after a warm-up) of the JAX engine on the
#      GPU and of the export under onnxruntime on the host's CPUs (every core), each greedy and beam BEAM
#      + the LM, over the held-out test-clean files (39, 50.75 s) named COPIES times, in batches of 8
#      files (transcribe's default), then of 32, then 8 again with onnxruntime on one thread, as time allows;
#   3. `python -m ds2_jax.transcribe` itself over the same files, --workdir and --model, timed from process
#      start to exit (load and compile included; the compiled programs may come from the cache).
# Defaults: STEPS=400 COPIES=6 (304.5 s of audio) REPEATS=5 BEAM=32 BUDGET_S=550. Everything comes back in
# $OUT/run3.tgz (the machine returns a few files only).
# From the repository root, OUT set, .whl carried:  bash benchmarks/results/2026-12-06-gpu-inference-and-kernels/run3.sh
# (.whl: fetch-wheels.sh soxr==1.1.0 tensorboardX==2.6.4 jax2onnx==0.17.1 onnx-ir==1.1.0 dm-pix==0.4.4
#  onnxruntime==1.32.0 flashlight-text==0.0.7; onnx is the host's, no room for its 9 MB wheel under 64 MiB.)
set -u
START=$SECONDS
left() { echo $(( ${BUDGET_S:-550} - (SECONDS - START) )); }
cap() { local l=$(left); echo $(( l < $1 ? l : $1 )); }
STEPS=${STEPS:-400} COPIES=${COPIES:-6} REPEATS=${REPEATS:-5} BEAM=${BEAM:-32}
R=/tmp/r3; D=/tmp/r3-data; rm -rf $R $D; mkdir -p $R $D
trap 'cp $OUT/gpu.txt $R/ 2>/dev/null; tar -czf $OUT/run3.tgz -C /tmp r3' EXIT
. benchmarks/gpu_host.sh || exit 1
step() {  # name, seconds at most, command...: its output in $R/name.log; returns its exit status
  local name=$1 limit=$2; shift 2
  [ $(left) -lt 20 ] && { echo "$name: out of time"; return 124; }
  timeout $(cap $limit) "$@" > $R/$name.log 2>&1; local rc=$?
  echo "$name: rc $rc ($((SECONDS - START)) s)"; [ $rc = 0 ] || tail -5 $R/$name.log
  return $rc
}
python3 - > $R/versions.txt 2>&1 <<'EOF'
import importlib, importlib.metadata as md, os
for m, dist in [("jax", "jax"), ("flax", "flax"), ("orbax.checkpoint", "orbax-checkpoint"), ("google.protobuf", "protobuf"),
                ("onnx", "onnx"), ("onnx_ir", "onnx-ir"), ("jax2onnx", "jax2onnx"), ("onnxruntime", "onnxruntime"),
                ("flashlight.lib.text", "flashlight-text"), ("tensorflow_datasets", "tensorflow-datasets")]:
    try:
        mod = importlib.import_module(m)
        print(m, md.version(dist), os.path.dirname(mod.__file__))
    except Exception as e:
        print(m, "MISSING:", type(e).__name__, e)
import jax
print("devices:", jax.devices(), "cpus:", os.cpu_count())
EOF
cat $R/versions.txt
CORPUS=corpora/tiny_librispeech
step build 120 python3 -m ds2_jax.datasets.build --config.dataset.manual_dir=$CORPUS --config.dataset.data_dir=$D/tfds || exit 1
step train 200 python3 launch.py --config=configs/demo.py --workdir=$D/w --config.dataset.data_dir=$D/tfds \
  --config.num_train_steps=$STEPS --config.optimizer.decay_steps=$STEPS --config.eval_every_steps=$STEPS \
  --config.checkpoint_every_steps=$STEPS || exit 1
cp $D/w/metrics.jsonl $D/w/config.json $R/ 2>/dev/null
grep -i "cer\|wer" $R/train.log | tail -2 | cut -c1-200
LM=""
step lm 60 python3 -m ds2_jax.tools.build_lm --manual_dir=$CORPUS --splits=train-clean-100 --order=3 --out=$D/lm.arpa \
  && python3 -c "import flashlight.lib.text" 2>/dev/null && LM="--lm=$D/lm.arpa --beam_width=$BEAM"
[ -n "$LM" ] || echo "no beam + LM rows: the LM or flashlight-text is missing (see $R/versions.txt)"
MODEL=""
# The export runs the reference recurrence (portable); if it fails on the GPU backend, it is tried on the CPU.
if step export 90 python3 -m ds2_jax.export --workdir=$D/w --out=$D/demo.onnx \
   || JAX_PLATFORMS=cpu step export-cpu 90 python3 -m ds2_jax.export --workdir=$D/w --out=$D/demo.onnx; then
  MODEL="--model=$D/demo.onnx"; ls -l $D/demo.onnx
else echo "no ONNX rows: the export failed (see $R/export*.log, $R/versions.txt)"; fi
FILES=$(for i in $(seq $COPIES); do ls $CORPUS/LibriSpeech/test-clean/*/*/*.flac; done)
bench() {  # name, seconds at most, flags...
  local name=$1 limit=$2; shift 2
  step $name $limit python3 -m benchmarks.export_rtf --workdir=$D/w $MODEL $LM --repeats=$REPEATS --out=$R/$name "$@" $FILES
  cat $R/$name/results.md 2>/dev/null
}
bench b8 240 --batch_size=8 --threads=0
[ $(left) -gt 120 ] && bench b32 150 --batch_size=32 --threads=0
[ $(left) -gt 120 ] && [ -n "$MODEL" ] && bench b8-t1 150 --batch_size=8 --threads=1
cli() {  # name, flags...: the command a user runs, from process start (the compiled programs may come from the cache)
  [ $(left) -lt 60 ] && { echo "$1: out of time"; return; }
  local name=$1 t0=$(date +%s.%N); shift
  timeout $(cap 90) python3 -m ds2_jax.transcribe "$@" $FILES > $R/$name.txt 2> $R/$name.log; local rc=$?
  python3 -c "import json, sys; a = json.load(open(sys.argv[1]))['audio_seconds']; t = float(sys.argv[3]) - float(sys.argv[2])
print(f'| {sys.argv[4]} | {sys.argv[5]} | {t:.1f} | {a / t:.1f} | {sys.argv[6]} |')" $R/b8/results.json $t0 $(date +%s.%N) $name "$*" $rc | tee -a $R/cli.md
}
printf "| run | flags | wall s (process start to exit) | RTFx | rc |\n|---|---|---:|---:|---|\n" > $R/cli.md
cli cli-jax --workdir=$D/w
[ -n "$MODEL" ] && cli cli-onnx $MODEL
echo "done at $((SECONDS - START)) s"
