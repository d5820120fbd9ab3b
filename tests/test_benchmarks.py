"""benchmarks/: the scaling command end to end on fake CPU devices, the PyTorch twins'
parameter counts against the JAX model, loop == cuDNN forward, trace parsing."""

import contextlib
import functools
import json
import math
import os
import pstats
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from benchmarks import profile, report, torch_bench, torch_model
from ds2_jax import model, settings
from tests.helpers import quick_compile_env, tiny_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
    "--config=configs/smoke.py",
    "--config.dataset.synthetic_min_duration_s=0.3",
    "--config.dataset.synthetic_max_duration_s=0.5",
    "--config.model.num_conv_layers=1",  # a shorter compile (each variant builds the same model)
]


def scaling(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.scaling", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=quick_compile_env(),
    )


@pytest.fixture(scope="module")
def scaling_run(tmp_path_factory):
    """One scaling command for the tests of its reports and of the CUDA-graphs variant's row."""
    out = tmp_path_factory.mktemp("scaling") / "b"
    # jax_eager is left out: it compiles op by op, too slow for this test;
    # tests/test_train.py checks that the eager step equals the compiled one.
    proc = scaling(
        *TINY,
        "--devices=1,2",
        "--variants=jax,jax_jit,torch_loop,torch_cudnn,torch_cudnn_graphs",
        "--steps=2",
        "--warmup=1",
        "--profile_steps=1",
        "--variant_steps=torch_loop:2:1:1",  # the defaults, named: the report names them
        "--num_batches=2",
        f"--out={out}",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.xdist_group("scaling")  # the command runs once, on one worker
@pytest.mark.slow  # 15 s or more on 2 cores (2026-12-06 durations): make test runs it, test-fast does not
def test_scaling_command_writes_every_report(scaling_run):
    out = scaling_run
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
        assert r["first_step_s"] > 0 and r["pipelined_ms_per_step"] > 0
        assert r["utterances_per_s"] == pytest.approx(r["global_batch"] / (r["step_ms_median"] / 1e3), rel=0.01)
        assert r["global_batch"] == 2 * key[1]
        assert r["minibatches_per_epoch"] == math.ceil(15_552 / r["global_batch"])
        assert r["epoch_time_s"] == pytest.approx(r["minibatches_per_epoch"] * r["step_ms_median"] / 1e3)
        assert "error" not in r["profile"], r["profile"]
        assert r["profile"]["kernels_per_step"] == "n/a (cpu)"
        # Counted model FLOPs: one model, so one count per device whatever the variant or device count.
        assert r["model_gflop_per_step_per_device"] == rows[("jax", 1)]["model_gflop_per_step_per_device"] > 0
        per_s = r["model_gflop_per_step_per_device"] / r["step_ms_median"]  # GFLOP/ms = TFLOP/s
        assert r["model_tflops_per_s_per_device"] == pytest.approx(per_s)
        assert r["mfu"] is None  # no known peak for a CPU
    for variant in ("jax", "jax_jit"):
        assert rows[(variant, 1)]["speedup"] == 1.0
        two = rows[(variant, 2)]
        one = rows[(variant, 1)]
        assert two["speedup"] == pytest.approx(two["utterances_per_s"] / one["utterances_per_s"], rel=0.02)
        assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    assert rows[("torch_loop", 2)]["status"] == "skipped"  # several torch processes need GPUs
    assert (
        rows[("jax", 1)]["params"]
        == rows[("jax_jit", 1)]["params"]
        == rows[("torch_loop", 1)]["params"]
        == rows[("torch_cudnn", 1)]["params"]
    )
    md = (out / "results.md").read_text()
    assert "| jax | float32 | 2 |" in md and "| jax_jit | float32 | 2 |" in md
    assert "(per-variant overrides: {'torch_loop': (2, 1, 1)})" in md
    assert not re.search(r"\{[^{}:]*\}", md), re.search(r"\{[^{}:]*\}", md)  # every placeholder filled
    assert "Paddle DS2 on 1080 Ti" in md and "## Profile" in md
    ratio = {
        q["devices"]: q
        for q in json.loads((out / "results.json").read_text())["pytorch_vs_ours"]
        if q["dtype"] == "float32"
    }
    fastest_torch = min(("torch_loop", "torch_cudnn"), key=lambda v: rows[(v, 1)]["step_ms_median"])
    assert ratio[1]["pytorch"] == fastest_torch and ratio[1]["pytorch_measured"] == ["torch_cudnn", "torch_loop"]
    assert 2 not in ratio  # no PyTorch row measured on 2 devices here
    assert "## Strongest PyTorch / ours" in md
    with open(out / "results.csv") as f:
        assert {"jax", "jax_jit"} <= {line.split(",")[0] for line in f}


def test_more_devices_than_present_is_a_clear_error(tmp_path):
    proc = scaling(*TINY, "--devices=1,16", "--variants=jax", f"--out={tmp_path}")
    assert proc.returncode != 0
    assert "asks for 16 devices but only 8" in proc.stderr
    assert not (tmp_path / "results.json").exists()


def jax_param_count(cfg: model.ModelConfig) -> int:
    shapes = jax.eval_shape(
        lambda: model.DeepSpeech2(cfg).init(
            jax.random.PRNGKey(0), jnp.zeros((1, 64, cfg.num_bins)), jnp.array([64]), train=False
        )
    )
    return model.count_params(shapes["params"])


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # the seed: 45,012,221 parameters
        {"rnn_cell": "gru"},
        {"rnn_cell": "lstm", "share_rnn_weights": False},
        {"rnn_cell": "gru", "bidirectional": False, "num_conv_layers": 3},  # with the row convolution
    ],
)
@pytest.mark.parametrize("rnn_impl", torch_model.RNN_IMPLS)
def test_torch_twins_have_the_jax_parameter_count(overrides, rnn_impl):
    cfg = model.ModelConfig(**overrides)
    with torch.device("meta"):  # shapes only, no memory
        net = torch_model.TorchDS2(cfg, settings.Spectrogram(), np.zeros(161), np.ones(161), rnn_impl=rnn_impl)
    assert torch_model.count_params(net) == jax_param_count(cfg)
    if not overrides:
        assert jax_param_count(cfg) == 45_012_221


