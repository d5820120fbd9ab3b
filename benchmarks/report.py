"""Writes a scaling run's results.json, results.csv, results.md, speedup.png, ms_per_step.png."""

from __future__ import annotations

import csv
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.timing import SEED_EPOCH_UTTERANCES, SEED_PADDLE_1080TI_EPOCH_S  # noqa: E402

CSV_FIELDS = (
    "variant",
    "dtype",
    "devices",
    "status",
    "global_batch",
    "steps_timed",
    "first_step_s",
    "step_ms_median",
    "step_ms_p10",
    "step_ms_p90",
    "step_ms_p25",
    "step_ms_p75",
    "pipelined_ms_per_step",
    "utterances_per_s",
    "minibatches_per_epoch",
    "time_per_minibatch_s",
    "epoch_time_s",
    "speedup",
    "efficiency",
    "params",
    "model_gflop_per_step_per_device",
    "model_tflops_per_s_per_device",
    "mfu",
    "kernels_per_step",
    "gpu_busy_fraction",
    "error",
    "notes",
)


def add_speedups(rows: list[dict]) -> None:
    """speedup = epoch time on 1 device / epoch time on N (same variant and dtype)."""
    one = {(r["variant"], r["dtype"]): r["epoch_time_s"] for r in rows if r.get("status") == "ok" and r["devices"] == 1}
    for r in rows:
        base = one.get((r["variant"], r["dtype"]))
        if r.get("status") == "ok" and base:
            r["speedup"] = base / r["epoch_time_s"]
            r["efficiency"] = r["speedup"] / r["devices"]


def is_pytorch(variant: str) -> bool:
    return variant.startswith("torch_")


def pytorch_vs_ours(rows: list[dict]) -> list[dict]:
    """Per (dtype, devices), and per device count over every dtype ('any'): the fastest
    measured PyTorch variant against the fastest JAX variant, by median ms/step.

    ratio = PyTorch ms / ours ms (> 1: ours is faster). Groups lacking either side are left out.
    """
    ok = [r for r in rows if r.get("status") == "ok" and r.get("step_ms_median")]
    groups = {}
    for r in ok:
        groups.setdefault((r["dtype"], r["devices"]), []).append(r)
        groups.setdefault(("any", r["devices"]), []).append(r)
    out = []
    for (dtype, devices), members in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0] == "any", kv[0][0])):
        torch_rows = [r for r in members if is_pytorch(r["variant"])]
        ours = [r for r in members if not is_pytorch(r["variant"])]
        if not torch_rows or not ours:
            continue
        t = min(torch_rows, key=lambda r: r["step_ms_median"])
        o = min(ours, key=lambda r: r["step_ms_median"])
        out.append(
            {
                "dtype": dtype,
                "devices": devices,
                "pytorch": t["variant"],
                "pytorch_dtype": t["dtype"],
                "pytorch_ms": t["step_ms_median"],
                "ours": o["variant"],
                "ours_dtype": o["dtype"],
                "ours_ms": o["step_ms_median"],
                "ratio": t["step_ms_median"] / o["step_ms_median"],
                "pytorch_measured": sorted({r["variant"] for r in torch_rows}),
            }
        )
    return out


def _side(q: dict, side: str) -> str:
    """A ratio's variant, with its dtype where the comparison spans every dtype."""
    return f"{q[side]} {q[side + '_dtype']}" if q["dtype"] == "any" else q[side]


def _fmt(x, digits=1):
    if x is None or x == "":
        return ""
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return str(x)


