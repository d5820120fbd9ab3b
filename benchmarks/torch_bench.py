"""The PyTorch variants: one optimizer step = featurize, forward, CTC, backward, clip, Adam.

    torch_loop     TorchDS2(rnn_impl='loop'): Python loop over time steps.
    torch_cudnn    TorchDS2(rnn_impl='cudnn'): cuDNN RNNs (plain ReLU, see torch_model.py).
    torch_compile  the loop model's forward and backward captured as CUDA graphs
                   (--torch_compile_mode=cudagraphs, the default), or torch.compile of it
                   with any other mode (e.g. reduce-overhead).
    torch_cudnn_graphs  the cuDNN twin's forward and backward captured as CUDA graphs
                   (TorchDS2(rnn_impl='cudnn_padded'): the same cuDNN calls on the padded
                   batch, so no lengths go to the host; see graph_model). CUDA only.

With DistributedDataParallel the graphed variants follow PyTorch's partial-network
capture: the model is graphed first and DDP wraps the graphed module, so DDP's gradient
all-reduce (its autograd hooks) runs eagerly after the backward graph; the synchronized
batch norm's all-reduces of statistics are inside the graphs (NCCL >= 2.9.6 captures
collectives, and every rank captures the same ones).

Several GPUs: DistributedDataParallel, one process per GPU, launched by scaling.py as

    python -m torch.distributed.run --standalone --nproc_per_node=N -m benchmarks.torch_bench \
        --spec=SPEC.json --result=RESULT.json

Rank 0 times the steps and writes the result. On the CPU the variants run in one process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time

import torch

from benchmarks import profile, timing
from benchmarks.torch_model import TorchDS2, count_params, ctc_loss
from ds2_jax import settings
from ds2_jax.model import ModelConfig
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import DataSettings
from ds2_jax.pipeline.synthetic import SyntheticSource

VARIANTS = ("torch_loop", "torch_cudnn", "torch_compile", "torch_cudnn_graphs")
RNN_IMPL = {"torch_loop": "loop", "torch_cudnn": "cudnn", "torch_compile": "loop", "torch_cudnn_graphs": "cudnn_padded"}


def device_description() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x cuda:{torch.cuda.get_device_name(0)} (torch {torch.__version__})"
    return f"cpu (torch {torch.__version__})"


def build(config: settings.Settings, variant: str, device: torch.device, mean, std) -> TorchDS2:
    cfg = ModelConfig.of(config.model, num_bins=len(mean))
    torch.manual_seed(config.seed)
    return TorchDS2(cfg, config.features.spectrogram, mean, std, rnn_impl=RNN_IMPL[variant]).to(device)


def run(
    config: settings.Settings,
    variant: str,
    n_devices: int,
    steps: int,
    warmup: int,
    profile_steps: int,
    num_batches: int,
    compile_mode: str = "cudagraphs",
    tf32: bool = False,
    rank: int = 0,
    world: int = 1,
) -> dict:
    if variant not in VARIANTS:
        raise ValueError(f"unknown torch variant {variant!r}")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    global_batch = config.per_device_batch_size * n_devices
    source = SyntheticSource(DataSettings.of(config), Sharding(global_batch, rank, world))
    from ds2_jax import features  # jax, for the statistics only

    mean, std = source.feature_stats(features.spectrogram_stats)
    net = build(config, variant, device, mean, std)
    params = count_params(net)
    bf16 = config.model.dtype == "bfloat16"

    def autocast():
        # cache_enabled=False: required around CUDA graph capture, harmless otherwise.
        return (
            torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False) if bf16 else contextlib.nullcontext()
        )

    batches = []
    for i in range(num_batches):
        b = source.train_batch(i)
        batches.append(
            {
                "audio": torch.from_numpy(b["audio"]).to(device),
                "audio_lengths": torch.from_numpy(b["audio_lengths"]).long().to(device),
                "labels": torch.from_numpy(b["labels"]).long().to(device),
                "label_lengths": torch.from_numpy(b["label_lengths"]).long().to(device),
            }
        )

    t0 = time.perf_counter()
    graphed = variant == "torch_cudnn_graphs" or (variant == "torch_compile" and compile_mode == "cudagraphs")
    if graphed:
        net = graph_model(net, batches[0], autocast)  # before DDP: its hooks stay outside the graphs
    forward = net
    if world > 1:
        forward = torch.nn.parallel.DistributedDataParallel(net, device_ids=[rank] if cuda else None)
    if variant == "torch_compile" and compile_mode != "cudagraphs":
        forward = torch.compile(forward, mode=compile_mode)
    setup_s = time.perf_counter() - t0
    notes = ""
    if graphed:
        notes = GRAPHED_NOTE.format(
            model="cuDNN model (padded batch)" if variant == "torch_cudnn_graphs" else "loop model"
        )
    elif variant == "torch_compile":
        notes = f"torch.compile(loop model, mode={compile_mode})"
    opt_cfg = config.optimizer
    optimizer = torch.optim.Adam(
        net.parameters(), lr=opt_cfg.learning_rate, betas=(opt_cfg.b1, opt_cfg.b2), eps=opt_cfg.eps, fused=cuda
    )

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def dispatch(i):
        b = batches[i % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            logits, lengths = forward(b["audio"], b["audio_lengths"])
        loss = ctc_loss(logits, lengths, b["labels"], b["label_lengths"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), opt_cfg.clip_global_norm)
        optimizer.step()

    def step(i):
        dispatch(i)
        sync()

    timed = timing.measure(step, warmup, steps)
    row = {
        "params": params,
        "first_step_s": timed["first_step_s"] + setup_s,
        **timing.step_stats(timed["step_times_s"], global_batch),
    }
    row["pipelined_ms_per_step"] = timing.pipelined_ms(dispatch, sync, steps)
    if cuda:
        row["peak_memory_gb"] = round(torch.cuda.max_memory_allocated(device) / 1e9, 2)
    if notes:
        row["notes"] = f"{notes}; setup {setup_s:.1f} s (included in first step)"
    if profile_steps > 0:
        if rank == 0:
            row["profile"] = _profile(step, profile_steps, cuda, row["step_ms_median"])
        else:  # the other ranks take part in the same collectives, unprofiled
            for i in range(profile_steps):
                step(i)
    return row


GRAPHED_NOTE = "{model} forward+backward as CUDA graphs (torch.cuda.make_graphed_callables); CTC, clip, Adam eager"


def graph_model(net: TorchDS2, sample: dict, autocast) -> TorchDS2:
    """`net` with its forward and backward captured as two CUDA graphs.

    Everything inside the model (featurization, convs, batch norms, the recurrences)
    replays as one graph launch each way; every later call must have the sample's shapes
    (the benchmark's batches all do). CTC, the gradient clip and fused Adam stay eager
    (a few dozen kernels), because CUDA's ctc_loss copies the lengths to the host, which
    a capture cannot contain. torch.compile (--torch_compile_mode=reduce-overhead etc.)
    is the alternative for the loop model, but its compile time grows with the unrolled
    time loop. The packed cuDNN layout (rnn_impl='cudnn') copies lengths to the host
    too: graph rnn_impl='cudnn_padded' instead.
    """
    if any(rnn.rnn_impl == "cudnn" for rnn in net.rnns):
        raise ValueError(
            "rnn_impl='cudnn' packs sequences with lengths on the host, which a CUDA graph "
            "cannot capture: build the model with rnn_impl='cudnn_padded'"
        )
    if not torch.cuda.is_available():
        raise RuntimeError(
            "CUDA graphs need a GPU: on the CPU use torch_cudnn, torch_loop, or torch_compile "
            "with a torch.compile mode (e.g. --torch_compile_mode=default)"
        )
    with autocast():
        return torch.cuda.make_graphed_callables(net, (sample["audio"], sample["audio_lengths"]), num_warmup_iters=3)


def _profile(step, profile_steps: int, cuda: bool, step_ms: float) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        with tempfile.TemporaryDirectory() as d:
            with torch_profile(activities=activities) as prof:
                for i in range(profile_steps):
                    step(i)
            path = os.path.join(d, "trace.json")
            prof.export_chrome_trace(path)
            return profile.summarize(path, "torch", profile_steps, step_ms, cuda)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:500]}


def main() -> None:
    """torchrun entry: one process per GPU; rank 0 writes --result."""
    import torch.distributed as dist

    p = argparse.ArgumentParser()
    p.add_argument("--spec", required=True)
    p.add_argument("--result", required=True)
    args = p.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        config = settings.from_config_dict(spec.pop("config"))
        row = run(config, rank=rank, world=world, **spec)
        if rank == 0:
            with open(args.result, "w") as f:
                json.dump(row, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # jax only computes feature statistics here
    main()