def _batch(n=3, seed=0):
    from ds2_jax import features
    from ds2_jax.pipeline.batch import Sharding
    from ds2_jax.pipeline.source import make_source

    config = tiny_settings(**{"dataset.synthetic_min_duration_s": 0.4, "dataset.synthetic_max_duration_s": 0.9})
    source = make_source(config, Sharding(n))
    b = source.train_batch(seed)
    mean, std = source.feature_stats(features.spectrogram_stats)
    assert len(set(b["audio_lengths"])) > 1  # unequal lengths: padding and reversal matter
    return torch.from_numpy(b["audio"]), torch.from_numpy(b["audio_lengths"]).long(), mean, std


@pytest.mark.parametrize("cell,shared", [("simple", True), ("simple", False), ("gru", True), ("lstm", False)])
def test_loop_and_cudnn_forwards_agree(cell, shared):
    audio, lengths, mean, std = _batch()
    cfg = model.ModelConfig(conv_channels=4, num_rnn_layers=2, rnn_size=24, rnn_cell=cell, share_rnn_weights=shared)
    torch.manual_seed(0)
    loop = torch_model.TorchDS2(cfg, settings.Spectrogram(), mean, std, rnn_impl="loop")
    cudnn = torch_model.TorchDS2(cfg, settings.Spectrogram(), mean, std, rnn_impl="cudnn")
    cudnn.load_state_dict(loop.state_dict())
    logits_loop, out_loop = loop(audio, lengths)
    logits_cudnn, out_cudnn = cudnn(audio, lengths)
    np.testing.assert_array_equal(out_loop.numpy(), out_cudnn.numpy())
    valid = (torch.arange(logits_loop.shape[1])[None, :] < out_loop[:, None]).numpy()
    # float32 sums in different orders (per-step matmuls vs nn.RNN): ~1e-5 apart at worst
    np.testing.assert_allclose(
        logits_cudnn.detach().numpy()[valid], logits_loop.detach().numpy()[valid], rtol=1e-4, atol=1e-4
    )
    # Both directions see only valid frames: trimming the padding changes no valid output
    # (beyond float32 summation order: other shapes, other CPU kernels; leaked padding
    # would move outputs by ~1e-1).
    short = int(lengths.max())
    trimmed, _ = loop(audio[:, :short], lengths)
    np.testing.assert_allclose(
        trimmed.detach().numpy()[valid[:, : trimmed.shape[1]]],
        logits_loop.detach().numpy()[:, : trimmed.shape[1]][valid[:, : trimmed.shape[1]]],
        rtol=1e-4,
        atol=1e-4,
    )
    loss = torch_model.ctc_loss(logits_loop, out_loop, torch.randint(1, 29, (3, 4)), torch.tensor([4, 3, 2]))
    loss.backward()
    assert torch.isfinite(loss) and loop.rnns[0].recurrent.grad.abs().sum() > 0


