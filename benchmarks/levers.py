"""The fast-step levers, each measured on the seed configuration in one run.

    python -m benchmarks.levers --out=DIR [--steps=30] [--levers=name,name]

Each lever is one `benchmarks.scaling` measurement of the `jax` variant on one device
(its own process, so XLA flags apply), cumulative from the plain lax.scan in float32 to
the fastest combination; `torch_cudnn` and `torch_cudnn_graphs` (bfloat16) are measured in
the same run for the ratio. Writes DIR/levers.json and DIR/levers.md (ms/step median of steps waited for one
by one, ms/step of steps queued back to back as in training, compile time, kernel
launches per step and GPU-busy % from the profile summary) and DIR/levers.png.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import flags

COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
# The levers before the CTC kernel ran with optax's scan, those before conv_impl with strided convs.
OPTAX = "--config.loss.ctc_impl=optax"
DIRECT = "--config.model.conv_impl=direct"
PALLAS = ["--config.model.rnn_impl=pallas", "--config.loss.ctc_impl=pallas"]
MOSAIC = ["--config.model.rnn_impl=mosaic", "--config.loss.ctc_impl=pallas"]
SIXTEEN_S = ["--config.dataset.synthetic_min_duration_s=16", "--config.dataset.synthetic_max_duration_s=16"]
# (name, config overrides, extra XLA_FLAGS, variant, dtype)
LEVERS = [
    ("scan f32 (reference)", [OPTAX, DIRECT, "--config.model.rnn_impl=scan"], "", "jax", "float32"),
    ("scan bf16", [OPTAX, DIRECT, "--config.model.rnn_impl=scan"], "", "jax", "bfloat16"),
    ("scan_vjp f32", [OPTAX, DIRECT, "--config.model.rnn_impl=scan_vjp"], "", "jax", "float32"),
    ("scan_vjp bf16", [OPTAX, DIRECT, "--config.model.rnn_impl=scan_vjp"], "", "jax", "bfloat16"),
    ("scan_vjp bf16 unroll 4", [OPTAX, DIRECT, "--config.model.rnn_impl=scan_vjp", "--config.model.scan_unroll=4"], "", "jax", "bfloat16"),
    ("scan_vjp bf16 unroll 8", [OPTAX, DIRECT, "--config.model.rnn_impl=scan_vjp", "--config.model.scan_unroll=8"], "", "jax", "bfloat16"),
    ("scan_vjp f32 unroll 8", [OPTAX, DIRECT, "--config.model.rnn_impl=scan_vjp", "--config.model.scan_unroll=8"], "", "jax", "float32"),
    ("scan_vjp bf16 unroll 8 + Triton GEMM epilogue fusion", [OPTAX, DIRECT, "--config.model.rnn_impl=scan_vjp", "--config.model.scan_unroll=8"],
     "--xla_gpu_triton_gemm_any=true", "jax", "bfloat16"),
    ("scan_vjp bf16 unroll 16", [OPTAX, DIRECT, "--config.model.rnn_impl=scan_vjp", "--config.model.scan_unroll=16"], "", "jax", "bfloat16"),
    ("scan_vjp bf16 unroll 8 batch 64", [OPTAX, DIRECT, "--config.model.rnn_impl=scan_vjp", "--config.model.scan_unroll=8",
                                          "--config.per_device_batch_size=64"], "", "jax", "bfloat16"),
    ("scan_vjp bf16 unroll 8 16 s utterances", [OPTAX, DIRECT, "--config.model.rnn_impl=scan_vjp", "--config.model.scan_unroll=8",
                                                 *SIXTEEN_S], "", "jax", "bfloat16"),
    ("scan_vjp bf16 unroll 8 + deterministic ops", [OPTAX, DIRECT, "--config.model.rnn_impl=scan_vjp", "--config.model.scan_unroll=8"],
     "--xla_gpu_deterministic_ops=true", "jax", "bfloat16"),
    ("torch_cudnn bf16 batch 64", ["--config.per_device_batch_size=64"], "", "torch_cudnn", "bfloat16"),
    ("torch_cudnn bf16 16 s utterances", SIXTEEN_S, "", "torch_cudnn", "bfloat16"),
    ("scan_vjp bf16 unroll 8 + command buffers", [OPTAX, DIRECT, "--config.model.rnn_impl=scan_vjp", "--config.model.scan_unroll=8"],
     COMMAND_BUFFERS, "jax", "bfloat16"),
    ("pallas rnn bf16", [OPTAX, DIRECT, "--config.model.rnn_impl=pallas"], "", "jax", "bfloat16"),
    ("pallas rnn + pallas ctc bf16", [*PALLAS, DIRECT], "", "jax", "bfloat16"),
    ("pallas rnn + pallas ctc bf16 + command buffers (no loops left to capture)", [*PALLAS, DIRECT],
     COMMAND_BUFFERS.replace(",WHILE,CONDITIONAL", ""), "jax", "bfloat16"),
    ("auto rnn (scan_vjp: kernel exceeds shared memory) + pallas ctc f32",
     ["--config.model.rnn_impl=auto", "--config.loss.ctc_impl=pallas", DIRECT], "", "jax", "float32"),
    ("pallas rnn + pallas ctc bf16 batch 64", [*PALLAS, DIRECT, "--config.per_device_batch_size=64"], "", "jax", "bfloat16"),
    ("pallas rnn + pallas ctc bf16 16 s utterances", [*PALLAS, DIRECT, *SIXTEEN_S], "", "jax", "bfloat16"),
    ("torch_cudnn bf16", [], "", "torch_cudnn", "bfloat16"),
    ("torch_cudnn_graphs bf16", [], "", "torch_cudnn_graphs", "bfloat16"),
    ("defaults (auto: scan_vjp rnn above 16 rows + pallas ctc) bf16 batch 64", [DIRECT, "--config.per_device_batch_size=64"],
     "", "jax", "bfloat16"),
    ("kernels bf16 + every strided conv on space-to-depth input", [*PALLAS], "", "jax", "bfloat16"),
    ("kernels bf16 + space-to-depth convs, 16 s utterances", [*PALLAS, *SIXTEEN_S], "", "jax", "bfloat16"),
    ("defaults bf16 batch 64 (space-to-depth convs)", ["--config.per_device_batch_size=64"], "", "jax", "bfloat16"),
    ("kernels bf16 + Mosaic GPU RNN (cluster pairs)", MOSAIC, "", "jax", "bfloat16"),
    ("kernels bf16 + Mosaic GPU RNN (cluster pairs) 16 s utterances", [*MOSAIC, *SIXTEEN_S], "", "jax", "bfloat16"),
]

_OUT = flags.DEFINE_string("out", None, "Output directory.", required=True)
_CONFIG = flags.DEFINE_string("config", "configs/ds2_8gpu.py", "Config file.")
_STEPS = flags.DEFINE_integer("steps", 30, "Timed steps per lever.")
_ONLY = flags.DEFINE_list("levers", [], "Subset of lever names (default: all).")
_TIMEOUT = flags.DEFINE_integer("timeout_s", 240, "Limit per lever.")
_PLOT_ONLY = flags.DEFINE_bool("plot_only", False, "Only redraw DIR/levers.png from DIR/levers.json.")


def run_lever(name, overrides, xla_flags, variant, dtype, out_dir) -> dict:
    env = dict(os.environ)
    if xla_flags:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + xla_flags).strip()
    cmd = [sys.executable, "-m", "benchmarks.scaling", f"--config={_CONFIG.value}", "--devices=1",
           f"--variants={variant}", f"--dtype={dtype}", f"--out={out_dir}", f"--steps={_STEPS.value}",
           "--warmup=3", "--profile_steps=2", "--config.dataset.name=synthetic", *overrides]
    row = {"lever": name, "variant": variant, "dtype": dtype, "overrides": " ".join(overrides), "xla_flags": xla_flags}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=_TIMEOUT.value)
        with open(os.path.join(out_dir, "results.json")) as f:
            result = json.load(f)["results"][-1]
        row.update({k: result.get(k) for k in ("status", "step_ms_median", "step_ms_p10", "step_ms_p90", "first_step_s",
                                                "pipelined_ms_per_step", "peak_memory_gb", "global_batch", "error")})
        prof = result.get("profile") or {}
        busy = prof.get("gpu_busy_fraction")
        row.update(launches_per_step=prof.get("kernels_per_step"),
                   gpu_busy_pct=round(100 * busy, 1) if isinstance(busy, (int, float)) else busy,
                   top_kernels=prof.get("top_kernels", []),
                   time_by_calls_per_step=prof.get("time_by_calls_per_step", []))
        if proc.returncode:
            row["error"] = proc.stderr[-800:]
    except Exception as e:  # a lever that fails is recorded, the others still run
        row.update(status="error", error=f"{type(e).__name__}: {e}"[:800])
    return row


def markdown(rows) -> str:
    lines = ["| lever | ms/step (median) | p10-p90 | pipelined ms/step | first step s | launches/step | GPU busy % | peak GB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = r.get("step_ms_median")
        if not ms:
            lines.append(f"| {r['lever']} | - | {r.get('status', '')}: {str(r.get('error', ''))[:120]} | - | - | - | - | - |")
            continue
        peak = r.get("peak_memory_gb")
        pipelined = r.get("pipelined_ms_per_step")
        lines.append(f"| {r['lever']} | {ms:.1f} | {r['step_ms_p10']:.1f}-{r['step_ms_p90']:.1f} | "
                     f"{f'{pipelined:.1f}' if pipelined else '-'} | "
                     f"{r.get('first_step_s') or 0:.1f} | {r.get('launches_per_step') or '-'} | "
                     f"{r.get('gpu_busy_pct') or '-'} | {f'{peak:.1f}' if peak else '-'} |")
    return "\n".join(lines) + "\n"


def plot(rows, path: str) -> None:
    """Horizontal bars of ms/step per lever (JAX blue, PyTorch orange)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r.get("step_ms_median")]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(done) + 1.2))
    ax.barh([r["lever"] for r in done], [r["step_ms_median"] for r in done],
            color=["tab:orange" if r["variant"].startswith("torch") else "tab:blue" for r in done])
    for i, r in enumerate(done):
        ax.text(r["step_ms_median"], i, f" {r['step_ms_median']:.1f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per training step (median)")
    ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv) -> None:
    del argv
    os.makedirs(_OUT.value, exist_ok=True)
    if _PLOT_ONLY.value:
        with open(os.path.join(_OUT.value, "levers.json")) as f:
            plot(json.load(f), os.path.join(_OUT.value, "levers.png"))
        return
    rows = []
    for i, lever in enumerate(LEVERS):
        if _ONLY.value and lever[0] not in _ONLY.value:
            continue
        row = run_lever(*lever, os.path.join(_OUT.value, f"lever{i}"))
        rows.append(row)
        print(row["lever"], row.get("status"), row.get("step_ms_median"), flush=True)
        with open(os.path.join(_OUT.value, "levers.json"), "w") as f:
            json.dump(rows, f, indent=2)
        with open(os.path.join(_OUT.value, "levers.md"), "w") as f:
            f.write(markdown(rows))
    plot(rows, os.path.join(_OUT.value, "levers.png"))
    print(markdown(rows))


if __name__ == "__main__":
    from ds2_jax import cli

    cli.run(main)
