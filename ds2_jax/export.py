"""A trained workdir -> one ONNX file that onnxruntime runs without jax or ds2_jax's model code:

    python -m ds2_jax.export --workdir=W [--step=S|best] --out=model.onnx

The graph maps the log spectrogram to log-probabilities; the spectrogram itself is computed
outside it, by infer.onnx_model.log_spectrogram (numpy, constants in the metadata), because jax2onnx
0.17 converts neither the featurizer's rfft (its DFT node is one onnxruntime rejects) nor the
framing's slices of a symbolic length:
  inputs   spectrogram <float32>[batch, frames, bins] (unnormalized, as features.log_spectrogram),
           frames <int32>[batch] valid frames
  outputs  log_probs <float32>[batch, out_frames, vocab] (blank first), lengths <int32>[batch]
Batch and frames are dynamic. Inside: the normalization by the checkpoint's feature statistics,
then the model in inference mode (batch-norm running statistics, float32, the reference
recurrence lax.scan as an ONNX Loop, direct convs). The file's metadata (`metadata`) holds what a
runner needs: the alphabet, sample rate, hop, window, eps, output frame seconds, lookahead and the
emission delay ('unmeasured' where it could not be: see --delay_audio); ds2_jax.infer.onnx_model
reads it, and `python -m ds2_jax.transcribe --model=model.onnx` runs it.

Beside it, `stablehlo_path(out)` (model.stablehlo) holds the whole of it, featurizer included, as
a jax.export artifact: audio <int16>[batch, samples >= window], audio_lengths <int32>[batch] ->
(log_probs, lengths); `jax.export.deserialize(open(p, "rb").read()).call(audio, lengths)` runs it
with jax (no ds2_jax), on CPU or GPU.
Needs the `export` extra (jax2onnx, onnx, onnxruntime).
"""

from __future__ import annotations

import dataclasses
import os
import sys

from ds2_jax import errors, settings
from ds2_jax.infer import onnx_model

OPSET = 21  # onnxruntime >= 1.20 runs it; jax2onnx's default (23) needs a newer runtime than many have


def metadata(config: settings.Settings, step: int, emission_delay_s: float | None = None) -> dict[str, str]:
    """The ds2_jax keys of the ONNX file's metadata (onnx_model.MetaData spells them, and reads them
    back); `emission_delay_s`: the model's, for word timings (infer.delay), None where unmeasured."""
    return onnx_model.MetaData.of_config(config, step, emission_delay_s).props()


def inference_function(config: settings.Settings, state):
    """f(spectrogram, frames) -> (log_probs, lengths) of the restored `state`, as exported: the
    normalization by the state's feature statistics, then the model."""
    import jax

    from ds2_jax import features, model

    cfg = inference_model_config(config)
    net = model.DeepSpeech2(cfg)
    variables = {"params": state.params, "batch_stats": state.batch_stats}

    def log_probs(spectrogram, frames):
        feats = features.normalize(spectrogram, frames, state.feature_mean, state.feature_std)
        logits, lengths = net.apply(variables, feats, frames, train=False)
        return jax.nn.log_softmax(logits, axis=-1), lengths

    return log_probs


def inference_model_config(config: settings.Settings):
    """The model as exported: float32, the reference recurrence and convs (the kernels are not
    portable), batch norm per device (inference reads its running statistics)."""
    from ds2_jax import model

    return dataclasses.replace(
        model.ModelConfig.of(config.model, num_bins=config.features.num_bins),
        rnn_impl="scan",
        conv_impl="direct",
        dtype="float32",
        sync_batch_norm=False,
    )


def stablehlo_path(out: str) -> str:
    """Where the jax.export artifact of the ONNX file `out` goes: model.onnx -> model.stablehlo."""
    return os.path.splitext(out)[0] + ".stablehlo"


def export_stablehlo(config: settings.Settings, state, out: str) -> None:
    """Writes the jax.export (StableHLO) artifact of audio -> log-probs (the featurizer inside) to `out`."""
    import jax
    import jax.numpy as jnp

    from ds2_jax import files, forward

    fc = config.features.spectrogram
    cfg = inference_model_config(config)

    def log_probs(audio, audio_lengths):
        logits, lengths = forward.forward(state, audio, audio_lengths, model_cfg=cfg, feature_cfg=fc)
        return jax.nn.log_softmax(logits, axis=-1), lengths

    batch, samples = jax.export.symbolic_shape("batch, samples", constraints=[f"samples >= {fc.window}"])
    exported = jax.export.export(jax.jit(log_probs), platforms=("cpu", "cuda"))(
        jax.ShapeDtypeStruct((batch, samples), jnp.int16), jax.ShapeDtypeStruct((batch,), jnp.int32)
    )
    with files.replacing(out, "wb") as f:
        f.write(exported.serialize())


