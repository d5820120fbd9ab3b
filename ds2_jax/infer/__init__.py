"""The inference wing: a trained model in, texts, word times and streams out.

    engine = infer.open_engine(model="model.onnx")      # or workdir=W [, step=..., decoder=...]
    texts = engine.transcribe([audio.read(path, engine.sample_rate)])
    utterance = engine.stream()                         # unidirectional models
    utterance.feed(chunk); utterance.finish(); utterance.words()

  engine.py        the Engine interface (windows, batching, decoding, word times, Utterance)
  jax_backend.py   a workdir's checkpoint, run by jax (streaming: streaming.py)
  onnx_backend.py  an exported file, run by onnxruntime (onnx_model.py: its metadata and featurizer)
  delay.py         the emission delay: measured, recorded per checkpoint
The audio comes through ds2_jax.audio (the project's one loader). The wall: nothing here imports
the input pipeline, the dataset builders, the trainer or the evaluation (tests/test_infer.py).
"""

from __future__ import annotations

from ds2_jax import settings


def open_engine(
    model: str | None = None,
    workdir: str | None = None,
    decoder: settings.Decoding | None = None,
    step: int | str | None = None,
    batch_size: int = 8,
    threads: int = 0,
    config: settings.Settings | None = None,
):
    """The engine of an exported `model` (onnxruntime, no jax) or of a `workdir`'s checkpoint `step`."""
    if (model is None) == (workdir is None):
        raise ValueError("give one of model (an exported ONNX file) or workdir (a training workdir)")
    if model is not None:
        from ds2_jax.infer.onnx_backend import OnnxEngine

        return OnnxEngine(model, decoder, batch_size, threads)
    from ds2_jax.infer.jax_backend import JaxEngine

    return JaxEngine(workdir, decoder, step=step, batch_size=batch_size, config=config)
