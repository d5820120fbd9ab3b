"""open_engine: the engine of an exported model or of a workdir's checkpoint."""

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
