"""benchmarks/precision.py: the bundled-corpus config it trains, the figures it reads from
metrics.jsonl, and (slow) the command end to end with a tiny model, both dtypes."""

import json
import re
import subprocess
import sys

import pytest

from benchmarks import precision
from configs import demo, ds2_8gpu
from tests.helpers import CORPUS, ROOT, quick_compile_env


def _decay_steps(config) -> int:
    """The decay steps the run trains with (a cosine decay_steps of 0: to the last step)."""
    from ds2_jax import settings, state

    return state.run_optimizer(settings.from_config_dict(config)).decay_steps


def test_the_seed_model_trains_on_the_bundled_corpus():
    config = precision.on_bundled_corpus(ds2_8gpu.get_config(), steps=600, evals=6, log_every=10, data_dir="D")
    seed, bundled = ds2_8gpu.get_config(), demo.get_config().dataset
    assert config.model == seed.model and config.optimizer == seed.optimizer  # the seed's model and optimizer
    assert seed.optimizer.schedule == "cosine" and _decay_steps(config) == 600  # its decay ends at the run's end
    assert config.dataset.manual_dir == bundled.manual_dir and config.dataset.data_dir == "D"
    assert (config.dataset.min_duration_s, config.dataset.max_duration_s) == (
        bundled.min_duration_s,
        bundled.max_duration_s,
    )
    assert (config.num_train_steps, config.eval_every_steps, config.log_every_steps) == (600, 100, 10)
    assert config.eval.max_utterances == 0
    assert seed.dataset.min_duration_s == 6.0  # the argument is not changed
    assert precision.on_bundled_corpus(ds2_8gpu.get_config(), 8, 2, 10).dataset.data_dir == bundled.data_dir
    # The command line's --config.dataset.* apply on top of the bundled section (the rest are FLAGS.config's).
    given = precision.on_bundled_corpus(seed, 8, 2, 10, "D", {"dataset.num_buckets": 1, "model.rnn_size": 16})
    assert (given.dataset.num_buckets, given.dataset.manual_dir, given.dataset.data_dir) == (1, bundled.manual_dir, "D")
    assert bundled.num_buckets == 2 and given.model.rnn_size == seed.model.rnn_size
    seed.optimizer.warmup_steps, seed.optimizer.decay_steps = 50, 10_000  # a given decay is fitted too,
    assert _decay_steps(precision.on_bundled_corpus(seed, 600, 3, 10)) == 550  # after the warm-up
    assert _decay_steps(precision.on_bundled_corpus(seed, 2, 1, 1)) == 1  # (a warm-up longer than the run)
    seed.optimizer.schedule = "exponential"  # another schedule is left as it is
    assert _decay_steps(precision.on_bundled_corpus(seed, 600, 3, 10)) == 10_000
    with pytest.raises(ValueError, match="multiple of --evals"):
        precision.on_bundled_corpus(ds2_8gpu.get_config(), steps=10, evals=3, log_every=1)


def _rows(final_cer=0.3):
    return [
        {"step": 10, "loss": 90.0, "step_time_s": 5.0},
        {"step": 20, "loss": 60.0, "step_time_s": 0.02},
        {"step": 20, "eval_loss": 70.0, "eval_cer": 0.6, "eval_wer": 0.9},
        {"step": 30, "loss": 40.0, "step_time_s": 0.03},
        {"step": 40, "loss": 30.0, "step_time_s": 0.01},
        {"step": 40, "eval_loss": 35.0, "eval_cer": final_cer, "eval_wer": 0.5},
        {"step": 50, "loss": 1.0, "eval_cer": 0.0},  # past the run's steps (an older, longer run): ignored
    ]


def test_summary_takes_the_final_evaluation_and_steady_step_time():
    s = precision.summarize(_rows(), "bfloat16", steps=40, wall_s=12.34)
    assert s["loss"] == [(10, 90.0), (20, 60.0), (30, 40.0), (40, 30.0)]
    assert s["eval_cer"] == [(20, 0.6), (40, 0.3)]
    assert (s["final_cer"], s["final_wer"], s["final_eval_loss"], s["final_train_loss"]) == (0.3, 0.5, 35.0, 30.0)
    assert s["median_step_ms"] == 20.0  # the first interval (compile) left out
    with pytest.raises(ValueError, match="no evaluation at the final step 30"):
        precision.summarize(_rows(), "float32", steps=30, wall_s=1.0)