def write_all(out_dir: str, meta: dict, rows: list[dict]) -> None:
    os.makedirs(out_dir, exist_ok=True)
    add_speedups(rows)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "results": rows, "pytorch_vs_ours": pytorch_vs_ours(rows)}, f, indent=2)
    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            prof = r.get("profile") or {}
            w.writerow(
                {
                    **r,
                    "kernels_per_step": prof.get("kernels_per_step", ""),
                    "gpu_busy_fraction": prof.get("gpu_busy_fraction", ""),
                }
            )
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(markdown(meta, rows))
    speedup_plot(rows, os.path.join(out_dir, "speedup.png"))
    ms_plot(rows, os.path.join(out_dir, "ms_per_step.png"))


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [
        "# DS2 step time and scaling",
        "",
        *(f"- {k}: {v}" for k, v in meta.items()),
        "",
        f"Epoch = {SEED_EPOCH_UTTERANCES:,} utterances (the seed's 972 minibatches x 16); epoch time = "
        "median step time x minibatches per epoch (global batch = per-device batch x devices). "
        "Step time covers featurization, forward, CTC, backward, gradient all-reduce and the optimizer "
        "update on synthetic batches already on the device; the first step (compile + run) is reported apart.",
        "",
        "| variant | dtype | devices | global batch | ms/step (median) | p10-p90 ms | first step (s) | utt/s "
        "| minibatches/epoch | time/minibatch (s) | epoch time (s) | speedup | efficiency "
        "| model GFLOP/step/device | TFLOP/s/device | MFU |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.get("status") != "ok":
            reason = r.get("error") or r.get("notes") or ""
            lines.append(
                f"| {r['variant']} | {r['dtype']} | {r['devices']} | {r.get('status')}: {reason[:160]} ||||||||||||"
            )
            continue
        lines.append(
            f"| {r['variant']} | {r['dtype']} | {r['devices']} | {r['global_batch']} | {_fmt(r['step_ms_median'])} "
            f"| {_fmt(r['step_ms_p10'])}-{_fmt(r['step_ms_p90'])} | {_fmt(r['first_step_s'], 2)} | "
            f"{_fmt(r['utterances_per_s'])} "
            f"| {r['minibatches_per_epoch']} | {_fmt(r['time_per_minibatch_s'], 4)} | {_fmt(r['epoch_time_s'])} "
            f"| {_fmt(r.get('speedup'), 2)} | {_fmt(r.get('efficiency'), 2)} "
            f"| {_fmt(r.get('model_gflop_per_step_per_device'))} | {_fmt(r.get('model_tflops_per_s_per_device'))} "
            f"| {_fmt(r.get('mfu'), 3)} |"
        )
    ratios = pytorch_vs_ours(rows)
    if ratios:
        lines += [
            "",
            "## Strongest PyTorch / ours",
            "",
            "The fastest PyTorch variant measured against the fastest JAX variant (median ms/step), per dtype "
            "and device count; 'any' compares the fastest of every dtype.",
            "",
            "| dtype | devices | strongest PyTorch | ms/step | ours | ms/step | PyTorch / ours | PyTorch "
            "variants measured |",
            "|---|---:|---|---:|---|---:|---:|---|",
        ]
        for q in ratios:
            lines.append(
                f"| {q['dtype']} | {q['devices']} | {_side(q, 'pytorch')} | {_fmt(q['pytorch_ms'])} "
                f"| {_side(q, 'ours')} | {_fmt(q['ours_ms'])} | {q['ratio']:.2f}x "
                f"| {', '.join(q['pytorch_measured'])} |"
            )
    notes = [r for r in rows if r.get("status") == "ok" and r.get("notes")]
    if notes:
        lines += ["", "Notes:", *(f"- {r['variant']} {r['dtype']} x{r['devices']}: {r['notes']}" for r in notes)]
    lines += [
        "",
        "## Profile",
        "",
        "Kernels per step and GPU busy fraction (union of kernel time per step / median step time) "
        "from torch.profiler (CUDA activities) or a jax.profiler trace; on the CPU only host op counts.",
        "",
        "| variant | dtype | devices | kernels/step | GPU busy | top kernels (ms/step) or host ops (count/step) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        prof = r.get("profile")
        if r.get("status") != "ok" or not prof:
            continue
        if "error" in prof:
            lines.append(f"| {r['variant']} | {r['dtype']} | {r['devices']} | error | | {prof['error'][:160]} |")
            continue
        if "top_kernels" in prof:
            top = "; ".join(f"{k['name'][:60]} {k['ms_per_step']}" for k in prof["top_kernels"][:3])
        else:
            top = "; ".join(
                f"{k['name'][:40]} x{k['count_per_step']}" for k in prof.get("top_host_ops_by_count", [])[:3]
            )
        lines.append(
            f"| {r['variant']} | {r['dtype']} | {r['devices']} | {prof.get('kernels_per_step')} | "
            f"{prof.get('gpu_busy_fraction')} | {top.replace('|', '/')} |"
        )
    lines += [
        "",
        "## Seed reference: Paddle DS2 on 1080 Ti",
        "",
        "| GPUs | time per epoch (s) | speedup | efficiency |",
        "|---:|---:|---:|---:|",
    ]
    base = SEED_PADDLE_1080TI_EPOCH_S[1]
    for n, t in SEED_PADDLE_1080TI_EPOCH_S.items():
        lines.append(f"| {n} | {t} | {base / t:.2f} | {base / t / n:.2f} |")
    return "\n".join(lines) + "\n"


def speedup_plot(rows: list[dict], path: str) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 5))
    seed_n = sorted(SEED_PADDLE_1080TI_EPOCH_S)
    all_n = set(seed_n)
    ax.plot(
        seed_n,
        [SEED_PADDLE_1080TI_EPOCH_S[1] / SEED_PADDLE_1080TI_EPOCH_S[n] for n in seed_n],
        "k--",
        marker="x",
        label="seed: Paddle 1080 Ti",
    )
    series = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("speedup"):
            series.setdefault(f"{r['variant']} {r['dtype']}", []).append((r["devices"], r["speedup"]))
    for label, pts in sorted(series.items()):
        pts.sort()
        all_n.update(n for n, _ in pts)
        ax.plot([n for n, _ in pts], [s for _, s in pts], marker="o", label=label)
    ideal = sorted(all_n)
    ax.plot(ideal, ideal, ":", color="gray", label="ideal")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("devices")
    ax.set_ylabel("speedup over 1 device (epoch time)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def ms_plot(rows: list[dict], path: str) -> None:
    ok = [r for r in rows if r.get("status") == "ok" and r["devices"] == 1]
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(ok) + 2), 4.5))
    labels = [f"{r['variant']}\n{r['dtype']}" for r in ok]
    values = [r["step_ms_median"] for r in ok]
    errs = [[r["step_ms_median"] - r["step_ms_p10"] for r in ok], [r["step_ms_p90"] - r["step_ms_median"] for r in ok]]
    bars = ax.bar(range(len(ok)), values, yerr=errs if ok else None, capsize=3, color="tab:blue")
    for b, v in zip(bars, values):
        ax.annotate(f"{v:.1f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(ok)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("ms per step, 1 device (median, p10-p90)")
    if values and max(values) / max(min(values), 1e-9) > 30:
        ax.set_yscale("log")
    ax.set_title("DS2 train step, one device")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
