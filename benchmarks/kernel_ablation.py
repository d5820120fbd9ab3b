"""Where one step of the persistent RNN kernel goes: the forward kernel with parts removed.

    python -m benchmarks.kernel_ablation --out=DIR [--steps=50] [--shape=267,16,2048]

Meant for the GPU (elsewhere the kernel runs in interpret mode, one program per
direction); the results are wrong on purpose (timing, not numerics). Each case re-traces
the forward kernel of one layer (default: the seed's 267 frames, batch 16, 2 x 2048,
bfloat16) with some of its pieces replaced at trace time:
  no spin      - waiting on the barrier returns at once (programs still publish),
  no atomics   - no publish either (no grid-wide barrier at all),
  no product   - the matmul becomes a row sum of the loaded state (keeps the load),
  no load      - ... or zeros (the previous state is not read at all).
Writes DIR/kernel_ablation.json and .md: median ms per call and us per time step.
"""

from __future__ import annotations

import json
import types

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from jax.experimental.pallas import triton as plt

from benchmarks import micro, timing
from ds2_jax.kernels import triton_rnn

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command line; defined only when run, so that tests can import this module."""
    flags.DEFINE_string("out", None, "Output directory.", required=True)
    flags.DEFINE_integer("steps", 50, "Timed calls per case.")
    flags.DEFINE_list("shape", ["267", "16", "2048"], "T, batch, hidden (two directions).")


CASES = {
    "full kernel": {},
    "no spin (publish only)": dict(no_spin=True),
    "no barrier (no atomics, no spin)": dict(no_spin=True, no_atomics=True),
    "no product (load + row sum)": dict(no_product=True),
    "no product, no load": dict(no_product=True, keep_load=False),
    "no barrier, no product (load + row sum)": dict(no_spin=True, no_atomics=True, no_product=True),
    "no barrier, no product, no load": dict(no_spin=True, no_atomics=True, no_product=True, keep_load=False),
}


def _namespace(module, **overrides):
    names = {k: getattr(module, k) for k in dir(module) if not k.startswith("__")}
    return types.SimpleNamespace(**{**names, **overrides})


def _row_sum_product(keep_load: bool):
    def dot(a, b, dims, **unused):
        out = jnp.zeros((a.shape[0], b.shape[1]), jnp.float32)
        return out + jnp.sum(a.astype(jnp.float32), axis=1, keepdims=True) * 0.0 if keep_load else out
    return dot


def ablated_modules(no_spin=False, no_atomics=False, no_product=False, keep_load=True):
    """(jax, plt) stand-ins for the kernel module with the chosen pieces removed."""
    lax = {}
    if no_spin:
        lax["while_loop"] = lambda cond, body, init: init
    if no_product:
        lax["dot_general"] = _row_sum_product(keep_load)
    fake_jax = _namespace(jax, lax=_namespace(jax.lax, **lax))
    fake_plt = _namespace(plt, **({"atomic_add": lambda *a, **k: jnp.int32(1 << 30)} if no_atomics else {}))
    return fake_jax, fake_plt


def main(argv):
    del argv
    t, b, h = (int(v) for v in FLAGS.shape)
    xs = (jax.random.normal(jax.random.PRNGKey(0), (b, t, 1, h)) * 2).astype(jnp.bfloat16)
    w = (jax.random.normal(jax.random.PRNGKey(1), (2, h, h)) / np.sqrt(h)).astype(jnp.bfloat16)
    real = triton_rnn.jax, triton_rnn.plt
    rows = []
    for name, removed in CASES.items():
        triton_rnn.jax, triton_rnn.plt = ablated_modules(**removed)
        try:
            fwd = jax.jit(lambda x, r: triton_rnn.persistent_simple_rnn(x, r))
            _, ms = timing.call_ms(lambda: jax.block_until_ready(fwd(xs, w)), FLAGS.steps)
            row = {"case": name, "fwd_ms": round(ms, 3), "us_per_step": round(ms * 1e3 / xs.shape[1], 2)}
        finally:
            triton_rnn.jax, triton_rnn.plt = real
        print(json.dumps(row), flush=True)
        rows.append(row)
    lines = ["| case | forward ms | us per time step |", "|---|---|---|"]
    lines += [f"| {r['case']} | {r['fwd_ms']:.2f} | {r['us_per_step']:.2f} |" for r in rows]
    micro.write_report(FLAGS.out, "kernel_ablation", rows, lines)


if __name__ == "__main__":
    define_flags()
    from ds2_jax import cli

    cli.run(main)
