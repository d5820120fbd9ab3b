"""The bundled Spanish corpus (corpora/tiny_es/common_voice: Common Voice's layout, espeak-ng
voices, held-out test speakers) with the demo's model, trained on the CPU in a few minutes:

    python launch.py --config=configs/tiny_es.py --workdir=runs/es
    python launch.py --config=configs/tiny_es.py --workdir=runs/es --mode=eval --config.eval.split=test

The same utterances as NeMo manifests (8 kHz WAV): --config.dataset.manual_dir=corpora/tiny_es/nemo
--config.dataset.data_dir=.tiny_es/tfds-nemo.
"""

from ds2_jax import settings


def get_config():
    config = settings.to_config_dict()  # every default (configs/default.py)
    config.num_train_steps = 400
    config.eval_every_steps = 200
    config.checkpoint_every_steps = 200
    config.dataset.name = "manifest"
    config.dataset.manual_dir = "corpora/tiny_es/common_voice"
    config.dataset.data_dir = ".tiny_es/tfds"
    config.dataset.train_splits = "train"  # the alphabet is derived from it at build
    config.dataset.eval_split = "dev"
    config.dataset.num_buckets = 2
    config.dataset.feature_stats_utterances = 80
    config.model.conv_channels = 16
    config.model.num_rnn_layers = 2
    config.model.rnn_size = 192
    config.model.rnn_cell = "gru"
    config.optimizer.learning_rate = 2e-3
    config.optimizer.warmup_steps = 30
    config.optimizer.schedule = "cosine"
    config.optimizer.decay_steps = 400
    config.eval.num_examples_to_print = 4
    return config
