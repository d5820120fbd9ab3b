"""benchmarks/: the scaling command end to end on fake CPU devices, the PyTorch twins'
parameter counts against the JAX model, loop == cuDNN forward, trace parsing."""

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from benchmarks import kernel_ablation, profile, torch_model
from ds2_jax import model
from ds2_jax.features import FeatureConfig
from tests.helpers import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--config=configs/smoke.py", "--config.dataset.synthetic_min_duration_s=0.3",
        "--config.dataset.synthetic_max_duration_s=0.5"]


def scaling(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "benchmarks.scaling", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=ROOT))


def test_scaling_command_writes_every_report(tmp_path):
    out = tmp_path / "b"
    # jax_eager is left out: its first step alone takes ~35 s on the CPU (op-by-op
    # compiles); tests/test_train.py checks that the eager step equals the compiled one.
    proc = scaling(*TINY, "--devices=1,2", "--variants=jax,jax_jit,torch_loop,torch_cudnn", "--steps=2",
                   "--warmup=1", "--profile_steps=1", "--num_batches=2", f"--out={out}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("results.json", "results.csv", "results.md", "speedup.png", "ms_per_step.png"):
        assert (out / name).stat().st_size > 0, name
    for name in ("speedup.png", "ms_per_step.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    rows = {(r["variant"], r["devices"]): r for r in json.loads((out / "results.json").read_text())["results"]}
    for key in [("jax", 1), ("jax", 2), ("jax_jit", 1), ("jax_jit", 2), ("torch_loop", 1), ("torch_cudnn", 1)]:
        r = rows[key]
        assert r["status"] == "ok", r
        assert r["steps_timed"] == 2
        assert 0 < r["step_ms_p10"] <= r["step_ms_median"] <= r["step_ms_p90"]
        assert r["first_step_s"] > 0 and r["utterances_per_s"] > 0 and r["pipelined_ms_per_step"] > 0
        assert r["global_batch"] == 2 * key[1]
        assert r["minibatches_per_epoch"] == math.ceil(15_552 / r["global_batch"])
        assert r["epoch_time_s"] == pytest.approx(r["minibatches_per_epoch"] * r["step_ms_median"] / 1e3)
        assert "error" not in r["profile"], r["profile"]
        assert r["profile"]["kernels_per_step"] == "n/a (cpu)"
    for variant in ("jax", "jax_jit"):
        assert rows[(variant, 1)]["speedup"] == 1.0
        two = rows[(variant, 2)]
        assert two["speedup"] > 0 and two["efficiency"] == pytest.approx(two["speedup"] / 2)
    assert rows[("torch_loop", 2)]["status"] == "skipped"  # several torch processes need GPUs
    assert (rows[("jax", 1)]["params"] == rows[("jax_jit", 1)]["params"] == rows[("torch_loop", 1)]["params"]
            == rows[("torch_cudnn", 1)]["params"])
    md = (out / "results.md").read_text()
    assert "| jax | float32 | 2 |" in md and "| jax_jit | float32 | 2 |" in md
    assert "Paddle DS2 on 1080 Ti" in md and "## Profile" in md
    with open(out / "results.csv") as f:
        assert {"jax", "jax_jit"} <= {line.split(",")[0] for line in f}


def test_more_devices_than_present_is_a_clear_error(tmp_path):
    proc = scaling(*TINY, "--devices=1,16", "--variants=jax", f"--out={tmp_path}")
    assert proc.returncode != 0
    assert "asks for 16 devices but only 8" in proc.stderr
    assert not (tmp_path / "results.json").exists()


def jax_param_count(cfg: model.ModelConfig) -> int:
    shapes = jax.eval_shape(
        lambda: model.DeepSpeech2(cfg).init(jax.random.PRNGKey(0), jnp.zeros((1, 64, cfg.num_bins)), jnp.array([64]), train=False)
    )
    return model.count_params(shapes["params"])


@pytest.mark.parametrize("overrides", [
    {},  # the seed: 45,012,221 parameters
    {"rnn_cell": "gru"},
    {"rnn_cell": "lstm", "share_rnn_weights": False},
    {"rnn_cell": "gru", "bidirectional": False, "num_conv_layers": 3},  # with the row convolution
])
@pytest.mark.parametrize("rnn_impl", torch_model.RNN_IMPLS)
def test_torch_twins_have_the_jax_parameter_count(overrides, rnn_impl):
    cfg = model.ModelConfig(**overrides)
    with torch.device("meta"):  # shapes only, no memory
        net = torch_model.TorchDS2(cfg, FeatureConfig(), np.zeros(161), np.ones(161), rnn_impl=rnn_impl)
    assert torch_model.count_params(net) == jax_param_count(cfg)
    if not overrides:
        assert jax_param_count(cfg) == 45_012_221


def _batch(n=3, seed=0):
    from ds2_jax import input_pipeline

    config = tiny_config(**{"dataset.synthetic_min_duration_s": 0.4, "dataset.synthetic_max_duration_s": 0.9})
    source = input_pipeline.SyntheticSource(config, input_pipeline.Sharding(n))
    b = source.train_batch(seed)
    mean, std = source.feature_stats()
    assert len(set(b["audio_lengths"])) > 1  # unequal lengths: padding and reversal matter
    return torch.from_numpy(b["audio"]), torch.from_numpy(b["audio_lengths"]).long(), mean, std


@pytest.mark.parametrize("cell,shared", [("simple", True), ("simple", False), ("gru", True), ("lstm", False)])
def test_loop_and_cudnn_forwards_agree(cell, shared):
    audio, lengths, mean, std = _batch()
    cfg = model.ModelConfig(conv_channels=4, num_rnn_layers=2, rnn_size=24, rnn_cell=cell, share_rnn_weights=shared)
    torch.manual_seed(0)
    loop = torch_model.TorchDS2(cfg, FeatureConfig(), mean, std, rnn_impl="loop")
    cudnn = torch_model.TorchDS2(cfg, FeatureConfig(), mean, std, rnn_impl="cudnn")
    cudnn.load_state_dict(loop.state_dict())
    logits_loop, out_loop = loop(audio, lengths)
    logits_cudnn, out_cudnn = cudnn(audio, lengths)
    np.testing.assert_array_equal(out_loop.numpy(), out_cudnn.numpy())
    valid = (torch.arange(logits_loop.shape[1])[None, :] < out_loop[:, None]).numpy()
    # float32 sums in different orders (per-step matmuls vs nn.RNN): ~1e-5 apart at worst
    np.testing.assert_allclose(logits_cudnn.detach().numpy()[valid], logits_loop.detach().numpy()[valid], rtol=1e-4, atol=1e-4)
    # Both directions see only valid frames: trimming the padding changes no valid output
    # (beyond float32 summation order: other shapes, other CPU kernels; leaked padding
    # would move outputs by ~1e-1).
    short = int(lengths.max())
    trimmed, _ = loop(audio[:, :short], lengths)
    np.testing.assert_allclose(trimmed.detach().numpy()[valid[:, : trimmed.shape[1]]],
                               logits_loop.detach().numpy()[:, : trimmed.shape[1]][valid[:, : trimmed.shape[1]]], rtol=1e-4, atol=1e-4)
    loss = torch_model.ctc_loss(logits_loop, out_loop, torch.randint(1, 29, (3, 4)), torch.tensor([4, 3, 2]))
    loss.backward()
    assert torch.isfinite(loss) and loop.rnns[0].recurrent.grad.abs().sum() > 0


def test_profile_summary_reads_gpu_kernels_from_a_jax_style_trace(tmp_path):
    meta = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #7(Compute)"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 8, "args": {"name": "XLA Ops"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
    ]
    spans = [
        {"ph": "X", "pid": 1, "tid": 7, "ts": 0, "dur": 4, "name": "gemm"},
        {"ph": "X", "pid": 1, "tid": 7, "ts": 2, "dur": 4, "name": "gemm"},  # overlaps: busy counts it once
        {"ph": "X", "pid": 1, "tid": 7, "ts": 10, "dur": 2, "name": "fusion"},
        {"ph": "X", "pid": 1, "tid": 8, "ts": 0, "dur": 12, "name": "derived op"},  # not a kernel
        {"ph": "X", "pid": 2, "tid": 1, "ts": 0, "dur": 1, "name": "host"},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": meta + spans}))
    s = profile.summarize(str(path), "jax", steps=1, step_ms=0.016, on_gpu=True)
    assert s["kernels_per_step"] == 3
    assert s["gpu_busy_ms_per_step"] == pytest.approx(0.008)
    assert s["gpu_busy_fraction"] == pytest.approx(0.5)
    assert s["top_kernels"][0]["name"] == "gemm" and s["top_kernels"][0]["calls_per_step"] == 2
    assert "error" in profile.summarize(str(tmp_path / "missing.json"), "jax", 1, 1.0, True)


@pytest.mark.parametrize("overrides", [
    {"rnn_cell": "simple"},
    {"rnn_cell": "gru", "share_rnn_weights": False},
    {"rnn_cell": "lstm", "bidirectional": False, "row_conv_context": 3, "num_conv_layers": 1},
])
def test_torch_loop_model_computes_what_the_jax_model_computes(overrides):
    from ds2_jax import features

    audio, lengths, mean, std = _batch()
    cfg = model.ModelConfig(conv_channels=4, num_rnn_layers=2, rnn_size=24, **overrides)
    net = model.DeepSpeech2(cfg)
    feats, frames = features.featurize(jnp.asarray(audio.numpy()), jnp.asarray(lengths.numpy()), mean, std)
    variables = net.init(jax.random.PRNGKey(0), feats, frames, train=False)
    (logits_jax, out_jax), _ = net.apply(variables, feats, frames, train=True, mutable=["batch_stats"])
    twin = torch_model.TorchDS2(cfg, FeatureConfig(), mean, std, rnn_impl="loop")
    torch_model.load_jax_params(twin, variables["params"])
    logits_torch, out_torch = twin(audio, lengths)
    np.testing.assert_array_equal(out_torch.numpy(), np.asarray(out_jax))
    valid = np.arange(logits_torch.shape[1])[None, :] < np.asarray(out_jax)[:, None]
    np.testing.assert_allclose(logits_torch.detach().numpy()[valid], np.asarray(logits_jax)[valid], rtol=2e-3, atol=2e-4)


def test_recurrence_kernel_benchmark_runs_and_agrees(tmp_path):
    """The layer microbenchmark on a tiny shape (kernel in interpret mode off the GPU)."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.recurrence_kernel", f"--out={tmp_path}", "--steps=1",
         "--shape=5,2,16,16", "--kernels=16/4,16/8"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(tmp_path / "recurrence_kernel.json") as f:
        rows = json.load(f)["rows"]
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"]
    scan, *kernels = rows
    for kernel in kernels:  # two launch settings: the same bf16 rounding as scan_vjp
        for key in ("rel_err_ys", "rel_err_dxs", "rel_err_dw"):
            assert kernel[key] <= 1.25 * scan[key] + 1e-3, (key, kernel, scan)
    assert (tmp_path / "recurrence_kernel.md").read_text().count("|") > 10


def test_kernel_ablation_runs_every_case(tmp_path):
    """Each ablated kernel traces and runs (tiny shape, interpret mode off the GPU)."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.kernel_ablation", f"--out={tmp_path}", "--steps=1", "--shape=4,16,16"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(tmp_path / "kernel_ablation.json") as f:
        rows = json.load(f)["rows"]
    assert [r["case"] for r in rows] == list(kernel_ablation.CASES)
    for r in rows:  # --shape=4,16,16: 4 time steps
        assert r["fwd_ms"] > 0 and r["us_per_step"] == pytest.approx(r["fwd_ms"] * 1e3 / 4, rel=1e-3, abs=0.13), r
    md = (tmp_path / "kernel_ablation.md").read_text()
    assert md.count("\n") == len(rows) + 2
    assert all(f"| {r['case']} | {r['fwd_ms']:.2f} | {r['us_per_step']:.2f} |" in md for r in rows)


def test_conv_lowering_benchmark_agrees(tmp_path):
    """Both conv lowerings at a tiny shape: the same output as the float32 direct conv."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.conv_lowering", f"--out={tmp_path}", "--steps=1", "--shape=2,40,161",
         "--channels=4"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(tmp_path / "conv_lowering.json") as f:
        rows = json.load(f)["rows"]
    assert [(r["conv"], r["lowering"]) for r in rows] == [(c, name) for c in (1, 2) for name in ("direct", "space_to_depth")]
    for direct, folded in zip(rows[::2], rows[1::2]):  # bfloat16 rounding, the same for both
        assert folded["rel_err_y"] <= 1.25 * direct["rel_err_y"] + 1e-3, (direct, folded)
    assert (tmp_path / "conv_lowering.md").read_text().count("\n") == len(rows) + 2
