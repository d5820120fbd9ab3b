"""Config checks that run before anything is compiled; each error names the setting."""

from __future__ import annotations

import jax

from ds2_jax import geometry, model
from ds2_jax.rnn import dispatch

DATASETS = ("synthetic", "librispeech_local", "librispeech")
SCHEDULES = ("constant", "cosine", "exponential")


def _positive(config, *keys: str) -> None:
    for key in keys:
        if config[key] < 1:
            raise ValueError(f"{key} must be >= 1, got {config[key]}")


def validate(config) -> None:
    """Raises ValueError naming the first inconsistent setting."""
    _positive(config, "num_train_steps", "per_device_batch_size", "log_every_steps", "checkpoint_every_steps", "keep_checkpoints")
    if config.eval_every_steps < 0:
        raise ValueError("eval_every_steps must be >= 0 (0 = never)")
    available = len(jax.local_devices())
    if config.num_devices < 0 or config.num_devices > available:
        raise ValueError(
            f"num_devices={config.num_devices} but this process sees {available} device(s); "
            "lower num_devices (0 = all)"
        )
    d = config.dataset
    if d.name not in DATASETS:
        raise ValueError(f"dataset.name={d.name!r}: expected one of {DATASETS}")
    if not 0 <= d.min_duration_s < d.max_duration_s:
        raise ValueError(
            f"dataset.min_duration_s={d.min_duration_s} must be >= 0 and < dataset.max_duration_s={d.max_duration_s}"
        )
    if not 1 <= d.num_buckets <= 8:
        raise ValueError(f"dataset.num_buckets must be 1..8 (each bucket is a compiled shape), got {d.num_buckets}")
    if d.name == "librispeech_local" and not (d.manual_dir or d.data_dir):
        raise ValueError("dataset.name='librispeech_local' needs dataset.manual_dir (the LibriSpeech tree or archives)")
    geometry.conv_specs(config.model.num_conv_layers)
    model.ModelConfig.from_config(config.model)
    dispatch.ctc_impl(config.loss.ctc_impl)
    if config.optimizer.schedule not in SCHEDULES:
        raise ValueError(f"optimizer.schedule={config.optimizer.schedule!r}: expected one of {SCHEDULES}")
    if config.optimizer.learning_rate <= 0:
        raise ValueError("optimizer.learning_rate must be > 0")
    if config.optimizer.max_consecutive_skips < 1:
        raise ValueError("optimizer.max_consecutive_skips must be >= 1")
    f = config.features
    if f.sample_rate != 16_000:
        raise ValueError("features.sample_rate must be 16000 (the datasets are stored at 16 kHz)")