def _result(dtype, impl, seed, cer):
    return dict(precision.summarize(_rows(final_cer=cer), dtype, steps=40, wall_s=1.0), rnn_impl=impl, seed=seed)


def test_runs_are_dtype_and_rnn_impl_pairs_checked_against_the_settings():
    assert precision.parse_runs(["float32:scan_vjp", "bfloat16:auto"]) == [
        ("float32", "scan_vjp"),
        ("bfloat16", "auto"),
    ]
    for bad in (["float16:auto"], ["bfloat16:cudnn"], ["bfloat16"], [], ["float32:scan", "float32:scan"]):
        with pytest.raises(ValueError, match="--runs"):
            precision.parse_runs(bad)


@pytest.mark.parametrize(
    "cers, meets",
    [
        # reference seeds (0.02, 0.08): mean 5%, worst 8%
        ((0.02, 0.10), True),  # mean +1.0 point, worst +2.0 points: both at their limits
        ((0.02, 0.101), False),  # worst +2.1 points
        ((0.05, 0.075), False),  # worst better, but mean +1.25 points
        ((0.60, 0.01), False),  # one diverged seed
    ],
)
def test_the_goal_is_the_mean_and_the_worst_seed_against_the_reference(cers, meets):
    ref = [_result("float32", "scan_vjp", seed, cer) for seed, cer in enumerate((0.02, 0.08))]
    fast = [_result("bfloat16", "auto", seed, cer) for seed, cer in enumerate(cers)]
    rows = precision.summary(ref + fast, [("float32", "scan_vjp"), ("bfloat16", "auto")])
    assert [r["run"] for r in rows] == ["float32:scan_vjp", "bfloat16:auto"]
    assert rows[0]["meets_goal"] and rows[0]["mean_cer"] == pytest.approx(0.05) and rows[0]["worst_cer"] == 0.08
    assert rows[1]["seeds"] == 2 and rows[1]["meets_goal"] is meets
    assert rows[1]["worst_minus_reference_points"] == pytest.approx(100 * (max(cers) - 0.08))
    md = precision.notes(ref + fast, rows, {"seeds": [0, 1]})
    assert f"| bfloat16:auto | 2 | {100 * sum(cers) / 2:.2f}% | {100 * max(cers):.2f}% |" in md
    assert ("| met |" if meets else "| MISSED |") in md.split("| bfloat16:auto | 2 |")[1].split("\n")[0]
    assert "| bfloat16:auto | 1 | 40 | 30.000 | 35.000 |" in md  # one row per (run, seed)


