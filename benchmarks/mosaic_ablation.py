"""Where one step of the Mosaic GPU recurrence goes.

    python -m benchmarks.mosaic_ablation --out=DIR [--steps=50] [--shape=267,16,2048]

Hopper GPUs only. One seed layer (267 frames, batch 16, 2 x 2048, bfloat16, shared input
projection): the kernel's forward and forward + backward times and the relative error of its
outputs and gradients against a float32 scan_vjp. The ablation cases replace pieces of the
kernel at trace time and are wrong on purpose (timing, not numerics):
  no poll    - the grid-wide wait returns at once (states race; CTAs still publish),
  no product - the tensor-core product is skipped (the state is still loaded).
Writes DIR/mosaic_ablation.json and .md: median ms per call and us per time step.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from jax.experimental.pallas import mosaic_gpu as plgpu

from benchmarks import micro, timing
from ds2_jax.kernels import mosaic_rnn
from ds2_jax.rnn.reference import scan_vjp_recurrence

_OUT = flags.DEFINE_string("out", None, "Output directory.", required=True)
_STEPS = flags.DEFINE_integer("steps", 50, "Timed calls per case.")
_SHAPE = flags.DEFINE_list("shape", ["267", "16", "2048"], "T, batch (16), hidden (two directions).")


def _skip_product(acc_ref, eye_smem, in_smem, in_bar, w_smem, h_smem, h_bar, with_state):
    plgpu.barrier_wait(in_bar)
    if with_state:
        plgpu.barrier_wait(h_bar)
    return jnp.zeros(acc_ref.shape, jnp.float32)


ABLATIONS = {"no poll (races)": {"_wait_for": lambda sem, target: None}, "no product": {"_product": _skip_product}}


def _time(impl, xs, w, ct, reference) -> dict:
    fwd, grad = micro.layer_fns(impl)
    _, fwd_ms = timing.call_ms(lambda: jax.block_until_ready(fwd(xs, w)), _STEPS.value)
    compile_s, grad_ms = timing.call_ms(lambda: jax.block_until_ready(grad(xs, w, ct)), _STEPS.value)
    row = {"fwd_ms": round(fwd_ms, 3), "fwd_bwd_ms": round(grad_ms, 3), "first_call_s": round(compile_s, 1),
           "us_per_step_fwd": round(fwd_ms * 1e3 / xs.shape[1], 2)}
    if reference is not None:
        (_, (dx, dw)), (_, (rdx, rdw)) = grad(xs, w, ct), reference[:2]
        row.update(err_y=micro.rel_err(fwd(xs, w), reference[2]), err_dx=micro.rel_err(dx, rdx),
                   err_dw=micro.rel_err(dw, rdw))
    return row


def main(argv):
    del argv
    t, b, h = (int(v) for v in _SHAPE.value)
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    xs = (jax.random.normal(k1, (b, t, 1, h)) * 2.0).astype(jnp.bfloat16)
    w = (jax.random.normal(k2, (2, h, h)) / np.sqrt(h)).astype(jnp.bfloat16)
    ct = jax.random.normal(k3, (b, t, 2, h))
    with jax.default_matmul_precision("highest"):
        f32 = lambda x, r: scan_vjp_recurrence(x, r, "simple", 8)  # noqa: E731
        ref_fwd, ref_grad = micro.layer_fns(f32)
        args = (xs.astype(jnp.float32), w.astype(jnp.float32))
        reference = (*ref_grad(*args, ct), ref_fwd(*args))
    rows = []
    for name, patch in [("kernel", {}), *ABLATIONS.items()]:
        real = {k: getattr(mosaic_rnn, k) for k in patch}
        for k, v in patch.items():
            setattr(mosaic_rnn, k, v)
        try:
            row = {"case": name, **_time(lambda x, r: mosaic_rnn.mosaic_simple_rnn(x, r), xs, w, ct,
                                        None if patch else reference)}
        except Exception as e:  # a case that fails to build is recorded, the others still run
            row = {"case": name, "error": f"{type(e).__name__}: {e}"[:600]}
        finally:
            for k, v in real.items():
                setattr(mosaic_rnn, k, v)
        print(json.dumps(row), flush=True)
        rows.append(row)
    lines = ["| case | forward ms | us per step | fwd + bwd ms | rel. err y / dx / dW |", "|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | - | - | - | {r['error'][:100]} |")
            continue
        err = " / ".join(f"{r[k]:.1e}" for k in ("err_y", "err_dx", "err_dw")) if "err_y" in r else "(ablation)"
        lines.append(f"| {r['case']} | {r['fwd_ms']:.3f} | {r['us_per_step_fwd']:.2f} | {r['fwd_bwd_ms']:.3f} | {err} |")
    micro.write_report(_OUT.value, "mosaic_ablation", rows, lines)


if __name__ == "__main__":
    from ds2_jax import cli

    cli.run(main)
