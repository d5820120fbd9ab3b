"""Step time, throughput and multi-device scaling of the JAX and PyTorch DS2 variants.

    python -m benchmarks.scaling --config=configs/ds2_8gpu.py --devices=1,2,4,8 \
        --variants=jax,jax_jit,jax_eager,torch_loop,torch_cudnn,torch_compile,torch_cudnn_graphs \
        --dtype=float32,bfloat16 --out=DIR [--steps=20 --warmup=3 --config.x=y ...]

On the CPU, with fake devices and the tiny config (seconds):

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m benchmarks.scaling \
        --config=configs/smoke.py --devices=1,2 --variants=jax,jax_jit,jax_eager,torch_loop,torch_cudnn \
        --steps=3 --warmup=1 --out=/tmp/b

Data is always the synthetic source (config.dataset.synthetic_*: 6-8 s by default),
per_device_batch_size utterances per device, every batch padded to the longest
duration; --num_batches distinct batches are staged on the devices first and cycled,
so the input pipeline is not measured (benchmarks/input_pipeline.py measures it).
Per variant, dtype and device count: median and p10/p25/p75/p90 step time over --steps
timed steps after --warmup untimed ones (the first, compile + run, timed apart),
utterances/s, the seed's epoch columns, speedup and efficiency over one device, and
a profile summary. Writes DIR/results.{json,csv,md}, DIR/speedup.png and
DIR/ms_per_step.png after every measurement, so an interrupted run keeps what it has.

jax is the pmap'd step (config.parallelism='pmap'), jax_jit the same step under
parallelism='jit'; jax_eager runs on one device only. With CUDA, every PyTorch measurement runs in its own
processes, one per GPU (DistributedDataParallel through torch.distributed.run; rank 0
reports), so its CUDA libraries never meet this process's JAX; on the CPU it runs here,
on one device.
"""

from __future__ import annotations

import os

# JAX and PyTorch share the GPU in this process: JAX must not take 75% of it up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import datetime  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402

import jax  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks import flops, jax_bench, report  # noqa: E402
from ds2_jax import cli, geometry, model, settings  # noqa: E402
from ds2_jax.pipeline import plan  # noqa: E402
from ds2_jax.pipeline.source import DataSettings  # noqa: E402

log = logging.getLogger("benchmarks.scaling")
TORCH_VARIANTS = ("torch_loop", "torch_cudnn", "torch_compile", "torch_cudnn_graphs")
VARIANTS = jax_bench.VARIANTS + TORCH_VARIANTS

_CONFIG = cli.define_config_file("config", "configs/ds2_8gpu.py", "Config file (model, batch, synthetic data).")
_DEVICES = flags.DEFINE_list("devices", ["1"], "Device counts to measure, e.g. 1,2,4,8.")
_VARIANTS = flags.DEFINE_list("variants", list(VARIANTS), f"Any of {','.join(VARIANTS)}.")
_DTYPES = flags.DEFINE_list("dtype", ["float32"], "Compute dtypes: float32, bfloat16.")
_OUT = flags.DEFINE_string("out", None, "Output directory.", required=True)
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps per measurement.")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps first (the first one, compile + run, is reported).")
_VARIANT_STEPS = flags.DEFINE_list(
    "variant_steps", [], "Per-variant VARIANT:STEPS[:WARMUP[:PROFILE_STEPS]], e.g. torch_loop:10,jax_eager:2:1:1."
)
_PROFILE_STEPS = flags.DEFINE_integer("profile_steps", 2, "Steps traced for the profile summary; 0 = none.")
_NUM_BATCHES = flags.DEFINE_integer("num_batches", 4, "Distinct batches staged on the devices and cycled.")
_COMPILE_MODE = flags.DEFINE_string(
    "torch_compile_mode",
    "cudagraphs",
    "torch_compile: 'cudagraphs' (loop model fwd+bwd as CUDA graphs) or a torch.compile mode (e.g. reduce-overhead).",
)
_CELL_TIMEOUT = flags.DEFINE_integer(
    "cell_timeout_s", 0, "Limit per PyTorch measurement on GPUs (its own processes); 0 = none."
)
_TORCH_TF32 = flags.DEFINE_bool(
    "torch_tf32", False, "Let PyTorch float32 matmuls use TF32 (PyTorch's default: off; cuDNN convs and RNNs: on)."
)
_MERGE = flags.DEFINE_string("merge", "", "results.json of an earlier run: its rows are kept unless measured again.")