def _loss_and_grads(net, audio, lengths, labels, label_lengths, autocast=contextlib.nullcontext):
    net.zero_grad(set_to_none=True)
    with autocast():
        logits, frames = net(audio, lengths)
    loss = torch_model.ctc_loss(logits, frames, labels, label_lengths)
    loss.backward()
    return loss.item(), {k: p.grad.clone() for k, p in net.named_parameters()}


@pytest.mark.parametrize("cell,shared", [("simple", True), ("simple", False), ("gru", True), ("lstm", False)])
def test_padded_cudnn_layout_trains_like_the_packed_one(cell, shared):
    """cudnn_padded (no host copy of lengths: capturable) == cudnn on packed sequences:
    the same loss and the same gradient of every parameter, though padding frames are
    fed to the backward direction first."""
    audio, lengths, mean, std = _batch()
    cfg = model.ModelConfig(conv_channels=4, num_rnn_layers=2, rnn_size=24, rnn_cell=cell, share_rnn_weights=shared)
    torch.manual_seed(0)
    packed = torch_model.TorchDS2(cfg, settings.Spectrogram(), mean, std, rnn_impl="cudnn")
    padded = torch_model.TorchDS2(cfg, settings.Spectrogram(), mean, std, rnn_impl="cudnn_padded")
    padded.load_state_dict(packed.state_dict())
    labels, label_lengths = torch.randint(1, 29, (3, 4)), torch.tensor([4, 3, 2])
    loss_packed, grads_packed = _loss_and_grads(packed, audio, lengths, labels, label_lengths)
    loss_padded, grads_padded = _loss_and_grads(padded, audio, lengths, labels, label_lengths)
    assert loss_padded == pytest.approx(loss_packed, rel=1e-5)
    for name, g in grads_packed.items():
        # Relative to the gradient's scale: float32 sums in other orders stay below 1e-4;
        # state leaking in from the padding moves them by 1e-1 and more.
        err = (grads_padded[name] - g).abs().max() / g.abs().max()
        assert err < 1e-4, (name, err.item())


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


@pytest.mark.parametrize(
    "overrides",
    [
        {"rnn_cell": "simple"},
        {"rnn_cell": "gru", "share_rnn_weights": False},
        {"rnn_cell": "lstm", "bidirectional": False, "row_conv_context": 3, "num_conv_layers": 1},
    ],
)
@pytest.mark.slow
def test_torch_loop_model_computes_what_the_jax_model_computes(overrides):
    from ds2_jax import features

    audio, lengths, mean, std = _batch()
    cfg = model.ModelConfig(conv_channels=4, num_rnn_layers=2, rnn_size=24, **overrides)
    net = model.DeepSpeech2(cfg)
    feats, frames = jax.jit(features.featurize)(jnp.asarray(audio.numpy()), jnp.asarray(lengths.numpy()), mean, std)
    # The init's shapes (traced, not compiled: its random draws cost seconds to compile), each parameter
    # drawn from U[-0.5, 0.5): logits of the init's scale, and unlike the init's batch-norm scales of 1
    # and biases of 0 a value the twin must load. (train=True normalizes by the batch: its statistics unused.)
    shapes = jax.eval_shape(functools.partial(net.init, train=False), jax.random.PRNGKey(0), feats, frames)
    draw = np.random.default_rng(0)
    variables = {
        "params": jax.tree_util.tree_map(lambda s: draw.uniform(-0.5, 0.5, s.shape).astype(s.dtype), shapes["params"]),
        "batch_stats": jax.tree_util.tree_map(lambda s: np.ones(s.shape, s.dtype), shapes["batch_stats"]),
    }
    apply = jax.jit(functools.partial(net.apply, train=True, mutable=["batch_stats"]))
    (logits_jax, out_jax), _ = apply(variables, feats, frames)
    twin = torch_model.TorchDS2(cfg, settings.Spectrogram(), mean, std, rnn_impl="loop")
    torch_model.load_jax_params(twin, variables["params"])
    logits_torch, out_torch = twin(audio, lengths)
    np.testing.assert_array_equal(out_torch.numpy(), np.asarray(out_jax))
    valid = np.arange(logits_torch.shape[1])[None, :] < np.asarray(out_jax)[:, None]
    np.testing.assert_allclose(
        logits_torch.detach().numpy()[valid], np.asarray(logits_jax)[valid], rtol=2e-3, atol=2e-4
    )


