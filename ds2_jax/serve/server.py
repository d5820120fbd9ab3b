"""ds2-serve: an exported model (--model) or a training workdir's checkpoint (--workdir) served over
HTTP and a WebSocket on --host:--port (127.0.0.1 by default: only this machine reaches it).

    ds2-serve --model=model.onnx [--port=8000]
    ds2-serve --workdir=W [--step=best] [--host=127.0.0.1 --port=8000]

Then open http://127.0.0.1:8000/ (the page: microphone or a file), or
    curl --data-binary @a.flac 'http://127.0.0.1:8000/v1/transcribe?words=true'
Every size, count and time the server accepts is a flag (serve.limits); the API: docs/serving.md.
"""

from __future__ import annotations

import logging
import sys

from ds2_jax import settings
from ds2_jax.serve import limits as limits_lib


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_string("model", None, "An exported model (ds2-export): onnxruntime, no jax.", flag_values=fv)
    flags.DEFINE_string(
        "workdir", None, "A training workdir (its checkpoint runs with jax); or --model.", flag_values=fv
    )
    flags.DEFINE_string(
        "step", None, "With --workdir: a checkpoint step or 'best'; default the latest.", flag_values=fv
    )
    flags.DEFINE_string("host", "127.0.0.1", "Address to bind (127.0.0.1: this machine only).", flag_values=fv)
    flags.DEFINE_integer("port", 8000, "Port to listen on.", flag_values=fv)
    flags.DEFINE_integer("threads", 0, "With --model: onnxruntime's threads (0: all cores).", flag_values=fv)
    defaults = limits_lib.Limits()
    for name, help_text in limits_lib.HELP.items():
        value = getattr(defaults, name)
        define = flags.DEFINE_float if isinstance(value, float) else flags.DEFINE_integer
        define(name, value, f"{help_text} ({limits_lib.RANGES[name].text()})", flag_values=fv)


def load_engine(args):
    """The greedy engine of --model or --workdir."""
    from ds2_jax import cli
    from ds2_jax.infer import load

    step = cli.checkpoint_step(args.step, "--step")
    return load.open_engine(
        model=args.model,
        workdir=args.workdir,
        decoder=settings.Decoding(beam_width=0),
        step=step,
        batch_size=args.max_batch,
        threads=args.threads,
    )


def uvicorn_config(app, limits: limits_lib.Limits, host: str = "127.0.0.1", port: int = 8000, **overrides):
    """The uvicorn settings ds2-serve runs `app` under (tests/serving.py and benchmarks/serve_load.py
    run the same): HTTP parsed by httptools' C parser, not uvicorn's pure-Python h11 (the server's own
    CPU per upload: benchmarks/results/2026-12-06-cpu-serve), WebSocket messages bounded by `limits`.
    `overrides`: other uvicorn.Config arguments (logging; a benchmark's parser)."""
    import uvicorn

    chosen = {"http": "httptools", "ws_max_size": limits.max_message_bytes, "timeout_keep_alive": 5}
    return uvicorn.Config(app, host=host, port=port, **{**chosen, "log_level": "warning", **overrides})


def main(argv: list[str] | None = None) -> int:
    from ds2_jax import cli

    args, _ = cli.parse_args(argv, define_flags, __doc__)
    if (args.model is None) == (args.workdir is None):
        cli.usage_error("give one of --model (an exported ONNX file) or --workdir (a training workdir)")
    if args.model is not None and args.step is not None:
        cli.usage_error("--step reads a workdir's checkpoints; an exported --model holds one step")
    if not 0 <= args.port <= 65535:
        cli.usage_error(f"--port={args.port}: must be 0..65535")
    try:
        limits = limits_lib.checked(**{name: getattr(args, name) for name in limits_lib.HELP})
    except ValueError as e:
        cli.usage_error(str(e))
    try:
        import httptools  # noqa: F401
        import uvicorn

        from ds2_jax.serve import app as app_lib
    except ImportError as e:
        raise ImportError(f"ds2-serve needs the serve extra: pip install -e '.[serve]' ({e})") from e
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    engine = load_engine(args)
    app = app_lib.make_app(engine, limits)
    server = uvicorn.Server(uvicorn_config(app, limits, args.host, args.port))
    print(
        f"ds2-serve: step {engine.step} ({type(engine).__name__}, "
        f"{'bidirectional: streams re-decoded' if engine.bidirectional else 'streaming'}) on http://{args.host}:{args.port}/",
        file=sys.stderr,
        flush=True,
    )
    server.run()
    return 0
