"""How fast a `manifest` dataset builds, against the bare decode + resample rate of the same files.

    python -m benchmarks.manifest_build --manual_dir=corpora/tiny_es/common_voice --split=train \\
        --copies=8 --processes=1,2 --out=DIR
    python -m benchmarks.manifest_build --librispeech=corpora/tiny_librispeech --join=10 --copies=40 \\
        --processes=1,2,4,8,16 --out=DIR                            # ~13 s FLACs at 16 kHz, as LibriSpeech's

Makes a manifest of `--copies` x the split's utterances (each copy a symlink to the same
file, so ids differ and the page cache holds the audio: decoding is measured, not the
disk), then for each process count P: the bare rate (datasets.audio.load of every file on P
processes, only the sample counts sent back, nothing written: the limit) and the whole tfds
build (build.build: manifests, alphabet, then decode, encode and the array_record shards on
P worker processes; P=1 builds inline, dataset.build_workers=0). With --librispeech the
input is a LibriSpeech tree's 16 kHz FLACs (no resampling), as a 960-hour LibriSpeech build
would read them. --profile=FILE writes a cProfile of the inline build (P=1). Needs no
TensorFlow (tfds, array_record, soundfile, soxr). Writes results.json and results.md to --out.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import tempfile
import time

import numpy as np


def make_input(args, root: str) -> tuple[str, float]:
    """A manifest folder of copies x the utterances under root/manual; returns (folder, seconds of audio)."""
    import soundfile

    from ds2_jax.datasets import librispeech_local, manifest

    manual = os.path.join(root, "manual")
    os.makedirs(os.path.join(manual, "clips"))
    rows = []  # (audio path, text)
    if args.librispeech:
        for split_dir in sorted(
            os.path.join(r, d)
            for r, ds, _ in os.walk(args.librispeech)
            for d in ds
            if d in librispeech_local.LIBRISPEECH_SPLITS
        ):
            for r, _, names in os.walk(split_dir):
                trans = {}
                for n in names:
                    if n.endswith(".trans.txt"):
                        with open(os.path.join(r, n), "rb") as f:
                            trans.update(librispeech_local.parse_transcripts(f.read()))
                rows += [
                    (os.path.join(r, n), trans[n[:-5]])
                    for n in sorted(names)
                    if n.endswith(".flac") and n[:-5] in trans
                ]
    else:
        m = manifest.read_manifest(manifest.find_manifests(args.manual_dir, args.split)[args.split], manifest.Options())
        rows = [(e.audio, e.text) for e in m.entries]
    if args.join > 1:  # LibriSpeech-length utterances: `join` clips in one FLAC at their rate
        joined = os.path.join(root, "joined")
        os.makedirs(joined)
        groups = [rows[i : i + args.join] for i in range(0, len(rows) - args.join + 1, args.join)]
        rows = []
        for g, group in enumerate(groups):
            parts = [soundfile.read(path, dtype="int16") for path, _ in group]
            path = os.path.join(joined, f"j{g}.flac")
            soundfile.write(path, np.concatenate([a for a, _ in parts]), parts[0][1], subtype="PCM_16")
            rows.append((path, " ".join(words for _, words in group)))
    seconds, lines = 0.0, ["path\tsentence"]
    for k in range(args.copies):
        for i, (path, words) in enumerate(rows):
            name = f"c{k}_{i}{os.path.splitext(path)[1]}"
            os.symlink(os.path.abspath(path), os.path.join(manual, "clips", name))
            lines.append(f"{name}\t{words}")
            if k == 0:
                seconds += soundfile.info(path).duration
    with open(os.path.join(manual, "train.tsv"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return manual, seconds * args.copies


def cpu_s() -> tuple[float, float]:
    """(this process's, its finished children's) user + system CPU seconds."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def decoded_samples(jobs: list[tuple[str, int, str]]) -> int:
    """audio.load of each job; the samples they gave (a bare-decode task: no audio sent back)."""
    from ds2_jax.datasets import audio

    return sum(len(a.samples) for a in audio.load_many(jobs) if not isinstance(a, audio.Skip))


