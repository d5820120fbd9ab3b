"""The inference wing: a trained model in, texts, word times and streams out.

    engine = open_engine(model="model.onnx")      # ds2_jax.infer.load; or workdir=W [, step=..., decoder=...]
    texts = engine.transcribe([audio.read(path, engine.sample_rate)])
    utterance = engine.stream()                         # bidirectional models: re-decoded partials
    utterance.feed(chunk); utterance.finish(); utterance.words()

  load.py          open_engine: the backend of a model file or a workdir
  engine.py        the Engine interface (windows, batching, decoding, word times, the streams)
  jax_backend.py   a workdir's checkpoint, run by jax (streaming: streaming.py)
  onnx_backend.py  an exported file, run by onnxruntime (onnx_model.py: its metadata and featurizer)
  delay.py         the emission delay: measured, recorded per checkpoint
The audio comes through ds2_jax.audio (the project's one loader). The wall: nothing here imports
the input pipeline, the dataset builders, the trainer or the evaluation (tests/test_infer.py).
"""