def _precision(out, data_dir: str, *flags: str, runs: str = "float32:scan_vjp,bfloat16:scan_vjp") -> dict:
    """precision.json of `python -m benchmarks.precision` with tiny `runs` x two seeds, 2 steps each."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.precision",
            f"--out={out}",
            "--config=configs/demo.py",
            "--steps=2",
            "--evals=1",
            "--log_every=1",
            f"--data_dir={data_dir}",
            "--config.num_devices=1",
            "--seeds=0,1",
            f"--runs={runs}",
            "--config.model.rnn_cell=simple",
            "--config.model.conv_channels=4",
            "--config.model.num_conv_layers=1",  # (a smaller compile: the conv count is no question here)
            "--config.model.num_rnn_layers=1",
            "--config.model.rnn_size=16",
            "--config.per_device_batch_size=4",
            "--config.dataset.num_buckets=1",  # one batch shape: one train and one eval compile per dtype
            *flags,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=quick_compile_env(JAX_PLATFORMS="cpu"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (out / "stdout.txt").write_text(proc.stdout)
    (out / "stderr.txt").write_text(proc.stderr)
    return json.loads((out / "precision.json").read_text())


@pytest.mark.slow
def test_precision_command_trains_every_run_and_seed_and_draws_them(tmp_path):
    """Two runs x two seeds (2 steps each) on the bundled corpus: within a seed the first losses
    agree to bf16 rounding yet differ (the dtype was applied); across seeds they differ (the seed was).
    With --processes=2 each seed trains in its own process, to the same numbers (deterministic CPU ops)."""
    from ds2_jax.datasets import build

    data_dir = str(tmp_path / "tfds")
    build.build(CORPUS, data_dir)  # prepared first, as a carried copy would be
    out = tmp_path / "p"
    result = _precision(out, data_dir)
    runs = result["runs"]
    assert [(r["seed"], r["dtype"], r["rnn_impl"]) for r in runs] == [
        (0, "float32", "scan_vjp"),
        (0, "bfloat16", "scan_vjp"),
        (1, "float32", "scan_vjp"),
        (1, "bfloat16", "scan_vjp"),
    ]
    for r in runs:
        assert [s for s, _ in r["loss"]] == [1, 2] and [s for s, _ in r["eval_cer"]] == [2]
        assert 0 <= r["final_cer"] < 5 and r["final_wer"] >= 0 and r["final_train_loss"] > 0  # untrained: insertions
        assert (out / f"{r['dtype']}-scan_vjp-seed{r['seed']}" / "metrics.jsonl").exists()
    first = {(r["seed"], r["dtype"]): r["loss"][0][1] for r in runs}
    for seed in (0, 1):
        f32, bf16 = first[seed, "float32"], first[seed, "bfloat16"]
        assert bf16 != f32 and abs(bf16 - f32) < 0.05 * f32
    assert first[0, "float32"] != first[1, "float32"]
    assert [row["run"] for row in result["summary"]] == ["float32:scan_vjp", "bfloat16:scan_vjp"]
    assert result["meta"]["seeds"] == [0, 1] and result["meta"]["deterministic"] is False
    assert (out / "precision.png").read_bytes()[:4] == b"\x89PNG"
    assert re.search(r"compiled batch shapes \(samples, labels\): \[\(\d+, \d+\)\]\n", (out / "stderr.txt").read_text())
    notes = (out / "NOTES.md").read_text()
    assert "| float32:scan_vjp | 2 |" in notes and "| bfloat16:scan_vjp | 1 | 2 |" in notes

    # Into a fresh data_dir: the corpus is built once before the seeds start, not by each at once.
    # One run of the two (the seed processes train what the first command did, fewer of it).
    in_processes = _precision(tmp_path / "p2", str(tmp_path / "fresh-tfds"), "--processes=2", runs="bfloat16:scan_vjp")
    assert "preparing the corpus once" in (tmp_path / "p2" / "stdout.txt").read_text()
    for seed in (0, 1):  # each seed in its own process and folder, with its log
        assert (tmp_path / "p2" / f"seed{seed}" / f"bfloat16-scan_vjp-seed{seed}" / "metrics.jsonl").exists()
        assert "steps" in (tmp_path / "p2" / f"seed{seed}.log").read_text()
    key = lambda r: (r["seed"], r["dtype"], r["loss"], r["final_cer"])  # noqa: E731
    assert [key(r) for r in in_processes["runs"]] == [key(r) for r in runs if r["dtype"] == "bfloat16"]
    assert in_processes["meta"]["devices"] == result["meta"]["devices"] and in_processes["summary"][0]["seeds"] == 2
    assert "--processes=2" in in_processes["meta"]["command"] and (tmp_path / "p2" / "NOTES.md").exists()


def test_each_seed_process_gets_the_command_line_but_its_own_seed_and_folder():
    argv = [
        "precision.py",
        "--out=D",
        "--steps=6",
        "--seeds",
        "0,1,2",
        "--processes=3",
        "--config.seed=9",
        "--runs=float32:scan_vjp",
        "--seeds=4",
    ]
    cmd = precision.seed_command(argv, 2, "D/seed2")
    assert cmd[:3] == [sys.executable, "-m", "benchmarks.precision"]
    assert cmd[3:] == ["--steps=6", "--config.seed=9", "--runs=float32:scan_vjp", "--seeds=2", "--out=D/seed2"]
