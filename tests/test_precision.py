"""benchmarks/precision.py: the bundled-corpus config it trains, the figures it reads from
metrics.jsonl, and (slow) the command end to end with a tiny model, both dtypes."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import precision
from configs import demo, ds2_8gpu
from tests.helpers import CORPUS, ROOT


def test_the_seed_model_trains_on_the_bundled_corpus():
    config = precision.on_bundled_corpus(ds2_8gpu.get_config(), steps=600, evals=6, log_every=10, data_dir="D")
    seed, bundled = ds2_8gpu.get_config(), demo.get_config().dataset
    assert config.model == seed.model and config.optimizer == seed.optimizer  # the seed's model, untouched
    assert config.dataset.manual_dir == bundled.manual_dir and config.dataset.data_dir == "D"
    assert (config.dataset.min_duration_s, config.dataset.max_duration_s) == (bundled.min_duration_s, bundled.max_duration_s)
    assert (config.num_train_steps, config.eval_every_steps, config.log_every_steps) == (600, 100, 10)
    assert config.eval.max_utterances == 0
    assert seed.dataset.min_duration_s == 6.0  # the argument is not changed
    assert precision.on_bundled_corpus(ds2_8gpu.get_config(), 8, 2, 10).dataset.data_dir == bundled.data_dir
    with pytest.raises(ValueError, match="multiple of --evals"):
        precision.on_bundled_corpus(ds2_8gpu.get_config(), steps=10, evals=3, log_every=1)


def _rows(final_cer=0.3):
    return [
        {"step": 10, "loss": 90.0, "step_time_s": 5.0}, {"step": 20, "loss": 60.0, "step_time_s": 0.02},
        {"step": 20, "eval_loss": 70.0, "eval_cer": 0.6, "eval_wer": 0.9},
        {"step": 30, "loss": 40.0, "step_time_s": 0.03}, {"step": 40, "loss": 30.0, "step_time_s": 0.01},
        {"step": 40, "eval_loss": 35.0, "eval_cer": final_cer, "eval_wer": 0.5},
        {"step": 50, "loss": 1.0, "eval_cer": 0.0},  # past the run's steps (an older, longer run): ignored
    ]


def test_summary_takes_the_final_evaluation_and_steady_step_time():
    s = precision.summarize(_rows(), "bfloat16", steps=40, wall_s=12.34)
    assert s["loss"] == [(10, 90.0), (20, 60.0), (30, 40.0), (40, 30.0)]
    assert s["eval_cer"] == [(20, 0.6), (40, 0.3)]
    assert (s["final_cer"], s["final_wer"], s["final_eval_loss"], s["final_train_loss"]) == (0.3, 0.5, 35.0, 30.0)
    assert s["median_step_ms"] == 20.0  # the first interval (compile) left out
    with pytest.raises(ValueError, match="no evaluation at the final step 30"):
        precision.summarize(_rows(), "float32", steps=30, wall_s=1.0)
    ref = precision.summarize(_rows(final_cer=0.25), "float32", steps=40, wall_s=1.0)
    md = precision.notes([ref, s], {"seed": 0})
    assert "| float32 | 40 | 30.000 | 35.000 | 25.00% | 50.00% | 20.0 | 1 |" in md
    assert "| bfloat16 | 40 | 30.000 | 35.000 | 30.00% | 50.00% | 20.0 | 12 |" in md
    assert "bfloat16 - float32: CER +5.00 points" in md


@pytest.mark.slow
def test_precision_command_trains_both_dtypes_and_draws_them(tmp_path):
    """Two tiny runs (2 steps each) on the bundled corpus: same seed and batches, so the first
    losses agree to bf16 rounding, yet differ (the dtype was applied)."""
    from ds2_jax.datasets import build

    data_dir = str(tmp_path / "tfds")
    build.build(CORPUS, data_dir)  # prepared first, as a carried copy would be
    out = tmp_path / "p"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.precision", f"--out={out}", "--config=configs/demo.py", "--steps=2",
         "--evals=1", "--log_every=1", f"--data_dir={data_dir}", "--config.num_devices=1",
         "--config.model.conv_channels=4", "--config.model.num_rnn_layers=1", "--config.model.rnn_size=16",
         "--config.per_device_batch_size=4"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads((out / "precision.json").read_text())["runs"]
    assert [r["dtype"] for r in runs] == ["float32", "bfloat16"]
    f32, bf16 = runs
    for r in runs:
        assert [s for s, _ in r["loss"]] == [1, 2] and [s for s, _ in r["eval_cer"]] == [2]
        assert 0 <= r["final_cer"] <= 1.5 and r["final_eval_loss"] > 0
        assert (out / r["dtype"] / "metrics.jsonl").exists()
    first32, first16 = f32["loss"][0][1], bf16["loss"][0][1]
    assert first16 != first32 and abs(first16 - first32) < 0.05 * first32
    assert (out / "precision.png").read_bytes()[:4] == b"\x89PNG"
    notes = (out / "NOTES.md").read_text()
    assert "| float32 | 2 |" in notes and "| bfloat16 | 2 |" in notes and "bfloat16 - float32: CER" in notes
