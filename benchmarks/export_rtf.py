"""RTFx (audio seconds transcribed per wall-clock second) of transcription's paths, each run as
`ds2-transcribe` runs over a folder: the JAX engine of a workdir on jax's default backend (the GPU on
a GPU host) and the onnxruntime engine of its export (ds2_jax.export) on the host's CPUs, each greedy
and with beam search + an ARPA word LM (flashlight-text, the `lm` extra).

    python -m benchmarks.export_rtf --workdir=W [--model=model.onnx] [--lm=lm.arpa --beam_width=32] \\
        [--threads=0] [--batch_size=8] [--repeats=5] --out=DIR FILES...

A pass is transcribe's loop over FILES (ds2_jax.transcribe: batches of --batch_size files, each read,
run through the engine, decoded and printed, here into a buffer), timed from the first read to the
last line; a warm-up pass first (the JAX path compiles in it: `first_pass_s`), then --repeats passes:
RTFx = audio seconds / the median pass. Files named twice count twice. Without --model the ONNX rows
are left out, without --lm the beam rows (the output says so). `read` is the files' decoding alone
(ds2_jax.audio), the ceiling of every path.

--threads: onnxruntime's intra-op threads (0: every core); 1 also pins XLA's CPU client to one thread
(set before jax is imported). Writes DIR/results.json and DIR/results.md (the table, also printed):
the JAX device (jax.devices()[0].device_kind), the CPU model (/proc/cpuinfo), the thread counts.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import platform
import statistics
import sys
import time

from benchmarks import timing

PATHS = ("jax_greedy", "jax_beam_lm", "onnx_greedy", "onnx_beam_lm")


def cpu_model() -> str:
    """The host CPU's model name (/proc/cpuinfo), else what platform knows."""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def transcribe_pass(engine, files: list[str], batch_size: int) -> list[str]:
    """Each file's text, by transcribe's own loop (ds2_jax.transcribe.main without --stream): its
    lines go to a buffer; a file that fails stops the measurement, naming how many failed."""
    from ds2_jax import transcribe

    out, done, failed = io.StringIO(), [0], 0
    with contextlib.redirect_stdout(out):
        for first in range(0, len(files), batch_size):
            failed += transcribe._transcribe_batch(engine, files[first : first + batch_size], done)
    if failed:
        raise RuntimeError(f"{failed} of {len(files)} files failed (their errors are above): fix or drop them")
    return [line.split("\t", 1)[1] for line in out.getvalue().splitlines()]


def timed(run, repeats: int) -> dict:
    """run() once to warm up, then `repeats` times (benchmarks.timing.measure): the seconds of each, and
    the last result."""
    results = []
    out = timing.measure(lambda _: results.append(run()), warmup=1, steps=repeats)
    seconds = out["step_times_s"]
    return {
        "first_pass_s": out["first_step_s"],
        "pass_s": seconds,
        "median_s": statistics.median(seconds),
        "result": results[-1],
    }


def row(path: str, engine: str, runs_on: str, decoder, threads, load_s: float, t: dict, audio_s: float) -> dict:
    """One path's entry of results.json: RTFx = audio seconds / the median timed pass."""
    return {
        "path": path,
        "engine": engine,
        "runs_on": runs_on,
        "decoder": decoder,
        "threads": threads,
        "rtfx": audio_s / t["median_s"],
        "median_s": t["median_s"],
        "pass_s": t["pass_s"],
        "first_pass_s": t["first_pass_s"],
        "load_s": load_s,
    }


def measure(path: str, open_engine, runs_on: str, threads, files: list[str], fv, audio_s: float):
    """(row, texts) of the engine open_engine() builds (its load timed), over `files` as transcribe runs."""
    start = time.perf_counter()
    engine = open_engine()
    load_s = time.perf_counter() - start
    t = timed(lambda: transcribe_pass(engine, files, fv.batch_size), fv.repeats)
    decoder = engine.beam.describe() if engine.beam is not None else "greedy"  # what the engine was built with
    return row(path, type(engine).__name__, runs_on, decoder, threads, load_s, t, audio_s), t["result"]


def agreement(a: list[str], b: list[str]) -> str:
    return f"{sum(x == y for x, y in zip(a, b))}/{len(a)}"


