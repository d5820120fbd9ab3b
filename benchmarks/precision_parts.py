"""Where bfloat16 loses the training step: each part's error against float32, on real batches.

    python -m benchmarks.precision_parts --out=DIR [--config=configs/ds2_8gpu.py] [--batches=3] \
        [--rnn_impls=auto,scan_vjp] [--track_steps=0] [--track_points=6] [--data_dir=.demo/tfds] [--config.x=y]

The seed model (--config) on the bundled corpus (benchmarks.precision.on_bundled_corpus, with the
command line's --config.dataset.* overrides on top): the
same parameters and the same training batches run through the step in float32 (rnn_impl
scan_vjp, the reference) and in bfloat16 (each of --rnn_impls). For every part of the step it
reports the relative error ||bf16 - f32|| / ||f32|| (valid frames only; median over batches):

  forward   features, each conv block, each RNN layer's input projection, its batch norm and its
            recurrence (the states kept for the backward), the logits, log-softmax
  CTC       the per-utterance losses, d loss / d logits
  backward  each parameter's gradient (conv kernels, batch norms, projections, recurrent
            matrices, output layer) and the whole gradient
  reduce    the dtype the gradients reach the all-reduce in (float32: the psum adds no error)
  Adam      the first update from the fresh optimizer state, and the share of its signs that agree

A last column runs the float32 reference on the parameters rounded to bfloat16: the model's own
sensitivity to a change of that size, the floor no bfloat16 compute can go below.

--track_steps=N trains N steps of the --track_dtype run from the config's seed and measures
the whole gradient's bfloat16 error at --track_points states along the way: how the error
grows over steps (on a seed that diverges, the diverging run's own states), beside the floor.

Writes DIR/parts.json and DIR/NOTES.md (the tables).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import statistics
import sys

from absl import flags

from benchmarks import precision
from ds2_jax import cli, settings

FLAGS = flags.FLAGS
REFERENCE = ("float32", "scan_vjp")  # (model.dtype, model.rnn_impl) every run is compared with
# The yardstick: the reference run on the parameters rounded to bfloat16. Where a bfloat16 run's
# error is no larger, it is the model's own sensitivity to a bf16-sized change, not the compute.
FLOOR = ("float32", "scan_vjp, params rounded to bf16")


def define_flags() -> None:
    """The command line; defined only when run, so that tests can import this module."""
    cli.define_config_file("config", "configs/ds2_8gpu.py", "Model (dataset: the bundled corpus).")
    flags.DEFINE_string("out", None, "Output directory.", required=True)
    flags.DEFINE_integer("batches", 3, "Training batches measured (steps 0..N-1 of the seed's order).")
    flags.DEFINE_list("rnn_impls", ["auto", "scan_vjp"], "model.rnn_impl of each bfloat16 run.")
    flags.DEFINE_integer("track_steps", 0, "Train this many steps, measuring the error along the way (0: off).")
    flags.DEFINE_integer("track_points", 6, "States measured during --track_steps (the first at step 0).")
    flags.DEFINE_enum("track_dtype", "bfloat16", ["float32", "bfloat16"], "model.dtype of the tracked run.")
    flags.DEFINE_string("data_dir", "", "Prepared corpus (tfds data dir); '' = configs/demo.py's.")


def relative_error(value, reference, mask=None) -> float:
    """||value - reference|| / ||reference|| in float64, over the entries `mask` (<bool>[B, T],
    broadcast over trailing axes) keeps."""
    import numpy as np

    v, r = np.asarray(value, np.float64), np.asarray(reference, np.float64)
    if mask is not None:
        keep = np.broadcast_to(mask.reshape(mask.shape + (1,) * (r.ndim - mask.ndim)), r.shape)
        v, r = v[keep], r[keep]
    scale = np.linalg.norm(r)
    return float(np.linalg.norm(v - r) / scale) if scale > 0 else float(np.linalg.norm(v))


def module_output(calls):
    """A captured module's (first call's) output; of an (x, lengths) pair, x."""
    out = calls[0]
    return out[0] if isinstance(out, tuple) else out


def flat_paths(tree, prefix: str = "") -> dict:
    """A nested mapping -> {'a/b/c': leaf} (a tuple is a leaf)."""
    if not hasattr(tree, "items"):
        return {prefix: tree}
    out = {}
    for k, v in tree.items():
        out.update(flat_paths(v, f"{prefix}/{k}" if prefix else str(k)))
    return out


def with_run(config: settings.Settings, dtype: str, rnn_impl: str) -> settings.Settings:
    """`config` with model.dtype and model.rnn_impl set."""
    return settings.override(config, {"model.dtype": dtype, "model.rnn_impl": rnn_impl})


def step_kwargs(config: settings.Settings, dtype: str, rnn_impl: str) -> dict:
    """train.loss_gradients' static arguments for one (dtype, rnn_impl), on one device, no augmentation."""
    import dataclasses

    from ds2_jax import state as state_lib

    kwargs = state_lib.loss_arguments(state_lib.step_kwargs(with_run(config, dtype, rnn_impl)))
    # SpecAugment off: its masks are a draw, not a precision effect.
    return dict(kwargs, augment=dataclasses.replace(kwargs["augment"], freq_masks=0, time_masks=0), axis_name=None)


