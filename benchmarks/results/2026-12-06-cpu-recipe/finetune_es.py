"""English -> Spanish fine-tuning at 150 steps (issue 51, item 4), one seed: the English demo model
(160 steps) fine-tuned on configs/tiny_es.py as today, the same with the Spanish corpus's feature
statistics in place of the source's, and the same 150 steps from scratch.

    PYTHONPATH=. JAX_PLATFORMS=cpu python benchmarks/results/2026-12-06-cpu-recipe/finetune_es.py
"""

import json
import os

from configs import demo, tiny_es
from ds2_jax import evaluation, finetune, train

OUT = os.environ.get("OUT", ".finetune_es")
STEPS = int(os.environ.get("STEPS", 150))


def english():
    c = demo.get_config()
    c.dataset.data_dir = f"{OUT}/tfds-en"
    c.num_devices = 1
    c.num_train_steps = c.optimizer.decay_steps = 160
    c.eval_every_steps = 0
    c.checkpoint_every_steps = 160
    c.dataset.num_workers = 0
    train.train_and_evaluate(c, f"{OUT}/en")
    return f"{OUT}/en"


def spanish(name, **extra):
    c = tiny_es.get_config()
    c.dataset.data_dir = f"{OUT}/tfds-es"
    c.dataset.build_workers = 0
    c.dataset.num_workers = 0
    c.num_devices = 1
    c.num_train_steps = STEPS
    c.optimizer.warmup_steps = 0
    c.optimizer.decay_steps = STEPS
    c.eval_every_steps = 0
    c.checkpoint_every_steps = STEPS
    for k, v in extra.items():
        node = c
        *ps, leaf = k.split(".")
        for p in ps:
            node = node[p]
        node[leaf] = v
    w = f"{OUT}/{name}"
    train.train_and_evaluate(c, w)
    r = evaluation.evaluate_checkpoint(c, w, split="test")
    print(json.dumps({"run": name, "steps": STEPS, "cer": r["cer"], "wer": r["wer"]}), flush=True)


en = english()
spanish("tuned", init_from=en)
real_merge = finetune.merge


def merge_with_target_stats(source, fresh, *rest):
    state, reinit = real_merge(source, fresh, *rest)
    return state.replace(feature_mean=fresh.feature_mean, feature_std=fresh.feature_std), reinit


finetune.merge = merge_with_target_stats
spanish("tuned_es_stats", init_from=en)
finetune.merge = real_merge
spanish("scratch")
