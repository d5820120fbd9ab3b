"""Each conv of the model alone: strided (direct) against space-to-depth input.

    python -m benchmarks.conv_lowering --out=DIR [--steps=30] [--shape=16,800,161]

Seed shapes (batch 16, 800 frames, 161 bins, 32 channels, bfloat16). Times the forward
and the forward + backward (gradients of sum(y * cotangent) for the kernel, and for the
input from conv 2 on, as training takes them) as medians over `steps` calls, compile
apart, and gives the relative error of each lowering against the direct conv in float32.
Writes DIR/conv_lowering.json and .md.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
from absl import flags

from benchmarks import micro, timing
from ds2_jax import geometry, space_to_depth

_OUT = flags.DEFINE_string("out", None, "Output directory.", required=True)
_STEPS = flags.DEFINE_integer("steps", 30, "Timed calls per conv and lowering.")
_SHAPE = flags.DEFINE_list("shape", ["16", "800", "161"], "Batch, frames, bins.")
_CHANNELS = flags.DEFINE_integer("channels", 32, "Conv channels.")
_LAYERS = flags.DEFINE_integer("layers", 2, "Conv layers.")
_DTYPE = flags.DEFINE_string("dtype", "bfloat16", "Compute dtype.")

LOWERINGS = {"direct": jax.lax.conv_general_dilated, "space_to_depth": space_to_depth.conv}


def conv_fns(conv, spec: geometry.ConvSpec, input_grad: bool):
    """(forward, forward+backward) of one conv with the model's padding."""
    padding = [(p, p) for p in spec.padding]

    def apply(x, w):
        return conv(x, w, spec.strides, padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def loss(x, w, ct):
        return jnp.sum(apply(x, w).astype(jnp.float32) * ct)

    return jax.jit(apply), jax.jit(jax.value_and_grad(loss, argnums=(0, 1) if input_grad else 1))


def main(argv):
    del argv
    batch, frames, bins = (int(v) for v in _SHAPE.value)
    dtype = jnp.dtype(_DTYPE.value)
    key = jax.random.PRNGKey(0)
    in_shape, rows = (batch, frames, bins, 1), []
    for layer, spec in enumerate(geometry.conv_specs(_LAYERS.value)):
        key, kx, kw, kc = jax.random.split(key, 4)
        x = jax.random.normal(kx, in_shape).astype(dtype)
        w = (jax.random.normal(kw, spec.kernel + (in_shape[-1], _CHANNELS.value)) * 0.05).astype(dtype)
        direct, _ = conv_fns(jax.lax.conv_general_dilated, spec, False)
        out_shape = jax.eval_shape(direct, x, w).shape
        ct = jax.random.normal(kc, out_shape)
        with jax.default_matmul_precision("highest"):
            truth = direct(x.astype(jnp.float32), w.astype(jnp.float32))
        for name, conv in LOWERINGS.items():
            fwd, fwd_bwd = conv_fns(conv, spec, input_grad=layer > 0)
            row = {"conv": layer + 1, "lowering": name, "input": list(in_shape), "kernel": list(w.shape),
                   "strides": list(spec.strides), "dtype": dtype.name}
            row["compile_fwd_s"], row["fwd_ms"] = timing.call_ms(lambda: jax.block_until_ready(fwd(x, w)), _STEPS.value)
            row["compile_fwd_bwd_s"], row["fwd_bwd_ms"] = timing.call_ms(
                lambda: jax.block_until_ready(fwd_bwd(x, w, ct)), _STEPS.value)
            row["rel_err_y"] = micro.rel_err(fwd(x, w), truth)
            print(json.dumps(row), flush=True)
            rows.append(row)
        in_shape = out_shape
    lines = ["| conv | lowering | input | fwd ms | fwd+bwd ms | compile s | rel err y vs f32 |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['conv']} | {r['lowering']} | {'x'.join(map(str, r['input']))} | {r['fwd_ms']:.3f} | "
                     f"{r['fwd_bwd_ms']:.3f} | {r['compile_fwd_bwd_s']:.1f} | {r['rel_err_y']:.1e} |")
    micro.write_report(_OUT.value, "conv_lowering", rows, lines)


if __name__ == "__main__":
    from ds2_jax import cli

    cli.run(main)