def measure_fn(kwargs):
    """A jitted (state, batch) -> {part: array}: the forward, part by part, the CTC and the gradients."""
    import jax
    import jax.numpy as jnp

    from ds2_jax import ctc, model, train

    def measure(state, batch):
        feats, frames = train.features_of(state, batch, kwargs["feature_cfg"])
        (logits, out_lengths), variables = model.DeepSpeech2(kwargs["model_cfg"]).apply(
            {"params": state.params, "batch_stats": state.batch_stats},
            feats,
            frames,
            train=True,
            mutable=["batch_stats", "intermediates"],
            capture_intermediates=True,
        )

        def mean_loss(lg):
            losses, ok = ctc.per_utterance_loss(
                lg, out_lengths, batch["labels"], batch["label_lengths"], kwargs["norm_by_times"], kwargs["ctc_impl"]
            )
            used = ok.astype(jnp.float32) * batch["weights"]
            return jnp.sum(losses * used) / jnp.maximum(jnp.sum(used), 1.0), losses

        d_logits, losses = jax.grad(mean_loss, has_aux=True)(logits)
        grads, _ = train.loss_gradients(state, batch, jax.random.PRNGKey(0), **kwargs)
        parts = {
            f"forward/{k.removesuffix('/__call__')}": module_output(v)
            for k, v in flat_paths(variables["intermediates"]).items()
            if k.endswith("/__call__")
        }
        parts.update(
            {
                "forward/features": feats,
                "forward/logits": logits,
                "forward/log_softmax": jax.nn.log_softmax(logits),
                "ctc/losses": losses,
                "ctc/d_logits": d_logits,
            }
        )
        parts.update({f"gradient/{k}": v for k, v in flat_paths(grads).items()})
        return parts, grads, frames, out_lengths

    return jax.jit(measure)


def time_masks(frames, out_lengths, input_steps: int, output_steps: int) -> dict:
    """{padded time steps: <bool>[B, T] valid frames} for the input and the output time axes."""
    import numpy as np

    return {
        t: np.arange(t)[None, :] < lengths[:, None]
        for t, lengths in ((input_steps, frames), (output_steps, out_lengths))
    }


def compare(parts, reference, masks: dict) -> dict[str, float]:
    """{part: relative error} of one run's parts against the reference's (host arrays); a
    forward part [B, T, ...] on the input or output time axis counts its valid frames only."""
    import numpy as np

    errors = {}
    for name, ref in reference.items():
        if name not in parts or np.shape(parts[name]) != np.shape(ref):
            continue
        batch_time = name.startswith("forward/") and ref.ndim >= 2
        mask = masks.get(ref.shape[1]) if batch_time else None
        errors[name] = relative_error(
            parts[name], ref, mask if mask is not None and mask.shape[0] == ref.shape[0] else None
        )
    return errors


def vector(tree):
    """A pytree's leaves as one float64 host vector."""
    import jax
    import numpy as np
    from jax.flatten_util import ravel_pytree

    return np.asarray(ravel_pytree(jax.device_get(tree))[0], np.float64)