def markdown(result: dict) -> str:
    h = result["host"]
    lines = [
        f"{result['files']} files ({result['distinct_files']} distinct), {result['audio_seconds']:.2f} s of audio, "
        f"batches of {result['batch_size']} files, median of {result['repeats']} passes after a warm-up.",
        f"JAX: backend {h['jax_backend']}, {h['jax_device']} (jax {h['jax_version']}); host CPU: {h['cpu_model']}, "
        f"{h['cpus_usable']} usable of {h['cpu_count']}; "
        + (
            f"onnxruntime {h['onnxruntime_version']}, {h['onnx_threads']} intra-op threads; "
            if h["onnx_threads"]
            else ""
        )
        + f"load average {h['load_average']:.2f}.",
        "",
        "| path | runs on | decoding | threads | RTFx | median s | first pass s | load s |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        d = r["decoder"]
        dec = d if isinstance(d, str) else f"beam {d['beam_width']}, LM {os.path.basename(d['lm'])}"
        lines.append(
            f"| {r['path']} | {r['runs_on']} | {dec} | {r['threads']} | {r['rtfx']:.1f} | {r['median_s']:.3f} "
            f"| {r['first_pass_s']:.3f} | {r['load_s']:.2f} |"
        )
    lines.append("")
    lines += [f"JAX and ONNX texts equal ({k}): {v}" for k, v in result["same_texts"].items()]
    lines += [f"left out: {why}" for why in result["left_out"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from absl import flags

    fv = flags.FlagValues()
    flags.DEFINE_string("workdir", None, "Training workdir.", required=True, flag_values=fv)
    flags.DEFINE_string("model", None, "Its export (ds2_jax.export); none: no ONNX rows.", flag_values=fv)
    flags.DEFINE_string("lm", "", "ARPA word LM (ds2_jax.tools.build_lm); '': no beam rows.", flag_values=fv)
    flags.DEFINE_integer("beam_width", 32, "Beam width of the beam + LM rows.", flag_values=fv)
    flags.DEFINE_integer("threads", 0, "onnxruntime's threads (0: all cores); 1 pins XLA:CPU too.", flag_values=fv)
    flags.DEFINE_integer("batch_size", 8, "Files per forward pass (transcribe's --batch_size).", flag_values=fv)
    flags.DEFINE_integer("repeats", 5, "Timed passes per path.", flag_values=fv)
    flags.DEFINE_string("out", None, "Folder for results.json and results.md.", required=True, flag_values=fv)
    files = fv([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])[1:]
    if not files:
        raise SystemExit("give the audio files to transcribe after the flags")
    if fv.repeats < 1 or fv.batch_size < 1 or fv.threads < 0 or fv.beam_width < 1:
        raise SystemExit("--repeats, --batch_size and --beam_width must be >= 1, --threads >= 0")
    if fv.threads == 1:  # before jax is imported
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        ).strip()
    import jax

    from ds2_jax import audio as audio_lib
    from ds2_jax import settings, workdir_config
    from ds2_jax.infer import jax_backend

    config = settings.choosing_weights(workdir_config.load_config(fv.workdir), True)  # as transcribe (EMA on)
    rate = config.features.sample_rate
    read = timed(lambda: [audio_lib.read(f, rate) for f in files], fv.repeats)  # a bad file fails here, named
    audio_s = sum(map(len, read["result"])) / rate
    decoders = {"greedy": settings.Decoding(beam_width=0)}
    if fv.lm:
        decoders["beam_lm"] = settings.Decoding(beam_width=fv.beam_width, lm_path=fv.lm)
    backend, device = jax.default_backend(), jax.devices()[0].device_kind
    cpus = usable_cpus()
    threads = fv.threads or cpus
    result = {
        "command": ["python", "-m", "benchmarks.export_rtf", *(sys.argv[1:] if argv is None else argv)],
        "host": {
            "jax_backend": backend,
            "jax_device": device,
            "jax_device_count": jax.device_count(),
            "jax_version": jax.__version__,
            "cpu_model": cpu_model(),
            "cpu_count": os.cpu_count(),
            "cpus_usable": cpus,
            "onnx_threads": threads if fv.model else None,
            "onnxruntime_version": None,
            "load_average": os.getloadavg()[0],
        },
        "files": len(files),
        "distinct_files": len(set(files)),
        "audio_seconds": audio_s,
        "batch_size": fv.batch_size,
        "repeats": fv.repeats,
        "rows": [row("read", "audio.read", "host CPU", "-", 1, 0.0, read, audio_s)],
        "same_texts": {},
        "left_out": [],
    }
    # XLA:CPU runs on every core unless --threads=1; on a GPU the host reads and decodes in one thread.
    jax_threads = (1 if fv.threads == 1 else cpus) if backend == "cpu" else "-"
    engines = {  # path: (its engine's constructor, where it runs, threads)
        f"jax_{name}": (
            functools.partial(jax_backend.JaxEngine, fv.workdir, cfg, batch_size=fv.batch_size, config=config),
            f"{backend}: {device}",
            jax_threads,
        )
        for name, cfg in decoders.items()
    }
    if fv.model:
        import onnxruntime

        from ds2_jax.infer import onnx_backend

        result["host"]["onnxruntime_version"] = onnxruntime.__version__
        for name, cfg in decoders.items():
            engine = functools.partial(onnx_backend.OnnxEngine, fv.model, cfg, fv.batch_size, fv.threads)
            engines[f"onnx_{name}"] = (engine, "host CPU", threads)
    else:
        result["left_out"].append("onnx_greedy, onnx_beam_lm: no --model")
    texts = {}
    for path, (open_engine, runs_on, n) in engines.items():  # one engine alive at a time
        r, texts[path] = measure(path, open_engine, runs_on, n, files, fv, audio_s)
        result["rows"].append(r)
    for name in decoders if fv.model else ():
        result["same_texts"][name] = agreement(texts[f"jax_{name}"], texts[f"onnx_{name}"])
    if not fv.lm:
        result["left_out"].append("jax_beam_lm, onnx_beam_lm: no --lm")
    result["texts"] = {"files": files, **texts}
    os.makedirs(fv.out, exist_ok=True)
    with open(os.path.join(fv.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    table = markdown(result)
    with open(os.path.join(fv.out, "results.md"), "w") as f:
        f.write(table)
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
