"""Tiny model on synthetic data: trains on the CPU in well under a minute.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \
        python launch.py --config=configs/smoke.py --workdir=/tmp/ds2_smoke
"""

from ds2_jax import settings


def get_config():
    config = settings.to_config_dict()  # every default (configs/default.py)
    config.num_train_steps = 20
    config.per_device_batch_size = 2
    config.log_every_steps = 5
    config.eval_every_steps = 10
    config.checkpoint_every_steps = 10
    config.dataset.synthetic_min_duration_s = 0.5
    config.dataset.synthetic_max_duration_s = 1.0
    config.eval.max_utterances = 16
    config.model.conv_channels = 4
    config.model.num_rnn_layers = 1
    config.model.rnn_size = 32
    return config
