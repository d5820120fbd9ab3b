"""One bidirectional RNN layer alone: scan_vjp against the persistent Pallas kernel (and,
on Hopper GPUs, the Mosaic GPU kernels of ds2_jax.kernels.mosaic_rnn).

    python -m benchmarks.recurrence_kernel --out=DIR [--steps=30] [--kernels=32/4,64/4]

Seed layer shape (267 frames, 2 directions, batch 16, 2048 units, bfloat16, one input
projection shared by both directions as in the model). Times the
forward and the forward + backward (gradient of sum(ys * cotangent)) as medians over
`steps` calls, compile apart, and gives each setting's relative error (norms) of outputs
and gradients against a float32 scan_vjp at full matmul precision. Writes DIR/recurrence_kernel.json and .md.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from benchmarks import timing
from ds2_jax.kernels import mosaic_rnn, triton_rnn
from ds2_jax.rnn import recurrence
from ds2_jax.rnn.reference import scan_vjp_recurrence

_OUT = flags.DEFINE_string("out", None, "Output directory.", required=True)
_STEPS = flags.DEFINE_integer("steps", 30, "Timed calls per setting.")
_KERNELS = flags.DEFINE_list("kernels", ["32/4"], "Persistent-kernel launch settings to try, each cols/num_warps.")
_SHAPE = flags.DEFINE_list("shape", ["267", "2", "16", "2048"], "T, directions, batch, hidden.")
_DTYPE = flags.DEFINE_string("dtype", "bfloat16", "Compute dtype.")
_MOSAIC = flags.DEFINE_bool("mosaic", True, "Also the Mosaic GPU kernels (Hopper GPUs only).")
_MOSAIC_PLANS = flags.DEFINE_list(
    "mosaic_plans", ["auto"], "Mosaic calls to time, each ROWS_PER_CALL/PIECES (e.g. 32/1,64/4) or 'auto'."
)


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


def main(argv):
    del argv
    t, d, b, h = (int(v) for v in _SHAPE.value)
    dtype = jnp.dtype(_DTYPE.value)
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    xs = (jax.random.normal(k1, (b, t, 1, h)) * 2.0).astype(dtype)
    w = (jax.random.normal(k2, (d, h, h)) / np.sqrt(h)).astype(dtype)
    ct = jax.random.normal(k3, (b, t, d, h))
    impls = {"scan_vjp unroll 8": lambda x, r: scan_vjp_recurrence(x, r, "simple", 8)}
    for setting in _KERNELS.value:
        cols, warps = (int(v) for v in setting.split("/"))
        options = triton_rnn.KernelOptions(cols=cols, num_warps=warps)
        impls[f"pallas cols {cols} warps {warps}"] = (lambda o: lambda x, r: triton_rnn.persistent_simple_rnn(x, r, o))(
            options
        )
    if _MOSAIC.value and mosaic_rnn.supported():  # as the model runs it: rows in calls the kernel takes
        for plan in _MOSAIC_PLANS.value or ["auto"]:
            per_call, pieces = (None, None) if plan == "auto" else (int(v) for v in plan.split("/"))
            chunks, rows = mosaic_rnn.row_chunks(b, h, per_call)
            pieces = pieces or mosaic_rnn.pieces_for(rows, h)
            impls[f"mosaic {chunks} x {rows} rows, state in {pieces} pieces"] = (
                lambda n, p: lambda x, r: recurrence.mosaic_recurrence(x, r, "simple", rows_per_call=n, pieces=p)
            )(per_call, pieces)
    # Float32 truth: scan_vjp on the same (rounded) inputs at full matmul precision.
    with jax.default_matmul_precision("highest"):
        truth_fwd, truth_grad = layer_fns(impls["scan_vjp unroll 8"])
        x32, w32 = xs.astype(jnp.float32), w.astype(jnp.float32)
        reference = (truth_fwd(x32, w32), *truth_grad(x32, w32, ct)[1])
    rows = []
    for name, impl in impls.items():
        fwd, fwd_bwd = layer_fns(impl)
        row = {"impl": name, "shape": [t, d, b, h], "dtype": dtype.name}
        try:
            row["compile_fwd_s"], row["fwd_ms"] = timing.call_ms(
                lambda: jax.block_until_ready(fwd(xs, w)), _STEPS.value
            )
            row["compile_fwd_bwd_s"], row["fwd_bwd_ms"] = timing.call_ms(
                lambda: jax.block_until_ready(fwd_bwd(xs, w, ct)), _STEPS.value
            )
            ys, (_, (dxs, dw)) = fwd(xs, w), fwd_bwd(xs, w, ct)
            row.update(
                rel_err_ys=rel_err(ys, reference[0]),
                rel_err_dxs=rel_err(dxs, reference[1]),
                rel_err_dw=rel_err(dw, reference[2]),
                status="ok",
            )
        except Exception as e:  # a failing setting is reported, the others still run
            row.update(status="error", error=f"{type(e).__name__}: {e}"[:500])
        print(json.dumps(row), flush=True)
        rows.append(row)
    lines = ["| impl | fwd ms | fwd+bwd ms | compile s | rel err vs f32: ys / dxs / dW |", "|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['impl']} | error: {r['error'][:120]} | | | |")
            continue
        lines.append(
            f"| {r['impl']} | {r['fwd_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | {r['compile_fwd_bwd_s']:.1f} | "
            f"{r['rel_err_ys']:.1e} / {r['rel_err_dxs']:.1e} / {r['rel_err_dw']:.1e} |"
        )
    write_report(_OUT.value, "recurrence_kernel", rows, lines)


if __name__ == "__main__":
    from ds2_jax import cli

    cli.run(main)