@pytest.mark.slow  # 15 s or more on 2 cores (2026-12-06 durations): make test runs it, test-fast does not
def test_recurrence_kernel_benchmark_runs_and_agrees(tmp_path):
    """The layer microbenchmark on a tiny shape (kernel in interpret mode off the GPU)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.recurrence_kernel",
            f"--out={tmp_path}",
            "--steps=1",
            "--shape=5,2,16,16",
            "--kernels=16/4,16/8",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=quick_compile_env(JAX_PLATFORMS="cpu"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(tmp_path / "recurrence_kernel.json") as f:
        rows = json.load(f)["rows"]
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"]
    scan, *kernels = rows
    for kernel in kernels:  # two launch settings: the same bf16 rounding as scan_vjp
        for key in ("rel_err_ys", "rel_err_dxs", "rel_err_dw"):
            assert kernel[key] <= 1.25 * scan[key] + 1e-3, (key, kernel, scan)
    assert (tmp_path / "recurrence_kernel.md").read_text().count("|") > 10


@pytest.mark.xdist_group("scaling")  # the command runs once, on one worker
@pytest.mark.slow  # 15 s or more on 2 cores (2026-12-06 durations): make test runs it, test-fast does not
def test_cudnn_graphs_variant_is_known_and_explained_without_cuda(scaling_run):
    """torch_cudnn_graphs is a --variants choice; without CUDA its row says why it was skipped."""
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the variant runs (test_graphed_cudnn_step_equals_the_eager_one)")
    out = scaling_run
    rows = {r["variant"]: r for r in json.loads((out / "results.json").read_text())["results"] if r["devices"] == 1}
    assert rows["torch_cudnn"]["status"] == "ok"
    assert rows["torch_cudnn_graphs"]["status"] == "skipped"
    assert "CUDA graphs need a GPU" in rows["torch_cudnn_graphs"]["notes"]
    assert "| torch_cudnn_graphs | float32 | 1 | skipped: CUDA graphs need a GPU" in (out / "results.md").read_text()
    audio, lengths, mean, std = _batch()
    cfg = model.ModelConfig(conv_channels=4, num_rnn_layers=1, rnn_size=8)
    sample = {"audio": audio, "audio_lengths": lengths}
    with pytest.raises(ValueError, match="rnn_impl='cudnn_padded'"):
        torch_bench.graph_model(
            torch_model.TorchDS2(cfg, settings.Spectrogram(), mean, std, rnn_impl="cudnn"),
            sample,
            contextlib.nullcontext,
        )
    with pytest.raises(RuntimeError, match="need a GPU"):
        torch_bench.graph_model(
            torch_model.TorchDS2(cfg, settings.Spectrogram(), mean, std, rnn_impl="cudnn_padded"),
            sample,
            contextlib.nullcontext,
        )


def _row(variant, dtype, devices, ms):
    return {
        "variant": variant,
        "dtype": dtype,
        "devices": devices,
        "status": "ok",
        "step_ms_median": ms,
        "step_ms_p10": ms,
        "step_ms_p90": ms,
        "global_batch": 16 * devices,
        "first_step_s": 1.0,
        "utterances_per_s": 16e3 * devices / ms if ms else 0.0,
        "minibatches_per_epoch": 972 // devices,
        "time_per_minibatch_s": ms / 1e3 if ms else 0.0,
        "epoch_time_s": 972 * ms / 1e3 / devices if ms else 0.0,
    }


def test_pytorch_over_ours_ratio_takes_the_fastest_of_each_side():
    """Per group the fastest PyTorch variant (whichever it is) over the fastest JAX one;
    failed or skipped rows count for neither side."""
    rows = [
        _row("jax", "float32", 1, 20.0),
        _row("jax_jit", "float32", 1, 25.0),
        _row("torch_loop", "float32", 1, 200.0),
        _row("torch_cudnn", "float32", 1, 80.0),
        _row("torch_cudnn_graphs", "float32", 1, 60.0),
        _row("torch_compile", "float32", 1, 190.0),
        _row("jax", "bfloat16", 1, 10.0),
        _row("jax_jit", "bfloat16", 1, 8.0),
        _row("torch_cudnn", "bfloat16", 1, 90.0),
        _row("torch_cudnn_graphs", "bfloat16", 1, 95.0),
        {**_row("torch_compile", "bfloat16", 1, 0.0), "status": "error", "step_ms_median": None},
        _row("jax", "float32", 2, 22.0),
        _row("torch_loop", "float32", 2, 300.0),
        {**_row("torch_cudnn_graphs", "float32", 2, 1.0), "status": "skipped"},
        _row("torch_cudnn", "float32", 4, 70.0),  # no JAX row: no ratio
    ]
    got = {(q["dtype"], q["devices"]): q for q in report.pytorch_vs_ours(rows)}
    assert sorted(got) == [("any", 1), ("any", 2), ("bfloat16", 1), ("float32", 1), ("float32", 2)]
    assert (got["float32", 1]["pytorch"], got["float32", 1]["ours"]) == ("torch_cudnn_graphs", "jax")
    assert got["float32", 1]["ratio"] == pytest.approx(3.0)
    assert (got["bfloat16", 1]["pytorch"], got["bfloat16", 1]["ours"]) == ("torch_cudnn", "jax_jit")
    assert got["bfloat16", 1]["ratio"] == pytest.approx(90 / 8)
    assert got["float32", 2]["pytorch"] == "torch_loop"  # the skipped graphs row is not a measurement
    best = got["any", 1]
    assert (best["pytorch"], best["pytorch_dtype"], best["ours"], best["ours_dtype"]) == (
        "torch_cudnn_graphs",
        "float32",
        "jax_jit",
        "bfloat16",
    )
    assert best["ratio"] == pytest.approx(60 / 8)
    md = report.markdown({}, rows)
    assert "## Strongest PyTorch / ours" in md
    assert "| float32 | 1 | torch_cudnn_graphs | 60.0 | jax | 20.0 | 3.00x |" in md
    assert "| any | 1 | torch_cudnn_graphs float32 | 60.0 | jax_jit bfloat16 | 8.0 | 7.50x |" in md


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graphed_cudnn_step_equals_the_eager_one(dtype):
    """torch_cudnn_graphs' model (cuDNN on the padded batch, forward and backward replayed
    as CUDA graphs) gives the eager cuDNN twin's loss and gradients, on a batch other than
    the one it was captured with (other lengths: nothing of the capture batch is baked in)."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA graphs need a GPU")
    device = torch.device("cuda")
    audio, lengths, mean, std = _batch()
    other_audio, other_lengths, _, _ = _batch(seed=1)
    assert not torch.equal(lengths, other_lengths)
    cfg = model.ModelConfig(conv_channels=8, num_rnn_layers=2, rnn_size=64)
    torch.manual_seed(0)
    eager = torch_model.TorchDS2(cfg, settings.Spectrogram(), mean, std, rnn_impl="cudnn").to(device)
    net = torch_model.TorchDS2(cfg, settings.Spectrogram(), mean, std, rnn_impl="cudnn_padded").to(device)
    net.load_state_dict(eager.state_dict())

    def autocast():
        if dtype == "bfloat16":
            return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)
        return contextlib.nullcontext()

    sample = {"audio": audio.to(device), "audio_lengths": lengths.to(device)}
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # float32 sums in other orders, not TF32 rounding, apart
    try:
        graphed = torch_bench.graph_model(net, sample, autocast)
        labels, label_lengths = torch.randint(1, 29, (3, 4), device=device), torch.tensor([4, 3, 2], device=device)
        assert other_audio.shape == audio.shape  # synthetic batches are padded to one length
        batch = (other_audio.to(device), other_lengths.to(device), labels, label_lengths)
        loss_eager, grads_eager = _loss_and_grads(eager, *batch, autocast=autocast)
        loss_graphed, grads_graphed = _loss_and_grads(graphed, *batch, autocast=autocast)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    # Relative to each gradient's scale; padding leaking into the recurrence moves them by > 0.3.
    tol = 1e-3 if dtype == "float32" else 5e-2
    assert loss_graphed == pytest.approx(loss_eager, rel=tol)
    for name, g in grads_eager.items():
        err = (grads_graphed[name] - g).abs().max() / g.abs().max()
        assert err < tol, (name, err.item())