def whole(tree_a, tree_b) -> float:
    """Relative error of a whole pytree (its leaves as one vector)."""
    return relative_error(vector(tree_a), vector(tree_b))


@functools.cache
def first_update(tx):
    """tx's update (grads, opt_state, params) -> updates, compiled once per optimizer (not op by op)."""
    import jax

    return jax.jit(lambda grads, opt_state, params: tx.update(grads, opt_state, params)[0])


def adam_update_errors(state, grads, reference_grads) -> dict[str, float]:
    """The first Adam update (state's optimizer) from `grads` against the one from `reference_grads`."""
    import numpy as np

    update = first_update(state.tx)
    a, b = (vector(update(g, state.opt_state, state.params)) for g in (grads, reference_grads))
    return {"adam/update": relative_error(a, b), "adam/sign_disagreement": float(np.mean(np.sign(a) != np.sign(b)))}


def setup(config, data_dir: str, overrides=None):
    """(the Settings of `config` (a ConfigDict) on the bundled corpus, with `overrides`' dataset.*
    values (precision.on_bundled_corpus), its training source, the seed's initial state)."""
    import jax

    from ds2_jax import state as state_lib
    from ds2_jax.pipeline.batch import Sharding
    from ds2_jax.pipeline.source import make_source

    config = settings.from_config_dict(precision.on_bundled_corpus(config, 1, 1, 1, data_dir, overrides))
    source = make_source(config, Sharding(global_batch=config.per_device_batch_size))
    init_rng, _ = jax.random.split(jax.random.PRNGKey(config.seed))
    return config, source, state_lib.initial_state(config, source, init_rng)


def device_batch(source, step: int) -> dict:
    import jax

    return jax.device_put(source.train_batch(step))


def rounded_params(state):
    """`state` with its parameters rounded to bfloat16 (and kept in their dtype): the floor's input."""
    import jax

    return state.replace(params=jax.tree_util.tree_map(lambda p: p.astype("bfloat16").astype(p.dtype), state.params))


def measure_parts(config, source, state, runs: list[tuple[str, str]], batches: int) -> dict:
    """{run name: {part: median relative error over `batches` batches}} against REFERENCE."""
    import jax
    import numpy as np

    fns = {run: measure_fn(step_kwargs(config, *run)) for run in [REFERENCE, *runs]}
    per_batch: dict[str, list[dict]] = {f"{d} {i}": [] for d, i in [*runs, FLOOR]}
    rounded = rounded_params(state)
    for step in range(batches):
        batch = device_batch(source, step)
        ref_parts, ref_grads, frames, out_lengths = fns[REFERENCE](state, batch)
        ref_parts = {k: np.asarray(v, np.float32) for k, v in ref_parts.items()}
        masks = time_masks(
            np.asarray(frames),
            np.asarray(out_lengths),
            ref_parts["forward/features"].shape[1],
            ref_parts["forward/logits"].shape[1],
        )
        for run in [*runs, FLOOR]:
            parts, grads, _, _ = fns[REFERENCE](rounded, batch) if run == FLOOR else fns[run](state, batch)
            errors = compare({k: np.asarray(v, np.float32) for k, v in parts.items()}, ref_parts, masks)
            errors["gradient (whole)"] = whole(grads, ref_grads)
            errors.update(adam_update_errors(state, grads, ref_grads))
            errors["reduce/gradient dtype is float32"] = float(
                all(x.dtype == np.float32 for x in jax.tree_util.tree_leaves(grads))
            )
            per_batch[f"{run[0]} {run[1]}"].append(errors)
    return {name: {k: statistics.median(e[k] for e in rows) for k in rows[0]} for name, rows in per_batch.items()}


