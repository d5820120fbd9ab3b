"""Profile summaries from Chrome/Perfetto trace JSON: kernel launches, GPU busy time, top kernels.

Both profilers write the same event format ({"traceEvents": [{"ph": "X", "ts": us,
"dur": us, "name", "pid", "tid", ...}]}):

- torch.profiler (`export_chrome_trace`): GPU kernels carry "cat": "kernel"
  (memory copies "gpu_memcpy" / "gpu_memset"); host ops "cat": "cpu_op".
- jax.profiler.trace(..., create_perfetto_trace=True) writes
  plugins/profile/<run>/perfetto_trace.json.gz: device activity lives in processes
  named "/device:GPU:<n>", kernels on threads named "Stream #<k>(...)"; the other
  threads there ("XLA Ops", "XLA Modules", ...) are derived from the kernels.

`summarize` never raises: a trace it cannot read gives {"error": "..."}.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os

TOP_KERNELS = 40  # kernels listed per trace: enough to name every one that matters in a step


def load_trace(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {"traceEvents": data}


def find_jax_trace(log_dir: str) -> str:
    """The Perfetto/Chrome trace json a jax.profiler.trace run wrote under log_dir."""
    for pattern in ("perfetto_trace.json.gz", "*.trace.json.gz", "*.json.gz", "*.json"):
        hits = sorted(glob.glob(os.path.join(log_dir, "**", pattern), recursive=True))
        if hits:
            return hits[-1]
    found = sorted(glob.glob(os.path.join(log_dir, "**", "*"), recursive=True))
    raise FileNotFoundError(f"no trace json under {log_dir} (found: {[os.path.basename(f) for f in found][:10]})")


def _names(events, kind: str) -> dict:
    """pid (process_name) or (pid, tid) (thread_name) -> name, from metadata events."""
    out = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == kind:
            key = e.get("pid") if kind == "process_name" else (e.get("pid"), e.get("tid"))
            out[key] = str(e.get("args", {}).get("name", ""))
    return out


def device_kernels(trace: dict, source: str) -> tuple[list[dict], list[dict]]:
    """(kernel events, host op events) of a torch or jax trace; 'X' events only."""
    events = trace.get("traceEvents", [])
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    if source == "torch":
        kernels = [e for e in spans if e.get("cat") == "kernel"]
        host = [e for e in spans if e.get("cat") == "cpu_op"]
        return kernels, host
    procs, threads = _names(events, "process_name"), _names(events, "thread_name")
    gpu_pids = {pid for pid, name in procs.items() if "GPU" in name or "gpu" in name}
    kernels, host = [], []
    for e in spans:
        if e.get("pid") in gpu_pids:
            tname = threads.get((e.get("pid"), e.get("tid")), "")
            if tname.startswith("Stream") and not str(e.get("name", "")).startswith(("Memcpy", "Memset")):
                kernels.append(e)
        else:
            host.append(e)
    return kernels, host


def busy_us(events: list[dict]) -> float:
    """Length of the union of [ts, ts + dur) intervals (overlapping streams count once)."""
    total, end = 0.0, float("-inf")
    for s, d in sorted((float(e["ts"]), float(e["dur"])) for e in events):
        if s + d <= end:
            continue
        total += s + d - max(s, end)
        end = s + d
    return total


def by_calls_per_step(per_name: dict, steps: int) -> list[dict]:
    """Kernel time grouped by how often a kernel runs per step: loops show up as groups
    (e.g. 801 calls = a 3-layer x 267-frame recurrence), one-off kernels as calls 1-2."""
    groups = collections.defaultdict(lambda: [0, 0.0])
    for calls, us in per_name.values():
        key = round(calls / steps)
        groups[key][0] += 1
        groups[key][1] += us
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][1])[:TOP_KERNELS]
    return [{"calls_per_step": k, "kernels": n, "ms_per_step": round(us / steps / 1e3, 3)} for k, (n, us) in ranked]


def summarize(trace_path: str, source: str, steps: int, step_ms: float | None, on_gpu: bool) -> dict:
    """Per-step kernel launches, GPU busy fraction, top kernels (or host op counts on CPU).

    gpu_busy_fraction = (union of kernel time per profiled step) / (median step time of
    the unprofiled timing run), capped at 1.
    """
    try:
        trace = load_trace(trace_path)
        kernels, host = device_kernels(trace, source)
        steps = max(steps, 1)
        out = {"profiled_steps": steps, "host_ops_per_step": round(len(host) / steps, 1)}
        if not on_gpu or not kernels:
            out["kernels_per_step"] = "n/a (cpu)" if not on_gpu else "n/a (no GPU kernels in trace)"
            out["gpu_busy_fraction"] = "n/a (cpu)" if not on_gpu else "n/a"
            names = collections.Counter(str(e.get("name", "")) for e in host)
            out["top_host_ops_by_count"] = [
                {"name": n[:80], "count_per_step": round(c / steps, 1)} for n, c in names.most_common(TOP_KERNELS)
            ]
            return out
        per_name = collections.defaultdict(lambda: [0, 0.0])
        for e in kernels:
            per_name[str(e.get("name", ""))][0] += 1
            per_name[str(e.get("name", ""))][1] += float(e["dur"])
        kernel_us = sum(v[1] for v in per_name.values())
        busy = busy_us(kernels) / steps
        out.update(
            kernels_per_step=round(len(kernels) / steps, 1),
            kernel_ms_per_step=round(kernel_us / steps / 1e3, 3),
            gpu_busy_ms_per_step=round(busy / 1e3, 3),
            gpu_busy_fraction=round(min(busy / 1e3 / step_ms, 1.0), 3) if step_ms else "n/a",
            top_kernels=[
                {
                    "name": n[:100],
                    "ms_per_step": round(v[1] / steps / 1e3, 3),
                    "calls_per_step": round(v[0] / steps, 1),
                    "share": round(v[1] / kernel_us, 3),
                }
                for n, v in sorted(per_name.items(), key=lambda kv: -kv[1][1])[:TOP_KERNELS]
            ],
            time_by_calls_per_step=by_calls_per_step(per_name, steps),
        )
        return out
    except Exception as e:  # a report, not a crash
        return {"error": f"{type(e).__name__}: {e}"[:500]}