def test_manifest_build_benchmark_measures_each_process_count(tmp_path):
    out = tmp_path / "b"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.manifest_build",
            "--manual_dir=corpora/tiny_es/common_voice",
            "--split=dev",
            "--copies=2",
            "--processes=1,2",
            f"--out={out}",
            f"--profile={tmp_path / 'p'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    assert [(r["processes"], r["build_workers"]) for r in result["rows"]] == [(1, 0), (2, 2)]
    for row in result["rows"]:
        assert row["utterances"] == row["kept"] == 40  # dev's 20 clips, twice, every one built
        assert row["bare_utt_per_s"] > 0 and row["build_utt_per_s"] > 0 and row["bare_cpu_ms"] > 0
    assert result["rows"][0]["build_workers_cpu_ms"] == 0 < result["rows"][1]["build_workers_cpu_ms"]
    assert "| 2 |" in (out / "results.md").read_text()
    assert "write_shard" in "".join(str(k) for k in pstats.Stats(str(tmp_path / "p")).stats)  # the inline build


@pytest.mark.slow
def test_augmentation_benchmark_reports_every_part(tmp_path):
    """benchmarks.augmentation at a tiny batch: a row per part, each costing more than none."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.augmentation",
            f"--out={tmp_path}",
            "--steps=1",  # one bucket's batch: one compile of the demo step
            "--batch=2",
            f"--data_dir={tmp_path / 'tfds'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=quick_compile_env(JAX_PLATFORMS="cpu"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(tmp_path / "augmentation.json") as f:
        result = json.load(f)
    rows = {r["variant"]: r for r in result["rows"]}
    assert list(rows) == ["off", "noise", "speed", "gain", "rir", "all"]
    # times only (no ordering between them: on a loaded host an augmented batch can time below a plain one)
    assert result["train_step_ms"] > 0 and all(rows[v]["batch_ms"] > 0 for v in rows)
    assert (tmp_path / "augmentation.md").read_text().count("\n") == len(rows) + 4


def test_the_results_index_lists_every_folder():
    """benchmarks/README.md's results table names each folder of benchmarks/results/, and no other."""
    results = os.path.join(ROOT, "benchmarks", "results")
    index = open(os.path.join(ROOT, "benchmarks", "README.md")).read().split("## Results", 1)[1]
    listed = set(re.findall(r"^\| `([\w.-]+)/` \|", index, flags=re.M))
    assert listed == {d for d in os.listdir(results) if os.path.isdir(os.path.join(results, d))}