def track(config, source, state, steps: int, points: int, dtype: str, runs: list[tuple[str, str]]) -> list[dict]:
    """Trains `steps` steps in `dtype` (rnn_impl of the first run of that dtype, else the reference's)
    and at `points` states measures each run's whole-gradient error against REFERENCE."""
    import jax
    import numpy as np

    from ds2_jax import state as state_lib
    from ds2_jax import train

    impl = next((i for d, i in runs if d == dtype), REFERENCE[1])
    train_kwargs = state_lib.step_kwargs(with_run(config, dtype, impl))
    step_fn = jax.jit(functools.partial(train.train_step, **train_kwargs, axis_name=None))
    grad_fns = {
        run: jax.jit(functools.partial(train.loss_gradients, **step_kwargs(config, *run))) for run in [REFERENCE, *runs]
    }
    at = sorted({round(i * steps / max(points - 1, 1)) for i in range(points)})
    rng, rows = jax.random.PRNGKey(config.seed), []
    for step in range(steps + 1):
        batch = device_batch(source, step)
        if step in at:
            ref, _ = grad_fns[REFERENCE](state, batch, rng)
            row = {"step": step}
            for run in runs:
                grads, _ = grad_fns[run](state, batch, rng)
                row[f"{run[0]} {run[1]}"] = whole(grads, ref)
            row[f"{FLOOR[0]} {FLOOR[1]}"] = whole(grad_fns[REFERENCE](rounded_params(state), batch, rng)[0], ref)
            rows.append(row)
        if step == steps:
            break
        state, m = step_fn(state, batch, rng)
        if step in at:
            rows[-1]["train_loss"] = float(np.asarray(m["loss_sum"]) / max(float(np.asarray(m["loss_count"])), 1.0))
    return rows


def notes(result: dict) -> str:
    """The tables of parts.json as Markdown."""
    names = list(result["parts"])
    lines = [
        "# Where bfloat16 loses the training step: relative error against float32 (scan_vjp)",
        "",
        *(f"- {k}: {v}" for k, v in result["meta"].items()),
        "",
        "Relative error ||bf16 - f32|| / ||f32|| over valid frames, median over the batches.",
        "",
        "| part | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for part in result["parts"][names[0]]:
        lines.append(
            f"| {part} | " + " | ".join(f"{result['parts'][n].get(part, float('nan')):.2e}" for n in names) + " |"
        )
    if result.get("track"):
        cols = [k for k in result["track"][0] if k not in ("step", "train_loss")]
        lines += [
            "",
            f"Whole-gradient error along a {result['meta']['tracked run']} run:",
            "",
            "| step | train loss | " + " | ".join(cols) + " |",
            "|---:|---:|" + "---:|" * len(cols),
        ]
        for row in result["track"]:
            loss = f"{row['train_loss']:.3f}" if "train_loss" in row else "-"
            lines.append(f"| {row['step']} | {loss} | " + " | ".join(f"{row[c]:.2e}" for c in cols) + " |")
    return "\n".join(lines) + "\n"


def main(argv) -> None:
    del argv  # cli.run refuses positional arguments
    import jax

    from ds2_jax import files

    runs = [("bfloat16", impl) for impl in FLAGS.rnn_impls]
    config, source, state = setup(FLAGS.config, FLAGS.data_dir, precision.command_line_overrides())
    m = config.model
    result = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m benchmarks.precision_parts " + " ".join(sys.argv[1:]),
            "device": f"{jax.devices()[0].device_kind} ({jax.default_backend()})",
            "model": f"{m.num_conv_layers} conv x {m.conv_channels} ch, {m.num_rnn_layers} x {m.rnn_size} {m.rnn_cell}",
            "batches": f"{FLAGS.batches} training batches of {config.per_device_batch_size} (bundled corpus), "
            "seed {config.seed}",
            "tracked run": f"{FLAGS.track_dtype}, {FLAGS.track_steps} steps" if FLAGS.track_steps else "none",
        }
    }
    os.makedirs(FLAGS.out, exist_ok=True)
    result["parts"] = measure_parts(config, source, state, runs, FLAGS.batches)
    if FLAGS.track_steps:
        result["track"] = track(config, source, state, FLAGS.track_steps, FLAGS.track_points, FLAGS.track_dtype, runs)
    files.write_text(os.path.join(FLAGS.out, "parts.json"), json.dumps(result, indent=1))
    files.write_text(os.path.join(FLAGS.out, "NOTES.md"), notes(result))
    print(notes(result))


if __name__ == "__main__":
    define_flags()
    cli.run(main)
