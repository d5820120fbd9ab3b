"""launch.py end to end in a subprocess: train with an override, resume, eval, bad flags."""

import json
import os
import re

import pytest

from tests import helpers

pytestmark = pytest.mark.e2e


def launch(*args, check=True):
    proc = helpers.launch(*args, quick_compile=True)  # each run compiles most of what it runs
    if check and proc.returncode != 0:
        raise AssertionError(proc.stderr[-3000:])
    return proc


@pytest.mark.slow  # 15-60 s on 2 idle cores (2026-12-05): make test runs it, test-fast does not
def test_train_resume_and_eval(tmp_path):
    w = str(tmp_path / "w")
    cosine = ("--config.optimizer.schedule=cosine", "--config.optimizer.decay_steps=6")  # ends at step 6
    proc = launch(
        f"--workdir={w}",
        "--config.num_train_steps=6",
        "--config.log_every_steps=2",
        "--config.eval_every_steps=0",
        *cosine,
    )
    assert "will train at under" not in proc.stderr  # the schedule's own tail is not warned about
    # Not on a terminal (a pipe here, a batch job's log file): no bar, whose redraws would stay
    # behind; the log lines say the time left (at the interval's step time), the last none.
    assert "last step loss=" not in proc.stderr and "\r" not in proc.stderr, proc.stderr[-2000:]
    intervals = [line for line in proc.stderr.splitlines() if ": means of steps " in line]
    assert [bool(re.search(r" eta=\d+:\d\d:\d\d$", line)) for line in intervals] == [True, True, False], intervals
    records = [json.loads(line) for line in open(os.path.join(w, "metrics.jsonl"))]
    assert [r["step"] for r in records] == [2, 4, 6]
    assert {"loss", "grad_norm", "learning_rate", "skipped_steps", "step_time_s", "utterances_per_s"} <= set(records[0])
    assert os.listdir(os.path.join(w, "tensorboard"))
    proc = launch(
        f"--workdir={w}",
        "--config.num_train_steps=8",
        "--config.log_every_steps=2",
        "--config.eval_every_steps=8",
        *cosine,
    )
    assert "restored checkpoint at step 6" in proc.stderr
    # Extending past the schedule's end trains at learning rate 0: the run says so and names the setting.
    assert (
        "steps 7-8 will train at under 1% of optimizer.learning_rate (0 from step 6): optimizer.schedule='cosine' "
        "ends at step 6 (optimizer.warmup_steps=0 + optimizer.decay_steps=6). To train further, stretch the "
        "schedule: --config.optimizer.decay_steps=9 or more"
    ) in proc.stderr
    # The console: plain lines (no absl prefix), no orbax chatter, the kernel choice of the real rows only;
    # the full log, orbax's lines too, in the workdir.
    lines = [line for line in proc.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert not [line for line in lines if re.match(r"[IWEF]\d{4} ", line)], lines[:5]
    assert any(line.startswith("devices: 8 local (cpu)") for line in lines) and "Saving checkpoint" not in proc.stderr
    assert (
        "1 rows per device" not in proc.stderr
        and "recurrence: auto -> scan_vjp (simple, 2 rows per device" in proc.stderr
    )
    log = open(os.path.join(w, "log.txt")).read()
    assert "Saving checkpoint at step 8" in log and re.search(
        r"\n\S+ \S+ I ds2_jax train.py:\d+\] devices: 8 local", log
    )
    # The log's loss is the interval's mean (the bar's, on a terminal, the last step's: test_progress.py).
    assert "step 8: means of steps 7-8: loss=" in proc.stderr
    records = [json.loads(line) for line in open(os.path.join(w, "metrics.jsonl"))]
    assert [r["step"] for r in records if "loss" in r] == [2, 4, 6, 8]
    assert records[-2]["learning_rate"] == 0.0  # step 8's interval, as the warning said
    (in_training,) = [r for r in records if "eval_cer" in r]
    launch(f"--workdir={w}", "--mode=eval")
    result = json.load(open(os.path.join(w, "eval-dev-clean-8-greedy-max16.json")))
    # --mode=eval restores the step-8 checkpoint and scores it as the training run's eval did
    assert result["utterances"] == 16 and in_training["step"] == 8
    for key in ("loss", "wer", "cer"):
        assert result[key] == pytest.approx(in_training[f"eval_{key}"], rel=1e-5), key


def test_unknown_key_and_bad_values_fail_clearly(tmp_path):
    proc = launch(f"--workdir={tmp_path}", "--config.no_such_key=1", check=False)
    assert proc.returncode != 0 and "no_such_key" in proc.stderr
    proc = launch(f"--workdir={tmp_path}", "--config.model.rnn_sise=64", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: unknown config key 'model.rnn_sise' (--config.model.rnn_sise=64) in configs/smoke.py: "
        "did you mean model.rnn_size, model.rnn_impl, model.rnn_cell?"
    ]
    proc = launch(f"--workdir={tmp_path}", "--config.num_devices=9", check=False)
    assert proc.returncode != 0 and "num_devices=9" in proc.stderr


def test_an_explained_error_is_one_line_with_the_traceback_in_the_log(tmp_path):
    w = tmp_path / "w"
    w.mkdir()
    (w / "run.lock").write_text('{"host": "elsewhere", "pid": 1, "start": "2026-12-03T10:00:00"}')
    proc = launch(f"--workdir={w}", check=False)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: workdir {str(w)!r} is in use by another run (host elsewhere, pid 1")
    assert last.endswith(f"[traceback: {w / 'error.log'}]") and "Traceback" not in proc.stderr
    assert "WorkdirLocked" in (w / "error.log").read_text()
    proc = launch(f"--workdir={w}", "--traceback", check=False)
    assert proc.returncode == 1 and "Traceback (most recent call last)" in proc.stderr
