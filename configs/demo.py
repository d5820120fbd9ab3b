"""The bundled tiny corpus (espeak-ng voices, held-out test speakers), a small model,
trained on the CPU in a few minutes. `make demo` runs it through ds2_jax.demo:

    python launch.py --config=configs/demo.py --workdir=.demo/run
"""

from ds2_jax import settings


def get_config():
    config = settings.to_config_dict()  # every default (configs/default.py)
    config.num_train_steps = 400
    config.eval_every_steps = 200
    config.checkpoint_every_steps = 200
    config.dataset.name = "librispeech_local"
    config.dataset.manual_dir = "corpora/tiny_librispeech"
    config.dataset.data_dir = ".demo/tfds"
    config.dataset.train_splits = "train-clean-100"
    config.dataset.eval_split = "test-clean"
    config.dataset.num_buckets = 2
    config.dataset.feature_stats_utterances = 208
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