def export_onnx(config: settings.Settings, state, step: int, out: str, emission_delay_s: float | None) -> None:
    """Writes the ONNX model of `state` to `out` (atomically: a reader never sees half a file)."""
    import logging

    import jax
    import jax.numpy as jnp
    import onnx
    from jax2onnx import to_onnx

    logging.getLogger("onnx_ir").setLevel(logging.ERROR)  # a warning per shape constant it leaves untyped
    from ds2_jax import files

    bins = config.features.num_bins
    inputs = [jax.ShapeDtypeStruct(("batch", "frames", bins), jnp.float32), jax.ShapeDtypeStruct(("batch",), jnp.int32)]
    proto = to_onnx(
        inference_function(config, state),
        inputs,
        model_name="ds2_jax",
        opset=OPSET,
        input_names=list(onnx_model.INPUTS),
        output_names=list(onnx_model.OUTPUTS),
    )
    for key, value in metadata(config, step, emission_delay_s).items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    with files.replacing(out, "wb") as f:
        f.write(proto.SerializeToString())
    onnx.checker.check_model(out)


def emission_delay(
    workdir: str, config: settings.Settings, restored, step: int, delay_audio: list[str]
) -> tuple[float | None, str]:
    """(the checkpoint's emission delay for word timings, or None; where it came from): measured on
    `delay_audio` (files with a lead-in of silence; recorded in the workdir), else the one recorded
    for this step (by training's evals, or transcribe --timestamps, on the eval split), else None."""
    from ds2_jax import audio, layout
    from ds2_jax.infer import delay, jax_backend

    if delay_audio:
        greedy = jax_backend.JaxEngine(
            workdir, settings.Decoding(beam_width=0), config=config, restored=(restored, step)
        )
        waves = [audio.read(p, greedy.sample_rate) for p in delay_audio]
        value, count = delay.emission_delay(greedy, waves)
        if not count:
            return None, f"none of the {len(waves)} --delay_audio files gave a word after a lead-in of silence"
        delay.record(workdir, step, value, count, "--delay_audio")
        return value, f"measured on {count} of the {len(waves)} --delay_audio files"
    known = delay.recorded(workdir, step)
    if known is not None:
        return known, f"recorded in {layout.TIMING}"
    return None, (
        f"no --delay_audio given and none recorded for step {step} in {layout.TIMING} "
        "(an eval during training records it; transcribe --workdir --timestamps measures it on the eval split)"
    )


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_string(
        "workdir", None, "A training workdir (config.json + checkpoints/).", required=True, flag_values=fv
    )
    flags.DEFINE_string(
        "step",
        None,
        "Checkpoint step, or 'best' (the lowest in-training eval WER); default: the latest.",
        flag_values=fv,
    )
    flags.DEFINE_string("out", None, "The ONNX file to write.", required=True, flag_values=fv)
    flags.DEFINE_boolean("ema_weights", True, settings.EMA_FLAG_HELP, flag_values=fv)
    flags.DEFINE_list(
        "delay_audio",
        [],
        "Audio files (comma-separated) whose speech starts after some silence: the model's emission "
        "delay for word timings is measured on them (infer.delay). Without them, the delay recorded for "
        "the step in the workdir's timing.json; where there is none, the file says 'unmeasured'.",
        flag_values=fv,
    )


def main(argv: list[str] | None = None) -> int:
    from ds2_jax import cli

    args, _ = cli.parse_args(argv, define_flags, __doc__)
    step = cli.checkpoint_step(args.step, "--step")
    try:
        import jax2onnx  # noqa: F401
    except ImportError as e:
        raise ImportError(f"export needs the export extra: pip install -e '.[export]' ({e})") from e
    from absl import logging as absl_logging

    from ds2_jax import state, workdir_config

    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax's restore chatter
    config = settings.choosing_weights(workdir_config.load_config(args.workdir), args.ema_weights)
    restored, step = state.restore_state(config, args.workdir, step)
    delay, source = emission_delay(args.workdir, config, restored, step, args.delay_audio)
    if delay is None:
        print(
            f"warning: the emission delay is unmeasured ({source}): word times of this export will be "
            "uncorrected; give --delay_audio=<files with silence before the speech>",
            file=sys.stderr,
            flush=True,
        )
    else:
        print(f"emission delay {delay:.3f} s ({source})", file=sys.stderr, flush=True)
    export_onnx(config, restored, step, args.out, delay)
    export_stablehlo(config, restored, stablehlo_path(args.out))
    print(
        f"wrote {args.out}: step {step} of {os.path.abspath(args.workdir)}, "
        f"{os.path.getsize(args.out) / 1e6:.1f} MB, and its jax.export artifact {stablehlo_path(args.out)}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
