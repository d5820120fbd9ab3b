"""ds2-serve: an exported model or a workdir behind HTTP and a WebSocket (app.py), with a page at /.

    ds2-serve --model=model.onnx [--host=127.0.0.1 --port=8000]     # onnxruntime, no jax
    ds2-serve --workdir=W [--step=S|best]                           # the JAX checkpoint

Needs the `serve` extra (starlette, uvicorn, websockets, prometheus_client). The API: docs/serving.md.
"""
