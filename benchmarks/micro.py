"""What the single-kernel benchmarks (recurrence_kernel, kernel_ablation, mosaic_ablation, conv_lowering) share:
the error metric and their report files."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float32."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def write_report(out_dir: str, name: str, rows: list[dict], table: list[str]) -> None:
    """DIR/<name>.json (device + rows) and DIR/<name>.md (the markdown `table` lines); prints the table."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump({"device": str(jax.devices()[0].device_kind), "rows": rows}, f, indent=1)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write("\n".join(table) + "\n")
    print("\n".join(table))


def layer_fns(impl):
    """(forward, forward+backward) jitted for one recurrence implementation impl(xs, w)."""
    fwd = jax.jit(impl)

    def loss(xs, w, ct):
        return jnp.sum(impl(xs, w).astype(jnp.float32) * ct)

    return fwd, jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