def _parse() -> tuple[list[int], list[str], list[str], dict[str, int]]:
    devices = sorted({int(d) for d in _DEVICES.value})
    if not devices or devices[0] < 1:
        raise app.UsageError("--devices must be positive integers")
    variants = list(_VARIANTS.value)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise app.UsageError(f"unknown --variants {unknown}: expected some of {list(VARIANTS)}")
    dtypes = list(_DTYPES.value)
    bad = [d for d in dtypes if d not in model.DTYPES]
    if bad:
        raise app.UsageError(f"unknown --dtype {bad}: expected some of {sorted(model.DTYPES)}")
    steps = {}
    for item in _VARIANT_STEPS.value:
        name, *counts = item.split(":")
        if (
            name not in VARIANTS
            or not 1 <= len(counts) <= 3
            or not all(c.isdigit() for c in counts)
            or int(counts[0]) < 1
        ):
            raise app.UsageError(f"--variant_steps entry {item!r}: expected VARIANT:STEPS[:WARMUP[:PROFILE_STEPS]]")
        defaults = [_STEPS.value, _WARMUP.value, _PROFILE_STEPS.value]
        steps[name] = tuple(int(c) for c in counts) + tuple(defaults[len(counts) :])
    return devices, variants, dtypes, steps


def check_devices(devices: list[int], variants: list[str]) -> None:
    """Fails before measuring anything if a device count is more than present."""
    want = max(devices)
    if any(v in jax_bench.VARIANTS for v in variants) and want > jax.local_device_count():
        raise ValueError(
            f"--devices asks for {want} devices but only {jax.local_device_count()} jax "
            f"{jax.local_devices()[0].platform} devices are present (on the CPU, set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={want})"
        )
    if any(v in TORCH_VARIANTS for v in variants):
        import torch

        if torch.cuda.is_available() and want > torch.cuda.device_count():
            raise ValueError(
                f"--devices asks for {want} devices but only {torch.cuda.device_count()} CUDA GPUs are present"
            )


def _torch_distributed(config, spec: dict, n: int) -> dict:
    """Runs one torch measurement in n processes (one per GPU); returns rank 0's row."""
    with tempfile.TemporaryDirectory() as d:
        spec_path, result_path = os.path.join(d, "spec.json"), os.path.join(d, "result.json")
        with open(spec_path, "w") as f:
            json.dump({**spec, "config": settings.to_dict(config)}, f)
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]), JAX_PLATFORMS="cpu"
        )
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={n}",
            "-m",
            "benchmarks.torch_bench",
            f"--spec={spec_path}",
            f"--result={result_path}",
        ]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=_CELL_TIMEOUT.value or None)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"gave up after --cell_timeout_s={_CELL_TIMEOUT.value}") from e
        if proc.returncode != 0 or not os.path.exists(result_path):
            raise RuntimeError(f"torchrun exited {proc.returncode}: {proc.stderr[-1500:]}")
        with open(result_path) as f:
            return json.load(f)


def measure(config, variant: str, dtype: str, n: int, counts: tuple[int, int, int]) -> dict:
    """One row: the variant's measurement, or status 'skipped' / 'error' with the reason.

    counts: (timed steps, warm-up steps, profiled steps).
    """
    steps, warmup, profile_steps = counts
    row = {
        "variant": variant,
        "dtype": dtype,
        "devices": n,
        "global_batch": config.per_device_batch_size * n,
        "per_device_batch": config.per_device_batch_size,
        "warmup": warmup,
    }
    config = settings.override(settings.from_config_dict(config), {"model.dtype": dtype})
    common = dict(steps=steps, warmup=warmup, profile_steps=profile_steps, num_batches=_NUM_BATCHES.value)
    try:
        if variant in jax_bench.VARIANTS:
            if variant == "jax_eager" and n > 1:
                return {**row, "status": "skipped", "notes": "eager runs op by op on one device"}
            result = jax_bench.run(config, variant, n, **common)
        else:
            import torch

            from benchmarks import torch_bench

            if not torch.cuda.is_available():
                if variant == "torch_compile" and _COMPILE_MODE.value == "cudagraphs":
                    return {
                        **row,
                        "status": "skipped",
                        "notes": "CUDA graphs need a GPU (on the CPU pass --torch_compile_mode=default)",
                    }
                if variant == "torch_cudnn_graphs":
                    return {
                        **row,
                        "status": "skipped",
                        "notes": "CUDA graphs need a GPU (torch_cudnn is the same model, eager)",
                    }
            if torch.cuda.is_available():  # own processes: CUDA libraries apart from this one's JAX
                spec = dict(
                    variant=variant, n_devices=n, compile_mode=_COMPILE_MODE.value, tf32=_TORCH_TF32.value, **common
                )
                result = _torch_distributed(config, spec, n)
            elif n == 1:
                result = torch_bench.run(
                    config, variant, 1, compile_mode=_COMPILE_MODE.value, tf32=_TORCH_TF32.value, **common
                )
            else:
                return {**row, "status": "skipped", "notes": "several torch devices need CUDA (one process per GPU)"}
        return {**row, "status": "ok", **result, **model_flops(config, result["step_ms_median"])}
    except Exception as e:  # recorded, and the other measurements go on
        log.error("%s %s x%d failed:\n%s", variant, dtype, n, traceback.format_exc())
        return {**row, "status": "error", "error": f"{type(e).__name__}: {e}"[:1000]}