def test_noisy_speech_reports_each_seed_and_each_trainings_mean():
    from benchmarks import noisy_speech

    rows = [
        {"training": t, "seed": s, "clean_cer": c, "clean_wer": 2 * c, "noisy_cer": n, "noisy_wer": 2 * n}
        for t, s, c, n in (
            ("clean", 0, 0.03, 0.36),
            ("noise50", 0, 0.04, 0.12),
            ("clean", 1, 0.05, 0.38),
            ("noise50", 1, 0.045, 0.14),
        )
    ]
    means = noisy_speech.means(rows)
    assert means["clean"]["clean_cer"] == pytest.approx(0.04) and means["noise50"]["noisy_cer"] == pytest.approx(0.13)
    lines = noisy_speech.table(rows).splitlines()
    assert len(lines) == 2 + 4 + 2 and lines[-2:] == [
        "| clean | mean | 4.0% | 8.0% | 37.0% | 74.0% |",
        "| noise50 | mean | 4.2% | 8.5% | 13.0% | 26.0% |",
    ]


def test_train_recipe_reports_each_seed_and_the_means():
    from benchmarks import train_recipe

    rows = [
        {"seed": s, **{f"{n}_{m}": v + i / 100 for i, n in enumerate(train_recipe.SCORES) for m in ("cer", "wer")}}
        | {"k1_step_s": 0.5 + s, "k4_step_s": 0.7 + s}
        for s, v in ((0, 0.10), (1, 0.20))
    ]
    means = train_recipe.means(rows)
    assert means["trained_cer"] == pytest.approx(0.15) and means["k4_wer"] == pytest.approx(0.18)
    assert means["k4_step_s"] == pytest.approx(1.2)
    lines = train_recipe.table(rows).splitlines()
    assert len(lines) == 2 + 2 + 1
    assert lines[-1] == "| mean | 15.0% | 16.0% | 17.0% | 18.0% | 15.0% | 16.0% | 17.0% | 18.0% | 1.000 | 1.200 |"