def bare_decode(jobs: list, processes: int, chunk: int = 16) -> None:
    """Decodes every job on `processes` spawned processes (inline for 1), as the build's workers would."""
    if processes <= 1:
        decoded_samples(jobs)
        return
    import concurrent.futures
    import multiprocessing

    chunks = [jobs[i : i + chunk] for i in range(0, len(jobs), chunk)]
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(decoded_samples, chunks))


def per_file(jobs: list, sample_rate: int, root: str, reps: int = 5) -> dict:
    """CPU ms per file, the median of `reps` interleaved rounds in this process: the bare decode
    (audio.load) against a build worker's whole per-file work (shards.write_shard: decode, CTC check,
    the record, the array_record write) on the same files. No process start, manifest or tfds
    bookkeeping: the per-process ratio a long build approaches, steady even on a busy host."""
    from ds2_jax import text
    from ds2_jax.datasets import audio, shards

    items = tuple((i, f"u{i}", path, "a", "") for i, (path, _, _) in enumerate(jobs))
    job = shards.ShardJob(
        "train",
        0,
        os.path.join(root, "per_file.tmp"),
        items,
        text.Alphabet(" a").symbols,
        sample_rate,
        "downmix",
        round(sample_rate * 0.02),
        round(sample_rate * 0.01),
    )
    bare, work = [], []
    for _ in range(reps):
        t = time.process_time()
        audio.load_many(jobs)
        bare.append(time.process_time() - t)
        t = time.process_time()
        shards.write_shard(job)
        work.append(time.process_time() - t)
    b, w = sorted(bare)[reps // 2] * 1e3 / len(jobs), sorted(work)[reps // 2] * 1e3 / len(jobs)
    return {
        "files": len(jobs),
        "bare_cpu_ms": round(b, 3),
        "build_cpu_ms": round(w, 3),
        "build_over_bare": round(b / w, 3),
    }


def measure(args) -> dict:
    from ds2_jax import settings
    from ds2_jax.datasets import audio, build, manifest

    root = tempfile.mkdtemp(prefix="manifest_build_")
    try:
        manual, audio_s = make_input(args, root)
        m = manifest.read_manifest(os.path.join(manual, "train.tsv"), manifest.Options())
        jobs = [(e.audio, args.sample_rate, "downmix") for e in m.entries]
        for job in jobs[: min(len(jobs), 64)]:  # warm the page cache and the decoders
            audio.load(*job)
        steady = per_file(jobs[: min(len(jobs), 200)], args.sample_rate, root)
        print(json.dumps({"per_file": steady}), flush=True)
        rows = []
        for processes in args.processes:
            workers = 0 if processes == 1 else processes  # one process: the build inline
            t, cpu = time.perf_counter(), cpu_s()
            bare_decode(jobs, processes)
            bare = time.perf_counter() - t
            bare_cpu = [a - b for a, b in zip(cpu_s(), cpu)]
            n = len(jobs)
            config = settings.override(
                settings.Settings(),
                {
                    "dataset.name": "manifest",
                    "dataset.manual_dir": manual,
                    "dataset.train_splits": "train",
                    "dataset.build_workers": workers,
                    "features.sample_rate": args.sample_rate,
                },
            )
            options = manifest.Options.of(config.dataset, config.features.spectrogram)
            data_dir = os.path.join(root, f"tfds-{processes}")
            profiler = None
            if args.profile and processes == 1:
                import cProfile

                profiler = cProfile.Profile()
                profiler.enable()
            t, cpu = time.perf_counter(), cpu_s()
            builder = build.build(manual, data_dir, "manifest", options)
            built = time.perf_counter() - t
            main_cpu, workers_cpu = [a - b for a, b in zip(cpu_s(), cpu)]
            if profiler is not None:
                profiler.disable()
                os.makedirs(os.path.dirname(os.path.abspath(args.profile)), exist_ok=True)
                profiler.dump_stats(args.profile)
            kept = builder.info.splits["train"].num_examples
            rows.append(
                {
                    "processes": processes,
                    "build_workers": workers,
                    "utterances": n,
                    "kept": kept,
                    "bare_s": round(bare, 3),
                    "bare_utt_per_s": round(n / bare, 1),
                    "build_s": round(built, 3),
                    "build_utt_per_s": round(kept / built, 1),
                    "build_audio_s_per_s": round(audio_s / built, 1),
                    "build_over_bare": round((kept / built) / (n / bare), 3),
                    # CPU time per utterance (contention on a shared host inflates wall time, not these)
                    "bare_cpu_ms": round(1e3 * sum(bare_cpu) / n, 3),
                    "build_main_cpu_ms": round(1e3 * main_cpu / kept, 3),
                    "build_workers_cpu_ms": round(1e3 * workers_cpu / kept, 3),
                    "load_average": round(os.getloadavg()[0], 2),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            shutil.rmtree(data_dir)
        return {
            "input": args.librispeech or f"{args.manual_dir}:{args.split}",
            "copies": args.copies,
            "join": args.join,
            "utterances": len(jobs),
            "audio_s": round(audio_s, 1),
            "sample_rate": args.sample_rate,
            "cpu_count": os.cpu_count(),
            "per_file": steady,
            "rows": rows,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def write(result: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    joined = f", {result['join']} clips joined per file" if result["join"] > 1 else ""
    lines = [
        f"input {result['input']}{joined} x {result['copies']}: {result['utterances']} utterances, "
        f"{result['audio_s']:.0f} s of audio, to {result['sample_rate']} Hz; {result['cpu_count']} cores",
        "",
        "| processes | bare decode utt/s | build utt/s | build / bare | audio s per s | CPU ms/utt: bare "
        "| build, main process | build, workers | load avg |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['processes']} | {r['bare_utt_per_s']} | {r['build_utt_per_s']} | {r['build_over_bare']:.2f} "
            f"| {r['build_audio_s_per_s']} | {r['bare_cpu_ms']} | {r['build_main_cpu_ms']} "
            f"| {r['build_workers_cpu_ms']} | {r['load_average']} |"
        )
    p = result["per_file"]
    lines += [
        "",
        f"per file, one process, median of 5 rounds over {p['files']} files: bare decode {p['bare_cpu_ms']} CPU "
        f"ms, a build worker's whole work {p['build_cpu_ms']} ms: {p['build_over_bare']:.2f} of the bare rate",
    ]
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_string("manual_dir", "", "A folder of manifests.", flag_values=fv)
    flags.DEFINE_string("split", "train", "The manifest measured (with --manual_dir).", flag_values=fv)
    flags.DEFINE_string("librispeech", "", "Or a LibriSpeech tree: its FLACs and transcripts.", flag_values=fv)
    flags.DEFINE_integer("copies", 4, "Times each utterance is listed (symlinks).", flag_values=fv)
    flags.DEFINE_integer(
        "join", 1, "Utterances joined into one FLAC (LibriSpeech's ~12 s from short clips).", flag_values=fv
    )
    flags.DEFINE_list(
        "processes",
        ["1", "2"],
        "Process counts measured (1 = inline, dataset.build_workers=0; P > 1: dataset.build_workers=P).",
        flag_values=fv,
    )
    flags.DEFINE_integer("sample_rate", 16_000, "features.sample_rate.", flag_values=fv)
    flags.DEFINE_string("profile", "", "A cProfile of the inline build (processes=1) to this file.", flag_values=fv)
    flags.DEFINE_string("out", None, "Output folder.", required=True, flag_values=fv)


def main(argv=None) -> int:
    import logging

    from ds2_jax import cli

    args, _ = cli.parse_args(argv, define_flags, __doc__)
    if not (args.manual_dir or args.librispeech):
        cli.usage_error("give --manual_dir or --librispeech")
    args.processes = [int(p) for p in args.processes]
    if not args.processes or min(args.processes) < 1:
        cli.usage_error(f"--processes={','.join(map(str, args.processes))}: counts of 1 or more")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    write(measure(args), args.out)
    return 0


if __name__ == "__main__":
    from ds2_jax import errors

    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
