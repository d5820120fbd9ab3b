#!/bin/bash
# The same-numbers check of the architecture pass (issue 31): two short CPU trainings whose
# losses, gradient norms, learning rates and eval figures (every metrics.jsonl value but the
# timings, as exact float reprs) must be bit-identical before and after a refactor.
#   bash benchmarks/results/2026-12-05-cpu-architecture/same_numbers.sh OUT   (from the repo root)
# 1. synthetic data, 2 fake CPU devices under pmap, SpecAugment on, cosine schedule with warm-up,
#    an eval with a partial last batch;  2. the bundled corpus through tfds and the loader
#    (make demo's data), 1 device, jit.
set -eu
OUT=$1; mkdir -p "$OUT"; rm -rf "$OUT"/w1 "$OUT"/w2
PY=${PY:-.venv/bin/python}
export XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu
$PY launch.py --config=configs/smoke.py --workdir="$OUT/w1" --config.num_train_steps=6 \
  --config.eval_every_steps=6 --config.checkpoint_every_steps=6 --config.log_every_steps=1 --config.num_devices=2 \
  --config.features.freq_masks=1 --config.features.freq_mask_width=4 --config.features.time_masks=1 \
  --config.optimizer.schedule=cosine --config.optimizer.warmup_steps=2 --config.eval.max_utterances=5 \
  > "$OUT/w1.log" 2>&1
$PY launch.py --config=configs/demo.py --workdir="$OUT/w2" --config.num_train_steps=4 --config.eval_every_steps=4 \
  --config.checkpoint_every_steps=4 --config.log_every_steps=1 --config.num_devices=1 --config.parallelism=jit \
  --config.model.conv_channels=4 --config.model.rnn_size=32 --config.eval.max_utterances=6 \
  > "$OUT/w2.log" 2>&1
for w in w1 w2; do
  $PY - "$OUT/$w/metrics.jsonl" > "$OUT/$w.numbers" <<'PYEOF'
import json, sys
for line in open(sys.argv[1]):
    rec = json.loads(line)
    print(json.dumps({k: repr(v) for k, v in sorted(rec.items()) if "time" not in k and not k.endswith("_s")
                      and "per_s" not in k and "wait" not in k}))
PYEOF
done
wc -l "$OUT"/w1.numbers "$OUT"/w2.numbers