def model_flops(config: settings.Config, step_ms: float) -> dict:
    """Counted model FLOPs of one device's step on the padded synthetic batch (benchmarks.flops),
    the rate they run at, and the share of the GPU's dense peak in the compute dtype (MFU)."""
    data = DataSettings.of(config)
    rate = data.spectrogram.sample_rate
    samples = plan.stretched(int(data.dataset.synthetic_max_duration_s * rate), data.waveform.stretch)
    frames = geometry.num_frames(samples, data.spectrogram.window, data.spectrogram.hop)
    step = flops.train_step_flops(
        model.ModelConfig.of(config.model), config.per_device_batch_size, frames, data.spectrogram.num_bins
    )
    per_s = step / (step_ms / 1e3)
    peak = flops.peak_flops(getattr(jax.devices()[0], "device_kind", ""), config.model.dtype)
    return {
        "model_gflop_per_step_per_device": step / 1e9,
        "model_tflops_per_s_per_device": per_s / 1e12,
        "mfu": per_s / peak if peak else None,
    }


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    devices, variants, dtypes, variant_steps = _parse()
    try:
        check_devices(devices, variants)
    except ValueError as e:
        sys.exit(f"error: {e}")
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks.scaling " + " ".join(sys.argv[1:]),
        "jax devices": jax_bench.device_description(),
        "model": _model_summary(config),
        "data": (
            f"synthetic {config.dataset.synthetic_min_duration_s:g}-{config.dataset.synthetic_max_duration_s:g} s "
            f"utterances, padded to {config.dataset.synthetic_max_duration_s:g} s, "
            f"{config.per_device_batch_size} per device"
        ),
        "steps": f"{_STEPS.value} timed after {_WARMUP.value} warm-up (per-variant overrides: "
        f"{dict(variant_steps) or 'none'})",
    }
    if any(v in TORCH_VARIANTS for v in variants):
        from benchmarks import torch_bench

        meta["torch devices"] = torch_bench.device_description()
        meta["torch float32 matmuls"] = (
            "TF32 allowed (--torch_tf32)"
            if _TORCH_TF32.value
            else "full float32 (PyTorch default; cuDNN convs/RNNs may use TF32)"
        )
    if any(v in jax_bench.VARIANTS for v in variants):
        meta["jax default matmul precision"] = str(jax.config.jax_default_matmul_precision or "default (XLA's choice)")
    rows = []
    if _MERGE.value:
        with open(_MERGE.value) as f:
            rows = json.load(f)["results"]
    for variant in variants:
        for dtype in dtypes:
            for n in devices:
                counts = variant_steps.get(variant, (_STEPS.value, _WARMUP.value, _PROFILE_STEPS.value))
                log.info("measuring %s %s on %d device(s), (steps, warmup, profiled) = %s", variant, dtype, n, counts)
                row = measure(config, variant, dtype, n, counts)
                rows = [r for r in rows if (r["variant"], r["dtype"], r["devices"]) != (variant, dtype, n)] + [row]
                report.write_all(_OUT.value, meta, rows)
                log.info("%s %s x%d: %s, %s ms/step", variant, dtype, n, row["status"], row.get("step_ms_median"))
    print(f"wrote {_OUT.value}/results.md")
    with open(os.path.join(_OUT.value, "results.md")) as f:
        print(f.read())


def _model_summary(config) -> str:
    m = config.model
    return (
        f"{m.num_conv_layers} conv x {m.conv_channels} ch, {m.num_rnn_layers} x "
        f"{'bi' if m.bidirectional else 'uni'}directional {m.rnn_cell} RNN of {m.rnn_size}"
        f"{' (shared input weights)' if m.share_rnn_weights else ''}"
    )


if __name__ == "__main__":
    cli.run(main)
