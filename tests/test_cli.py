"""Every command line of the project, as a user types it: a mistake is one `error:` line."""

import os
import subprocess
import sys

import pytest

from ds2_jax import resilience
from tests.helpers import ROOT

pytestmark = pytest.mark.e2e


def run(*args, cwd=ROOT, timeout=120):
    """`python *args` in the repository root, on the CPU; the finished process."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


LAUNCH = ("launch.py", "--config=configs/smoke.py")

# (command line, what its one line says); every one is a usage error: exit code 2.
USAGE_MISTAKES = [
    (
        (*LAUNCH, "--workdir={w}", "--config.per_device_batch_size=abc"),
        "error: --config.per_device_batch_size=abc: expected an integer",
    ),
    (
        (*LAUNCH, "--workdir={w}", "--config.model.rnn_size=1.5"),
        "error: --config.model.rnn_size=1.5: expected an integer",
    ),
    ((*LAUNCH, "--workdir={w}", "--config.compile=maybe"), "error: --config.compile=maybe: expected true or false"),
    (
        (*LAUNCH, "--workdir={w}", "--config.optimizer.learning_rate=fast"),
        "error: --config.optimizer.learning_rate=fast: expected a number",
    ),
    (LAUNCH, "error: --workdir is required"),
    (
        ("launch.py", "--config=configs/smoek.py", "--workdir={w}"),
        "error: --config=configs/smoek.py: no such file; did you mean configs/smoke.py",
    ),
    ((*LAUNCH, "--workdir={w}", "--mode=train2"), "error: --mode=train2: value should be one of <train|eval>"),
    ((*LAUNCH, "--workdir={w}", "--no_such_flag=1"), "error: Unknown command line flag 'no_such_flag'"),
    ((*LAUNCH, "--workdir={w}", "stray"), "error: unexpected argument(s) stray"),
    (
        ("-m", "ds2_jax.demo", "--workdir={w}", "--config.num_train_steps=many"),
        "error: --config.num_train_steps=many: expected an integer",
    ),
    (
        ("-m", "ds2_jax.demo", "--workdir={w}", "--config.model.rnn_sise=8"),
        "error: unknown config key 'model.rnn_sise'",
    ),
    (("-m", "ds2_jax.transcribe", "a.wav"), "error: give one of --workdir (a training workdir) or --model"),
    (
        ("-m", "ds2_jax.transcribe", "--workdir={w}", "--beam_width=wide", "a.wav"),
        "error: --beam_width=wide: expected an integer",
    ),
    (("-m", "ds2_jax.transcribe", "--workdir={w}"), "error: no audio files given"),
    (("-m", "ds2_jax.tools.tune_lm", "--workdir={w}"), "error: --lm is required"),
    (
        ("-m", "ds2_jax.tools.tune_lm", "--workdir={w}", "--lm=lm.arpa", "--alphas=0,x"),
        "error: --alphas=0,x: 'x' is not",
    ),
    (
        ("-m", "ds2_jax.tools.tune_lm", "--workdir={w}", "--lm=lm.arpa", "--betas=0,nan"),
        "error: --betas=0,nan: nan must be",
    ),
    (
        ("-m", "ds2_jax.tools.tune_lm", "--workdir={w}", "--lm=lm.arpa", "--beam_width=0"),
        "error: --beam_width=0: must be",
    ),
    (("-m", "ds2_jax.tools.tune_lm", "--workdir={w}", "--lm=none.arpa"), "error: --lm=none.arpa: no such file"),
    (
        ("-m", "ds2_jax.tools.tune_lm", "--workdir={w}", "--lm=lm.arpa", "--step=newest"),
        "error: --step=newest: must be a step number (>= 0) or 'best'",
    ),
    (
        ("-m", "ds2_jax.tools.build_lm", "--order=7", "--out={w}/lm.arpa", "--transcripts=a.txt"),
        "error: --order=7: must be 2..6",
    ),
    (
        ("-m", "ds2_jax.tools.build_lm", "--order=1", "--out={w}/lm.arpa", "--transcripts=a.txt"),
        "error: --order=1: must be 2..6 (the decoder's KenLM loads models of order 2 to 6: a unigram",
    ),
    (("-m", "ds2_jax.tools.build_lm", "--order=x", "--out={w}/lm.arpa"), "error: --order=x: expected an integer"),
    (("-m", "ds2_jax.tools.build_lm", "--out={w}/lm.arpa"), "error: give --transcripts and/or --manual_dir"),
    (("-m", "ds2_jax.tools.make_corpus", "--max_seconds=long"), "error: --max_seconds=long: expected a number"),
    (
        (
            "-m",
            "ds2_jax.plot",
        ),
        "error: --workdir is required",
    ),
    (("-m", "ds2_jax.plot", "--workdir={w}", "--dpi=300"), "error: Unknown command line flag 'dpi'"),
    (
        (
            "-m",
            "ds2_jax.datasets.build",
        ),
        "error: --config.dataset.manual_dir is required",
    ),
    (
        (
            "-m",
            "benchmarks.recurrence_kernel",
        ),
        "error: --out is required",
    ),
    (("-m", "benchmarks.input_pipeline", "--batch=big"), "error: --batch=big: expected an integer"),
    (("-m", "benchmarks.scaling", "--out={w}", "--to_device"), "error: Unknown command line flag 'to_device'"),
]


@pytest.mark.parametrize("args,expected", USAGE_MISTAKES, ids=[" ".join(a) for a, _ in USAGE_MISTAKES])
def test_a_usage_mistake_is_one_error_line_and_exit_code_2(tmp_path, args, expected):
    w = tmp_path / "w"
    proc = run(*(a.format(w=w) for a in args))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(expected), lines[0]
    assert not w.exists()  # nothing written


def test_a_failed_check_leaves_no_half_made_workdir(tmp_path):
    w = tmp_path / "new"
    proc = run(*LAUNCH, f"--workdir={w}", "--config.num_devices=9")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("error: num_devices=9 but only"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and not w.exists()
    w.mkdir()  # a workdir the user made stays, with the traceback in it
    proc = run(*LAUNCH, f"--workdir={w}", "--config.num_devices=9")
    assert proc.returncode == 1 and (w / "error.log").exists()


def test_print_config_lists_every_setting_with_type_help_and_the_changed_ones():
    proc = run(*LAUNCH, "--config.model.rnn_size=64", "--print_config")  # no --workdir needed
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    from ds2_jax import settings

    keys = [r["key"] for r in settings.describe(settings.defaults())]
    rows = {line[2:].split(" = ", 1)[0]: line for line in lines[1:-1]}
    assert list(rows) == keys and len(keys) > 80
    assert rows["model.rnn_size"] == "* model.rnn_size = 64  (int)  [default 2048]  Hidden units per direction."
    assert rows["seed"] == "  seed = 0  (int)  Seeds parameters, data order and dropout-free rng streams."
    for r in settings.describe(settings.defaults()):  # every key has its one-line meaning, from settings.py
        assert r["help"] and rows[r["key"]].endswith(f"  {r['help']}"), r
    assert lines[0].startswith("# configs/smoke.py --config.model.rnn_size=64: ")
    assert lines[-1].startswith("# differ from the defaults: num_train_steps=20, per_device_batch_size=2,")
    assert "model.rnn_size=64" in lines[-1] and "seed=" not in lines[-1]
    proc = run(*LAUNCH, "--config.model.dtype=float16", "--print_config")  # listed, then checked as a run would
    assert proc.returncode == 1 and "* model.dtype = 'float16'  (str)  [default 'float32']" in proc.stdout
    assert proc.stderr.startswith("error: model.dtype='float16': expected one of ['float32', 'bfloat16']"), proc.stderr


def test_a_gpu_sized_config_on_the_cpu_says_so_before_compiling(tmp_path):
    from tests import helpers

    proc = helpers.launch(
        "--config=configs/ds2_8gpu.py",
        f"--workdir={tmp_path / 'w'}",
        "--config.dataset.name=synthetic",
        devices=1,
        wait=False,
    )
    seen = []
    try:
        for line in proc.stderr:  # read until the warning, then stop the run: it would compile for a minute
            seen.append(line.rstrip())
            if line.startswith("warning: no GPU found") or len(seen) > 20:
                break
    finally:
        proc.kill()
        proc.wait()
    assert seen[:3] == [
        seen[0],
        "devices: 1 local (cpu) x 1 process(es), pmap, global batch 16",
        "warning: no GPU found: jax runs on the CPU, and this config is sized for GPUs "
        "(model.rnn_size=2048): expect a long compile and seconds to minutes per step. With an NVIDIA "
        "GPU, install jax for it (pip install -e '.[cuda]'; `python -c \"import jax; "
        'print(jax.devices())"` should list it); on the CPU, configs/demo.py trains in minutes',
    ], seen


@pytest.mark.parametrize("name", ["smoke", "demo", "ds2_8gpu"])
def test_a_config_sets_only_what_differs_from_the_defaults(name):
    """configs/*.py override configs/default.py (flax's style): every key a file sets, --print_config marks changed."""
    import ast

    tree = ast.parse(open(os.path.join(ROOT, "configs", f"{name}.py")).read())
    assigned = {
        ast.unparse(t).removeprefix("config.")
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for t in node.targets
        if ast.unparse(t).startswith("config.")
    }
    proc = run("launch.py", f"--config=configs/{name}.py", "--print_config")  # (ds2_8gpu: exit 1, no manual_dir)
    assert "# differ from the defaults: " in proc.stdout, proc.stderr[-2000:]
    unchanged = {line[2:].split(" = ", 1)[0] for line in proc.stdout.splitlines() if line.startswith("  ")}
    assert assigned and not assigned & unchanged, f"configs/{name}.py sets defaults: {sorted(assigned & unchanged)}"


EXPLAINED_FAILURES = [
    (
        ("-m", "ds2_jax.tools.build_lm", "--manual_dir={w}", "--splits=train-clean-100", "--out={w}/lm.arpa"),
        "error: --splits: no train-clean-100 in --manual_dir=",
    ),
    (("-m", "ds2_jax.plot", "--workdir={w}"), "error: {w}/metrics.jsonl not found"),
    (("-m", "benchmarks.input_pipeline", "--manual_dir={w}"), "error: dataset.manual_dir="),
    (("-m", "benchmarks.recurrence_kernel", "--out={w}", "--shape=1,2"), "error: "),
]


@pytest.mark.parametrize("args,expected", EXPLAINED_FAILURES, ids=[a[1] for a, _ in EXPLAINED_FAILURES])
def test_a_command_that_fails_on_its_input_says_so_in_one_line(tmp_path, args, expected):
    w = tmp_path / "nothing here"
    proc = run(*(a.format(w=w) for a in args))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and lines and lines[-1].startswith(expected.format(w=w)), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "result",
    [
        "checkpoints/3/default/x",
        "metrics.jsonl",
        "eval-dev-clean-3-greedy.json",
        "tune_lm-dev-clean-3-beam32-lm-lm-0123abcd.json",
        "tensorboard/events.out",
        "config_changes.jsonl",
        "curves.png",
        None,
    ],
)
def test_cleanup_after_a_failure_removes_only_a_workdir_without_a_result(tmp_path, result):
    """issue 40: the clean-up of a half-made workdir must never delete a checkpoint or a result, and
    never a workdir that existed before the command."""
    from ds2_jax import cli

    w = tmp_path / "w"

    def failing_run():
        for name in (*resilience.SCAFFOLDING, *([result] if result else [])):
            (w / name).parent.mkdir(parents=True, exist_ok=True)
            (w / name).write_text("x")
        raise ValueError("a failed check")

    with pytest.raises(ValueError):
        cli.removing_new_workdir_on_error(failing_run, str(w))()
    assert w.exists() == (result is not None)
    if result:
        assert (w / result).read_text() == "x"
    w.mkdir(exist_ok=True)  # a workdir that existed before is kept, even holding scaffolding only
    with pytest.raises(ValueError):
        cli.removing_new_workdir_on_error(failing_run, str(w))()
    assert w.exists()