def test_finetune_study_reads_back_each_run_and_reports_seeds_means_and_wins_over_scratch(tmp_path):
    from benchmarks import finetune_study as fs

    scores = {  # (variant, seed): (cer, wer)
        ("scratch", 0): (0.30, 0.80),
        ("scratch", 1): (0.40, 0.70),
        ("tuned", 0): (0.20, 0.60),
        ("tuned", 1): (0.50, 0.60),  # better WER, worse CER: no win on this seed
    }
    for (v, s), (c, w) in scores.items():
        (tmp_path / f"score-{v}-seed{s}.json").write_text(json.dumps({"cer": c, "wer": w, "seconds": 1.0 + s}))
    rows = fs.collect(str(tmp_path), [0, 1], ["scratch", "tuned", "tuned_warmup"])
    assert rows[1] == {"seed": 1, "scratch_cer": 0.40, "scratch_wer": 0.70, "scratch_s": 2.0} | {
        "tuned_cer": 0.50,
        "tuned_wer": 0.60,
        "tuned_s": 2.0,
    }
    assert fs.means(rows)["scratch_cer"] == pytest.approx(0.35) and "tuned_warmup_cer" not in fs.means(rows)
    assert fs.beats_scratch(rows, "tuned") == 1
    lines = fs.table(rows, ["scratch", "tuned", "tuned_warmup"]).splitlines()
    assert lines[0].startswith("| variant | CER s0 | CER s1 | CER mean | WER s0 | WER s1 | WER mean |")
    assert lines[3] == "| tuned | 20.0% | 50.0% | 35.0% | 60.0% | 60.0% | 60.0% | +0.0 | -15.0 | 1/2 |"
    assert lines[4] == "| tuned_warmup | - | - | - | - | - | - | - | - | - |"


def test_finetune_study_probes_change_only_the_feature_statistics_or_the_output_layer():
    from benchmarks import finetune_study as fs
    from ds2_jax import finetune
    from ds2_jax import state as state_lib
    from tests.helpers import tiny_settings

    config = tiny_settings(num_devices=1)
    bins = config.features.num_bins

    def state(seed, mean):
        return state_lib.create_state(config, jax.random.PRNGKey(seed), np.full(bins, mean), np.ones(bins))

    source, fresh = state(1, 1.0), state(2, 2.0)
    kept, _ = finetune.merge(source, fresh, "src")
    with fs.merging(fs.target_stats):
        stats, _ = finetune.merge(source, fresh, "src")
    output, _ = finetune.merge(source, fresh, "src", fresh_output=True)  # init_output='fresh'
    assert finetune.merge.__name__ == "merge" and finetune.merge.__module__ == "ds2_jax.finetune"  # restored
    np.testing.assert_array_equal(stats.feature_mean, fresh.feature_mean)
    np.testing.assert_array_equal(kept.feature_mean, source.feature_mean)
    for name, layer in kept.params.items():
        got = output.params[name]
        want = fresh.params[name] if name == finetune.OUTPUT_LAYER else layer
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=name)
    assert not np.array_equal(
        kept.params[finetune.OUTPUT_LAYER]["kernel"], output.params[finetune.OUTPUT_LAYER]["kernel"]
    )
    assert set(fs.body_freeze(config).split(",")) == set(kept.params) - {finetune.OUTPUT_LAYER}
    outputs = {v: fs.init_output(v) for v in fs.VARIANTS if not v.startswith("scratch")}
    assert outputs == {v: "by_symbol" if "by_symbol" in v else "fresh" if "fresh" in v else "auto" for v in outputs}
