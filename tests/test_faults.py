"""Fault injection: every failure a long run meets, what is kept, and what the user sees.

kill -9 at three points, SIGTERM, a damaged newest (or every) checkpoint, a busy or
stale workdir lock, a torn metrics line, a full disk before and during a save,
non-finite steps, a hung step, an unwritable workdir, out-of-memory, a changed manual
dir, eval with a different config or into a read-only workdir, num_train_steps below
the checkpoint, bad configs; and issue 29's: signals with steps in flight, an unfinished
step folder, a resume with other settings, torn config.json / metrics / result files, a
long eval under the watchdog, OOM vs disk full, a missing eval split, long audio. Where
training continues, the final state is compared bit for bit with an uninterrupted run.
The slow drills run launch.py in a subprocess.
"""

import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import jax
import numpy as np
import pytest

from ds2_jax import checkpoint, errors, evaluation, files, layout, memory, metrics, resilience, train, workdir_config
from ds2_jax import state as state_lib
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import make_source
from tests import helpers
from tests.helpers import tiny_config, tiny_settings

COMMON = [
    "--config.num_train_steps=8",
    "--config.log_every_steps=2",
    "--config.checkpoint_every_steps=3",
    "--config.eval_every_steps=4",
    "--config.eval.max_utterances=8",
]


def launch(workdir, *extra, wait=True, quick_compile=True):
    """launch.py with COMMON: (exit status, stderr), or the running process with wait=False."""
    proc = helpers.launch(f"--workdir={workdir}", *COMMON, *extra, wait=wait, quick_compile=quick_compile)
    return (proc.returncode, proc.stderr) if wait else proc


def final_params(workdir):
    config = tiny_settings()
    source = make_source(config, Sharding(16))
    template = state_lib.initial_state(config, source, jax.random.PRNGKey(0))
    state, step = checkpoint.restore_latest(checkpoint.manager(str(workdir)), template)
    return step, [np.asarray(x) for x in jax.tree_util.tree_leaves((state.params, state.opt_state, state.batch_stats))]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    w = tmp_path_factory.mktemp("full")
    rc, err = launch(w)
    assert rc == 0, err[-2000:]
    return final_params(w)


@pytest.mark.slow
@pytest.mark.e2e
def test_kill_9_then_rerun_matches_uninterrupted_bit_for_bit(tmp_path, uninterrupted):
    """kill -9 before an eval, after a step's dispatch and once a save is under way, each rerun of the
    same command killed at the next point (one workdir: each rerun meets the leftovers of the kill
    before it: a stale lock, metrics past the checkpoint, a save cut short), then a rerun to the end."""
    for kill_at in ("eval:4", "step:5", "checkpoint:6"):  # in the order a run reaches them
        rc, err = launch(tmp_path, f"--config.faults.kill_at={kill_at}")
        assert rc == -signal.SIGKILL, (kill_at, err[-2000:])
        assert (tmp_path / layout.LOCK).exists()  # left behind by the killed run
        assert kill_at == "eval:4" or "taking over the stale lock" in err, (kill_at, err[-2000:])
    rc, err = launch(tmp_path)
    assert rc == 0, err[-2000:]
    assert "taking over the stale lock" in err
    assert not (tmp_path / layout.LOCK).exists()
    step, params = final_params(tmp_path)
    assert step == uninterrupted[0] == 8
    for a, b in zip(params, uninterrupted[1]):
        np.testing.assert_array_equal(a, b)
    steps = [
        json.loads(line)["step"] for line in open(tmp_path / "metrics.jsonl") if "loss" in line and "eval" not in line
    ]
    assert steps == [2, 4, 6, 8]  # records of repeated steps are not duplicated


@pytest.mark.slow
@pytest.mark.e2e
def test_sigterm_checkpoints_and_exits_zero_then_resumes(tmp_path):
    proc = launch(
        tmp_path,
        "--config.num_train_steps=100000",
        "--config.log_every_steps=1",
        "--config.checkpoint_every_steps=100000",
        "--config.eval_every_steps=0",
        wait=False,
        quick_compile=False,  # its final state is held bit for bit to a run in this process
    )
    metrics_file = tmp_path / "metrics.jsonl"
    deadline = time.time() + 300
    while not (metrics_file.exists() and metrics_file.read_text().count("\n") >= 2):
        assert time.time() < deadline and proc.poll() is None, proc.stderr.read()[-2000:]
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert "preempted at step" in err
    saved = checkpoint.manager(str(tmp_path)).latest_step()
    assert saved is not None and saved >= 2
    rc, err = launch(
        tmp_path, f"--config.num_train_steps={saved + 2}", "--config.eval_every_steps=0", quick_compile=False
    )
    assert rc == 0 and f"restored checkpoint at step {saved}" in err
    full = train.train_and_evaluate(
        tiny_config(num_train_steps=saved + 2, log_every_steps=1, eval_every_steps=0, checkpoint_every_steps=100000),
        str(tmp_path / "full"),
    )
    step, params = final_params(tmp_path)
    assert step == saved + 2
    for a, b in zip(params, leaves((full.params, full.opt_state, full.batch_stats))):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.e2e
def test_two_runs_on_one_workdir_the_second_is_refused_and_nothing_mixes(tmp_path, uninterrupted):
    first = launch(tmp_path, wait=False)
    lock = tmp_path / layout.LOCK
    deadline = time.time() + 300
    while not lock.exists():
        assert time.time() < deadline and first.poll() is None, first.stderr.read()[-2000:]
        time.sleep(0.2)
    rc, err = launch(tmp_path, "--config.model.rnn_size=64")  # different settings, started later
    assert rc == 1
    assert f"is in use by another run (host {socket.gethostname()}, pid {first.pid}" in err.strip().splitlines()[-1]
    _, first_err = first.communicate(timeout=600)
    assert first.returncode == 0, first_err[-2000:]
    assert json.load(open(tmp_path / "config.json"))["model"]["rnn_size"] == 32
    steps = [json.loads(line)["step"] for line in open(tmp_path / "metrics.jsonl") if "eval" not in line]
    assert steps == [2, 4, 6, 8]
    step, params = final_params(tmp_path)
    for a, b in zip(params, uninterrupted[1]):
        np.testing.assert_array_equal(a, b)


def _corrupt(directory, how):
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            if how == "truncate":
                with open(path, "r+b") as f:
                    f.truncate(max(os.path.getsize(path) // 3, 0))
            else:
                os.remove(path)


# ----------------------------------------------------------------------------- in process

RUN = {
    "num_train_steps": 6,
    "log_every_steps": 3,
    "eval_every_steps": 0,
    "checkpoint_every_steps": 3,
    "eval.max_utterances": 8,
}


def run_config(**overrides):
    return tiny_config(**{**RUN, **overrides})


def leaves(state):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(state)]


def assert_same_state(a, b):
    assert int(a.step) == int(b.step)
    for x, y in zip(leaves(a), leaves(b)):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory):
    """An uninterrupted 6-step run (checkpoints 3 and 6): (workdir, final state). Not conftest's
    `trained` demo model: a name of its own keeps these tests off that model's xdist group."""
    w = tmp_path_factory.mktemp("six_steps")
    return str(w), jax.device_get(train.train_and_evaluate(run_config(), str(w)))


def copy_of(run, tmp_path) -> str:
    w = str(tmp_path / "w")
    shutil.copytree(run[0], w)
    return w


def restored_latest(workdir):
    return state_lib.restore_state(tiny_settings(**RUN), workdir)


@pytest.mark.parametrize("how", ["truncate", "delete"])
def test_damaged_newest_checkpoint_is_moved_aside_retrained_and_saved(six_steps, tmp_path, how, caplog):
    w = copy_of(six_steps, tmp_path)
    _corrupt(os.path.join(w, "checkpoints", "6"), how)
    with caplog.at_level("INFO", logger="ds2_jax"):
        state = train.train_and_evaluate(run_config(), w)  # the same command again
    assert "checkpoint 6" in caplog.text and "damaged" in caplog.text
    assert "restored checkpoint at step 3" in caplog.text
    assert "moved damaged checkpoint 6 aside" in caplog.text
    names = os.listdir(os.path.join(w, "checkpoints"))
    assert sorted(n for n in names if n.isdigit()) == ["3", "6"]
    assert len([n for n in names if n.startswith("6.damaged-")]) == 1
    assert_same_state(state, six_steps[1])
    saved, step = restored_latest(w)  # what --mode=eval now evaluates
    assert step == 6
    assert_same_state(saved, six_steps[1])
    caplog.clear()
    with caplog.at_level("INFO", logger="ds2_jax"):  # and the rerun after that redoes nothing
        train.train_and_evaluate(run_config(), w)
    assert (
        "restored checkpoint at step 6" in caplog.text
        and "nothing to train: workdir already at step 6 of 6" in caplog.text
    )


def test_all_checkpoints_damaged_is_an_error_naming_the_way_out(six_steps, tmp_path):
    w = copy_of(six_steps, tmp_path)
    _corrupt(os.path.join(w, "checkpoints"), "truncate")
    before = open(os.path.join(w, "config.json")).read()
    with pytest.raises(errors.CheckpointError, match="none of the 2 checkpoints") as err:
        train.train_and_evaluate(run_config(num_train_steps=9), w)
    assert "config.json" in str(err.value) and "move" in str(err.value)
    assert open(os.path.join(w, "config.json")).read() == before  # the trained config is kept


@pytest.mark.e2e
def test_all_checkpoints_damaged_message_is_the_last_line(six_steps, tmp_path):
    w = copy_of(six_steps, tmp_path)
    for root, _, names in os.walk(os.path.join(w, "checkpoints")):
        for name in names:  # keep the json metadata: orbax then fails inside tensorstore's event loop
            if name.endswith(".ocdbt") or os.path.basename(root) == "d":
                with open(os.path.join(root, name), "r+b") as f:
                    f.truncate(10)
    rc, err = launch(w, "--config.eval_every_steps=0")
    assert rc == 1
    last = err.strip().splitlines()[-1].lstrip()  # under load a bar's erasing blanks can precede it (noted)
    assert last.startswith("error: none of the 2 checkpoints in") and "error.log" in last, err[-3000:]
    assert "Traceback" not in err.split("error: none of")[-1]
    assert "CheckpointError" in open(os.path.join(w, "error.log")).read()  # the traceback is kept


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_busy_workdir_is_refused_naming_the_first_run(tmp_path):
    w = tmp_path / "w"
    w.mkdir()
    first = subprocess.Popen(["sleep", "60"])  # stands in for the running first run
    try:
        lock = w / layout.LOCK
        host = socket.gethostname()
        lock.write_text(json.dumps({"host": host, "pid": first.pid, "start": "2026-12-03T10:00:00"}))
        with pytest.raises(errors.WorkdirLocked, match=f"in use by another run \\(host {host}, pid {first.pid}"):
            train.train_and_evaluate(run_config(), str(w))
        # Another host's run can't be checked from here, so it is never taken over.
        lock.write_text(json.dumps({"host": "other-host", "pid": _dead_pid(), "start": "2026-12-03T10:00:00"}))
        with pytest.raises(errors.WorkdirLocked, match="host other-host") as err:
            train.train_and_evaluate(run_config(), str(w))
        assert str(lock) in str(err.value)  # the way out when that machine is gone
        assert sorted(os.listdir(w)) == [layout.LOCK]  # nothing written, nothing mixed
    finally:
        first.kill()
        first.wait()


def test_killed_mid_write_stale_lock_and_torn_metrics_line_resume_bit_for_bit(six_steps, tmp_path, caplog):
    """What kill -9 during step 6's bookkeeping leaves: its lock, half a metrics line, no
    checkpoint 6. The rerun takes the lock over, drops the torn line, and ends where the
    uninterrupted run did."""
    w = copy_of(six_steps, tmp_path)
    shutil.rmtree(os.path.join(w, "checkpoints", "6"))
    path = os.path.join(w, "metrics.jsonl")
    text = open(path).read()
    open(path, "w").write(text[: len(text) - 25])  # step 6's record, cut mid-line
    pid = _dead_pid()
    lock = os.path.join(w, layout.LOCK)
    open(lock, "w").write(json.dumps({"host": socket.gethostname(), "pid": pid, "start": "2026-12-03T10:00:00"}))
    with caplog.at_level("INFO", logger="ds2_jax"):
        state = train.train_and_evaluate(run_config(), w)
    assert f"taking over the stale lock {lock}" in caplog.text and f"pid {pid}" in caplog.text
    assert f"{path}: dropping its torn last line" in caplog.text
    assert_same_state(state, six_steps[1])
    assert [r["step"] for r in metrics.read_jsonl(path)] == [3, 6]
    assert not os.path.exists(lock)


def test_torn_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ValueError, match=f"{path} line 2 is not JSON"):
        metrics.read_jsonl(str(path))


def test_num_train_steps_below_the_checkpoint_says_so_and_changes_nothing(six_steps, tmp_path, caplog):
    w = copy_of(six_steps, tmp_path)
    before = {n: open(os.path.join(w, n)).read() for n in ("metrics.jsonl", "config.json")}
    with caplog.at_level("INFO", logger="ds2_jax"):
        state = train.train_and_evaluate(run_config(num_train_steps=4), w)
    assert int(state.step) == 6
    assert "at step 6, past num_train_steps=4: nothing to train" in caplog.text
    assert "--config.num_train_steps above 6" in caplog.text and "--mode=eval" in caplog.text
    assert before == {n: open(os.path.join(w, n)).read() for n in before}
    assert sorted(os.listdir(os.path.join(w, "checkpoints"))) == ["3", "6"]


def test_eval_restores_with_the_workdirs_config_and_names_what_differs(six_steps, tmp_path, caplog):
    w = copy_of(six_steps, tmp_path)
    other = run_config(**{"model.rnn_size": 64, "optimizer.learning_rate": 1.0})
    with caplog.at_level("INFO", logger="ds2_jax"):
        result = evaluation.evaluate_checkpoint(other, w)
    assert "model.rnn_size (trained 32, --config 64)" in caplog.text
    assert "optimizer.learning_rate" in caplog.text and "damaged" not in caplog.text
    assert result["step"] == 6 and result["utterances"] == 8 and np.isfinite(result["loss"])
    greedy = json.load(open(os.path.join(w, "eval-dev-clean-6-greedy-max8.json")))
    assert greedy["wer"] == result["wer"] and "beam" not in greedy

    pytest.importorskip("pyctcdecode")
    beam = evaluation.evaluate_checkpoint(run_config(**{"decoding.beam_width": 4}), w)
    assert json.load(open(os.path.join(w, "eval-dev-clean-6-beam4-max8.json")))["beam"]["wer"] == beam["beam"]["wer"]
    evaluation.evaluate_checkpoint(run_config(), w)  # greedy again: the beam results stay
    assert os.path.exists(os.path.join(w, "eval-dev-clean-6-beam4-max8.json"))


def test_eval_config_takes_training_settings_from_the_workdir_and_eval_settings_from_the_flags(tmp_path):
    trained = run_config(**{"model.rnn_size": 48, "eval.max_utterances": 4})
    old = trained.to_dict()
    del old["model"]["rnn_impl"]  # a workdir from before that knob existed
    (tmp_path / "config.json").write_text(json.dumps(old))
    given = run_config(**{"model.rnn_size": 64, "eval.max_utterances": 16, "model.rnn_impl": "pallas"})
    merged = workdir_config.config_for_eval(given, str(tmp_path))
    assert merged.model.rnn_size == 48 and merged.eval.max_utterances == 16 and merged.model.rnn_impl == "pallas"
    assert workdir_config.differing_keys(old, given.to_dict()) == [("model.rnn_size", 48, 64)]


def test_eval_of_an_own_data_workdir_reads_its_dataset_settings_from_config_json_unless_given(tmp_path, caplog):
    """launch.py --mode=eval --workdir=W needs no dataset flag of W's training again: the dataset.*
    settings the command line did not set come from W's config.json; those it set win."""
    trained = run_config(
        **{
            "dataset.name": "manifest",
            "dataset.manual_dir": "cv-corpus/es",
            "dataset.data_dir": "D",
            "dataset.train_splits": "train",
            "dataset.eval_split": "dev",
        }
    )
    (tmp_path / "config.json").write_text(json.dumps(trained.to_dict()))
    given = run_config(**{"dataset.eval_split": "test"})  # a config file's LibriSpeech defaults, one flag
    with caplog.at_level("INFO", logger="ds2_jax"):
        merged = workdir_config.config_for_eval(given, str(tmp_path), overrides={"dataset.eval_split"})
    d = merged.dataset
    assert (d.name, d.manual_dir, d.data_dir, d.train_splits) == ("manifest", "cv-corpus/es", "D", "train")
    assert d.eval_split == "test"  # given on the command line
    assert "eval reads the data the run was trained on" in caplog.text and "dataset.train_splits='train'" in caplog.text
    assert workdir_config.config_for_eval(given, str(tmp_path)).dataset.name == given.dataset.name  # API: as given


@pytest.fixture
def read_only(tmp_path):
    """A read-only bind mount of a directory (needs root), or skip."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(ro)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here (needs root)")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        yield src, ro
    finally:
        subprocess.run(["umount", str(ro)])


def test_eval_into_a_read_only_workdir_logs_the_result_then_fails_clearly(six_steps, read_only, caplog):
    src, ro = read_only
    shutil.copytree(six_steps[0], src / "w")
    w = str(ro / "w")
    with caplog.at_level("INFO", logger="ds2_jax"), pytest.raises(OSError, match="could not write") as err:
        evaluation.evaluate_checkpoint(run_config(), w)
    assert "eval dev-clean at step 6: greedy WER" in caplog.text  # the result is not lost
    assert "Make " + w + " writable" in str(err.value) and "eval-dev-clean-6-greedy-max8.json" in str(err.value)
    assert err.value.results["dev-clean"]["step"] == 6


@pytest.fixture
def short_save_wait(monkeypatch):
    """A workdir holding a save that never finishes (a crash's or a full disk's leftover): eval waits
    checkpoint.SAVE_WAIT_S (60 s) for it before taking the newest finished one. These tests ask what is
    taken, not how long is waited (the waiting and its 60 s: test_a_checkpoint_a_live_run_is_writing_*)."""
    monkeypatch.setattr(checkpoint, "SAVE_WAIT_S", 0.5)


@pytest.fixture
def tmpfs(tmp_path):
    def mount(size: str):
        path = tmp_path / f"disk-{size}"
        path.mkdir()
        if subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        mounted.append(path)
        return path

    mounted = []
    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)])


def test_disk_full_during_a_save_names_the_workdir_and_free_space(tmpfs, short_save_wait):
    """Room for the pre-flight check (two checkpoints' worth of arrays) but not for two
    checkpoints with orbax's metadata: the second save fails inside orbax/tensorstore."""
    w = str(tmpfs("420k") / "run")
    config = run_config(checkpoint_every_steps=1, keep_checkpoints=5)
    with pytest.raises(errors.DiskFull) as err:
        train.train_and_evaluate(config, w)
    message = str(err.value)
    # The save fills the disk; whichever write comes next (the save, or a metrics line) says so.
    assert "disk full" in message and "MiB free" in message and w in message
    assert "earlier checkpoints are intact" in message
    assert len(message) < 600
    state, step = restored_latest(w)  # what was saved before the disk filled restores
    assert step is not None and step >= 1


def test_a_checkpoint_write_failure_of_any_type_is_explained(tmp_path):
    mgr = checkpoint.manager(str(tmp_path))
    err = checkpoint.explain_save_error(mgr, 7, ValueError("RESOURCE_EXHAUSTED: No space left on device " + "x" * 5000))
    assert isinstance(err, errors.DiskFull) and isinstance(err, OSError)
    assert str(err).startswith(f"writing checkpoint 7 to {tmp_path / 'checkpoints'} failed (disk full; ")
    other = checkpoint.explain_save_error(mgr, 7, RuntimeError("permission denied"))
    assert isinstance(other, errors.CheckpointError) and "permission denied" in str(other)


@pytest.mark.slow
def test_non_finite_steps_skipped_counted_and_bounded(tmp_path):
    common = {"log_every_steps": 1, "eval_every_steps": 0, "checkpoint_every_steps": 100}
    # Both runs compile the same step (same fault steps); only the host-side bound differs.
    train.train_and_evaluate(
        tiny_config(num_train_steps=6, **common, **{"faults.nan_at_steps": "2-4"}), str(tmp_path / "a")
    )

    def strict(text):  # JSON as the standard has it: a bare NaN or Infinity is not a number there
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in metrics.jsonl: not JSON"))

    records = [strict(line) for line in open(tmp_path / "a" / "metrics.jsonl")]
    assert [r["skipped_steps"] for r in records] == [0, 0, 1, 2, 3, 3]
    # An interval of skipped steps has no loss or gradient norm (null), never a 0 that reads as perfect.
    assert (
        [r["loss"] is None for r in records]
        == [r["grad_norm"] is None for r in records]
        == [False, False, True, True, True, False]
    )
    assert all(np.isfinite(r["loss"]) and r["loss"] > 0 for r in records if r["loss"] is not None)
    bad = tiny_config(
        num_train_steps=6,
        **{**common, "checkpoint_every_steps": 2},
        **{"faults.nan_at_steps": "2-4", "optimizer.max_consecutive_skips": 3},
    )
    handlers = [h for name in ("", "ds2_jax") for h in logging.getLogger(name).handlers]
    own_handles = [h.__dict__.get("handle") for h in handlers]
    with pytest.raises(
        FloatingPointError, match="3 consecutive steps had a non-finite loss, gradient or update \\(up to step 5\\)"
    ) as stopped:
        train.train_and_evaluate(bad, str(tmp_path / "b"))
    # The way out names the checkpoint to resume from (step 4: written after two skipped steps, finite).
    assert f"the newest checkpoint, step 4 in {tmp_path / 'b' / 'checkpoints'}, holds finite parameters" in str(
        stopped.value
    )
    # A caller that catches the error keeps its process: the watchdog stopped (left running
    # it would os._exit step_timeout_s later), and the progress bar let go of the log handlers.
    for t in [t for t in threading.enumerate() if t.name == "ds2-watchdog"]:
        t.join(timeout=10)
        assert not t.is_alive(), "the watchdog outlived the failed run"
    assert [h.__dict__.get("handle") for h in handlers] == own_handles


def test_a_non_finite_state_is_never_saved_and_one_saved_before_is_skipped_on_restore(six_steps, tmp_path, caplog):
    """issue 40: NaN parameters were saved to every checkpoint, so a resume with a good rate failed
    again. A save of a non-finite state is refused (nothing written, the message naming the checkpoint
    to resume from); a non-finite checkpoint already on disk (an older ds2_jax) is passed over like a
    damaged one and moved aside, and the previous one restores."""
    workdir = copy_of(six_steps, tmp_path)
    state = six_steps[1]
    poisoned = state.replace(params=jax.tree_util.tree_map(lambda x: np.full_like(x, np.nan), state.params))
    mgr = checkpoint.manager(workdir)
    with pytest.raises(FloatingPointError) as refused:
        checkpoint.save_or_explain(mgr, 7, poisoned)
    assert str(refused.value).startswith("not writing checkpoint 7: the state is not finite (NaN or inf in ")
    assert f"the newest checkpoint, step 6 in {mgr.directory}, holds finite parameters" in str(refused.value)
    checkpoint.finish_or_explain(mgr)
    assert sorted(mgr.all_steps()) == [3, 6] and not os.path.exists(os.path.join(mgr.directory, "7"))
    checkpoint.save(mgr, 9, poisoned, wait=True)  # as an older ds2_jax wrote it
    mgr.close()
    _, step = checkpoint.restore_latest(checkpoint.manager(workdir), state)  # eval, transcribe: passed over, kept
    assert step == 6 and os.path.isdir(os.path.join(workdir, "checkpoints", "9"))
    with caplog.at_level(logging.WARNING, logger="ds2_jax"):
        restored, step = checkpoint.restore_latest(checkpoint.manager(workdir), state, move_damaged=True)
    assert step == 6 and "checkpoint 9" in caplog.text and "not finite" in caplog.text
    assert_same_state(restored, state)
    assert any(n.startswith("9.damaged-") for n in os.listdir(os.path.join(workdir, "checkpoints")))
    other = str(tmp_path / "other")  # --eval_step / transcribe --step naming it: refused, not evaluated
    with checkpoint.managed(other) as mgr:
        checkpoint.save(mgr, 9, poisoned, wait=True)
    with pytest.raises(errors.CheckpointError, match=r"checkpoint 9 in .* is not finite \(NaN or inf in "):
        state_lib.restore_state(tiny_settings(**RUN), other, 9)


@pytest.mark.slow
@pytest.mark.e2e
def test_hung_step_ends_with_an_error_instead_of_hanging(tmp_path):
    start = time.time()
    rc, err = launch(
        tmp_path, "--config.faults.hang_at_step=3", "--config.step_timeout_s=5", "--config.eval_every_steps=0"
    )
    assert rc == resilience.Watchdog.EXIT_CODE
    assert "no progress" in err and time.time() - start < 300


def test_unwritable_workdir_is_a_clear_error_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError, match="not writable"):
        train.train_and_evaluate(tiny_config(), str(blocker / "run"))


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", str(mount)])


def test_full_disk_is_a_clear_error_before_training(small_disk):
    with pytest.raises(OSError, match="MiB free but a checkpoint needs"):
        train.train_and_evaluate(tiny_config(), str(small_disk / "run"))  # ~175 KiB per checkpoint


def test_out_of_memory_names_the_settings_to_lower():
    config = tiny_config()

    def exhausted(*args):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 123 bytes")

    batch = {"audio": np.zeros((1, 16, 128000), np.int16)}
    with pytest.raises(errors.OutOfMemory) as err:
        train._run_step(exhausted, None, batch, None, config, first=True)
    assert "per_device_batch_size" in str(err.value) and "max_duration_s" in str(err.value)
    assert "(1, 16, 128000)" in str(err.value)

    def disk_full(*args):  # tensorstore's RESOURCE_EXHAUSTED for a full disk is not the step's memory
        raise RuntimeError(TENSORSTORE_FULL)

    with pytest.raises(RuntimeError, match="No space left on device") as err:
        train._run_step(disk_full, None, batch, None, config, first=True)
    assert not isinstance(err.value, MemoryError)


def test_missing_dataset_is_a_clear_error(tmp_path):
    config = tiny_config(
        **{
            "dataset.name": "librispeech_local",
            "dataset.manual_dir": str(tmp_path / "nowhere"),
            "dataset.data_dir": str(tmp_path / "tfds"),
        }
    )
    with pytest.raises(FileNotFoundError, match="manual_dir.*is missing or empty"):
        train.train_and_evaluate(config, str(tmp_path / "w"))


def test_prepared_dataset_refuses_a_different_manual_dir_naming_both(tmp_path, caplog):
    from ds2_jax.datasets import build
    from ds2_jax.pipeline import tfds_source
    from ds2_jax.pipeline.source import DataSettings
    from tests import librispeech_testdata as td

    first, copy, other = tmp_path / "first", tmp_path / "copy", tmp_path / "other"
    td.write_bad_inputs(str(first / "LibriSpeech" / "dev-clean"))
    shutil.copytree(first, copy)  # the same files elsewhere: fine
    td.write_bad_inputs(str(other / "LibriSpeech" / "dev-clean"))
    os.remove(other / "LibriSpeech" / "dev-clean" / "1" / "10" / "1-10-0003.flac")  # one file fewer
    data_dir = str(tmp_path / "tfds")
    builder = build.build(str(first), data_dir)
    recorded = build.recorded_source(builder)
    assert recorded["manual_dir"] == str(first) and recorded["splits"] == ["dev-clean"]
    with caplog.at_level("INFO"):
        build.build(str(copy), data_dir)
    assert f"built from {first}" in caplog.text and "holds the same files" in caplog.text
    for manual in (other, tmp_path / "bogus"):
        with pytest.raises(errors.DatasetMismatch) as err:
            build.build(str(manual), data_dir)
        message = str(err.value)
        assert f"built from {first}" in message and f"dataset.manual_dir={str(manual)!r}" in message
        assert "dataset.data_dir to a fresh directory" in message
        assert os.path.dirname(os.fspath(builder.data_dir)) in message  # delete this to rebuild
    config = tiny_settings(
        **{"dataset.name": "librispeech_local", "dataset.manual_dir": str(other), "dataset.data_dir": data_dir}
    )
    with pytest.raises(errors.DatasetMismatch, match="holds other files"):  # the training path too
        tfds_source._open_builder(DataSettings.of(config), Sharding(16))
    # issue 40: the record follows the umask (another user of a shared data_dir reads it), and a
    # record that is there but unreadable or torn is refused, never "unchecked" (the wrong corpus).
    record = build._record_path(builder)
    assert os.stat(record).st_mode & 0o777 == 0o666 & ~files.umask()
    os.remove(record)
    if os.geteuid() == 0:  # root reads a 000 file: a folder in its place fails open() the same way
        os.mkdir(record)
    else:
        with open(record, "w") as f:
            f.write("{}")
        os.chmod(record, 0)
    with pytest.raises(
        OSError,
        match=rf"{record}, the record .* is unreadable \(.*\), so the data cannot be "
        r"checked.*chmod a\+r",
    ):
        build.build(str(first), data_dir)
    os.chmod(record, 0o644) if os.path.isfile(record) else os.rmdir(record)
    with open(record, "w") as f:
        f.write('{"manual_dir": ')
    with pytest.raises(ValueError, match=rf"{record}, the record .* is not JSON"):
        tfds_source._open_builder(DataSettings.of(config), Sharding(16))


# ----------------------------------------------------------------------------- issue 29


def test_rewriting_metrics_on_resume_is_atomic_a_kill_midway_keeps_the_history(tmp_path, monkeypatch):
    """A resume drops the records after its checkpoint by rewriting metrics.jsonl; a run
    killed in the middle of that rewrite must leave the old file whole (not 0 bytes)."""
    path = tmp_path / "metrics.jsonl"
    original = "".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (1, 2, 3, 4))
    path.write_text(original)
    written = []

    def killed_after_one(record):
        written.append(record)
        if len(written) == 2:
            raise KeyboardInterrupt  # stands in for the kill: the rewrite stops half way
        return json.dumps(record)

    fake = type(
        "json",
        (),
        {
            "dumps": staticmethod(killed_after_one),
            "loads": staticmethod(json.loads),
            "JSONDecodeError": json.JSONDecodeError,
        },
    )
    monkeypatch.setattr(metrics, "json", fake)
    with pytest.raises(KeyboardInterrupt):
        metrics.MetricWriter(str(tmp_path), resume_step=2)
    assert path.read_text() == original
    assert os.listdir(tmp_path) == ["metrics.jsonl"]  # no temporary file left behind
    monkeypatch.undo()
    metrics.MetricWriter(str(tmp_path), resume_step=2).close()
    assert [r["step"] for r in metrics.read_jsonl(str(path))] == [1, 2]


@pytest.mark.parametrize("how", ["empty", "partial"])
def test_an_unfinished_step_folder_is_set_aside_and_good_checkpoints_restore(
    six_steps, tmp_path, how, caplog, short_save_wait
):
    """checkpoints/9 made by a crash (empty) or a save cut short (files, no commit metadata):
    eval and training use checkpoint 6; training sets 9 aside and trains it again."""
    w = copy_of(six_steps, tmp_path)
    folder = os.path.join(w, "checkpoints", "9")
    if how == "empty":
        os.makedirs(folder)
    else:
        shutil.copytree(os.path.join(w, "checkpoints", "6"), folder)
        os.remove(os.path.join(folder, checkpoint.FINISHED_MARKER))
    state, step = restored_latest(w)  # --mode=eval: skips it, moves nothing
    assert step == 6 and os.path.isdir(folder)
    assert_same_state(state, six_steps[1])
    with pytest.raises(errors.CheckpointError, match="checkpoint 9 .* was never finished"):
        state_lib.restore_state(tiny_settings(**RUN), w, step=9)  # --eval_step=9
    with caplog.at_level("INFO", logger="ds2_jax"):
        state = train.train_and_evaluate(run_config(num_train_steps=9), w)
    assert "restored checkpoint at step 6" in caplog.text and "never finished" in caplog.text
    assert "checkpoint 6 in" not in caplog.text and "checkpoint 3 in" not in caplog.text  # never called damaged
    assert "moved damaged checkpoint 9 aside" in caplog.text
    assert int(state.step) == 9 and restored_latest(w)[1] == 9


@pytest.mark.parametrize("how", ["orbax_tmp_folder", "no_commit_marker"])
def test_a_checkpoint_a_live_run_is_writing_is_waited_for_then_named_never_called_damaged(
    six_steps, tmp_path, how, monkeypatch, caplog
):
    """issue 40: eval/transcribe (state.restore_state) reading a workdir while its run writes checkpoint 6
    (orbax's 6.orbax-checkpoint-tmp, or a step folder without its commit markers) took it for no
    checkpoint or a damaged one, advising to move the checkpoints away. They wait (bounded) for it,
    then use the newest finished one, or say it is being written."""
    w = copy_of(six_steps, tmp_path)
    done, ck = os.path.join(w, "checkpoints", "6"), os.path.join(w, "checkpoints")
    writing = os.path.join(ck, "6.orbax-checkpoint-tmp")
    shutil.move(done, writing)
    if how == "no_commit_marker":  # written in place (no atomic rename): the metadata first, the commit marker last
        for finished in ("3", "6.orbax-checkpoint-tmp"):  # as an orbax that writes commit markers leaves them
            open(os.path.join(ck, finished, checkpoint.COMMIT_MARKER), "a").close()
        writing = done
        shutil.copytree(os.path.join(ck, "6.orbax-checkpoint-tmp"), writing)
        os.remove(os.path.join(writing, checkpoint.COMMIT_MARKER))

    def finish():  # once the reader waits for it (a loaded machine may take seconds to get there)
        deadline = time.monotonic() + 120
        while "being written by a training run now" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        if how == "orbax_tmp_folder":
            os.rename(writing, done)
        else:
            shutil.rmtree(done)
            os.rename(os.path.join(ck, "6.orbax-checkpoint-tmp"), done)

    timer = threading.Thread(target=finish)
    timer.start()
    with caplog.at_level("WARNING", logger="ds2_jax"):
        state, step = restored_latest(w)  # the save finishes while it waits
    timer.join()
    assert step == 6 and "checkpoint 6 in" in caplog.text and "being written by a training run now" in caplog.text
    assert "(at most 60 s)" in caplog.text  # the default bound, as docs/operations.md gives it
    assert_same_state(state, six_steps[1])

    shutil.move(done, writing if how == "orbax_tmp_folder" else os.path.join(ck, "6.orbax-checkpoint-tmp"))
    if how == "no_commit_marker":
        shutil.copytree(os.path.join(ck, "6.orbax-checkpoint-tmp"), writing)
        os.remove(os.path.join(writing, checkpoint.COMMIT_MARKER))
    monkeypatch.setattr(checkpoint, "SAVE_WAIT_S", 0.5)  # a save that never finishes while we wait
    caplog.clear()
    with caplog.at_level("WARNING", logger="ds2_jax"):
        _, step = restored_latest(w)
    assert step == 3 and "checkpoint 6 in" in caplog.text and "using checkpoint 3, the newest finished" in caplog.text
    assert "damaged" not in caplog.text and os.path.isdir(writing)  # nothing moved
    shutil.rmtree(os.path.join(ck, "3"))  # the run's first save: no finished checkpoint yet
    if how == "no_commit_marker":  # half written: orbax cannot read it
        os.remove(os.path.join(writing, "default", "manifest.ocdbt"))
    try:
        restored_latest(w)
        message = "restored"
    except errors.CheckpointError as e:
        message = str(e)
    assert re.search("checkpoint 6 in .* is being written by a training run now", message), message
    assert "damaged" not in message and "move" not in message, message


@pytest.mark.parametrize("how", ["truncated", "hand_edited", "bad_value", "not_an_object"])
def test_a_torn_or_hand_edited_config_json_names_the_file_and_the_key(tmp_path, how):
    """Eval, transcription (load_config) and a resume read workdir/config.json: a broken one
    is one ValueError naming the file and the key (not a bare JSONDecodeError)."""
    from ds2_jax import settings

    text = json.dumps(settings.to_dict(run_config()), indent=2)
    at = text.index('"rnn_size"')
    broken = {
        "truncated": text[: at + len('"rnn_size": 3')] + '"',  # cut mid-value
        "hand_edited": text.replace('"rnn_size": 32,', '"rnn_size": 32,,'),
        "bad_value": text.replace('"rnn_size": 32', '"rnn_size": "32 units"'),
        "not_an_object": "[]",
    }[how]
    (tmp_path / "config.json").write_text(broken)
    path = str(tmp_path / "config.json")
    for read in (
        lambda: workdir_config.load_config(str(tmp_path)),
        lambda: workdir_config.config_for_eval(run_config(), str(tmp_path)),
    ):
        with pytest.raises(ValueError) as err:
            read()
        message = str(err.value)
        assert path in message, message
        if how != "not_an_object":
            assert "model.rnn_size" in message, message


def test_config_json_is_written_atomically(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text('{"old": 1}')

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(workdir_config.json, "dumps", killed)
    monkeypatch.setattr(workdir_config.json, "dump", killed)
    with pytest.raises(KeyboardInterrupt):
        workdir_config.save_config(tiny_settings(**RUN), str(tmp_path))
    assert (tmp_path / "config.json").read_text() == '{"old": 1}'


def test_a_resume_refuses_another_model_shape_naming_the_keys_and_moves_nothing(six_steps, tmp_path):
    w = copy_of(six_steps, tmp_path)
    before = sorted(os.listdir(os.path.join(w, "checkpoints")))
    with pytest.raises(ValueError) as err:
        train.train_and_evaluate(run_config(num_train_steps=9, **{"model.rnn_size": 64, "model.num_rnn_layers": 2}), w)
    message = str(err.value)
    assert "model.rnn_size (trained 32, --config 64)" in message and "model.num_rnn_layers" in message
    assert "another --workdir" in message and "damaged" not in message
    assert sorted(os.listdir(os.path.join(w, "checkpoints"))) == before  # nothing moved aside as "damaged"


@pytest.mark.slow
def test_a_resume_with_changed_settings_logs_and_records_them_keeping_config_json(six_steps, tmp_path, caplog):
    w = copy_of(six_steps, tmp_path)
    original = open(os.path.join(w, "config.json")).read()
    changed = {"optimizer.learning_rate": 0.01, "per_device_batch_size": 4}
    with caplog.at_level("INFO", logger="ds2_jax"):
        train.train_and_evaluate(run_config(num_train_steps=9, **changed), w)
    assert "settings changed at step 6" in caplog.text
    assert "optimizer.learning_rate 0.0005 -> 0.01" in caplog.text and "per_device_batch_size 2 -> 4" in caplog.text
    assert open(os.path.join(w, "config.json")).read() == original  # still the settings of steps 1-6
    (record,) = metrics.read_jsonl(os.path.join(w, layout.CONFIG_CHANGES))
    assert record["step"] == 6 and record["changes"] == {
        "optimizer.learning_rate": [0.0005, 0.01],
        "per_device_batch_size": [2, 4],
    }  # num_train_steps: no change
    marker = [
        r for r in metrics.read_jsonl(os.path.join(w, "metrics.jsonl")) if "config_change/per_device_batch_size" in r
    ]
    assert marker == [
        {"step": 6, "config_change/optimizer.learning_rate": 0.01, "config_change/per_device_batch_size": 4.0}
    ]
    caplog.clear()
    with caplog.at_level("INFO", logger="ds2_jax"):  # the same settings again, training further: no new change
        train.train_and_evaluate(run_config(num_train_steps=12, **changed, **{"optimizer.clip_global_norm": 5.0}), w)
    assert "optimizer.learning_rate" not in caplog.text and "settings changed at step 9" in caplog.text
    assert "optimizer.clip_global_norm 400.0 -> 5.0" in caplog.text
    assert [r["step"] for r in metrics.read_jsonl(os.path.join(w, layout.CONFIG_CHANGES))] == [6, 9]


def test_a_resume_that_stretches_a_cosine_decay_to_the_last_step_records_num_train_steps(tmp_path):
    """With optimizer.decay_steps=0 the steps set the learning rate: raising them is a change of
    what is trained; under any other schedule it is not."""
    for schedule, decay_steps, recorded in (("cosine", 0, True), ("cosine", 6, False), ("constant", 0, False)):
        w = str(tmp_path / f"{schedule}-{decay_steps}")
        opt = {"optimizer.schedule": schedule, "optimizer.decay_steps": decay_steps}
        workdir_config.record_resume_changes(tiny_settings(**opt, num_train_steps=6), w, 0)
        diff = workdir_config.record_resume_changes(tiny_settings(**opt, num_train_steps=9), w, 6)
        assert (diff == [("num_train_steps", 6, 9)]) is recorded and (diff == []) is not recorded, (schedule, diff)


def test_disk_full_during_an_asynchronous_save_names_that_step_in_one_line(tmpfs, capfd, short_save_wait):
    """Saves are asynchronous: checkpoint N's failure surfaces while N+1 is saved. The error
    names N (the step that is missing afterwards), and orbax's background threads' tracebacks
    go to error.log, not the terminal."""
    w = str(tmpfs("420k") / "run")
    config = run_config(checkpoint_every_steps=1, keep_checkpoints=5, log_every_steps=100)  # metrics at the end only
    with pytest.raises(errors.DiskFull) as err:
        train.train_and_evaluate(config, w)
    _, step = restored_latest(w)
    assert str(err.value).startswith(f"writing checkpoint {step + 1} to "), (step, str(err.value))
    assert "Traceback" not in capfd.readouterr().err


def test_the_failing_step_is_read_off_the_error(tmp_path):
    mgr = checkpoint.manager(str(tmp_path))
    text = (
        f'RESOURCE_EXHAUSTED: Error writing "params.x/0" in OCDBT database at local file '
        f'"{tmp_path}/checkpoints/2.orbax-checkpoint-tmp/default.orbax-checkpoint-tmp/ocdbt.process_0/": '
        "Failed to write 368 bytes to file 7: No space left on device [os_error_code='28']"
    )
    err = checkpoint.explain_save_error(mgr, 3, ValueError(text))
    assert str(err).startswith(f"writing checkpoint 2 to {tmp_path / 'checkpoints'} failed (disk full; ")


def test_orbax_background_errors_go_to_error_log_not_the_terminal(tmp_path, capfd):
    import sys

    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    absl = logging.getLogger("absl")
    absl.addHandler(handler)
    orbax_code = compile("log.error('thread raised', exc_info=err)", os.path.join("site", "orbax", "x.py"), "exec")
    try:
        with errors.background_errors_to_log(str(tmp_path), "orbax", "Event loop is closed"):
            exec(orbax_code, {"log": absl, "err": RuntimeError("RESOURCE_EXHAUSTED")})
            absl.error("not orbax's")
            sys.unraisablehook(
                type(
                    "Info",
                    (),
                    {
                        "exc_type": RuntimeError,
                        "exc_value": RuntimeError("Event loop is closed"),
                        "exc_traceback": None,
                        "err_msg": None,
                        "object": None,
                    },
                )()
            )
    finally:
        absl.removeHandler(handler)
    assert [r.getMessage() for r in seen] == ["not orbax's"]
    log_text = (tmp_path / "error.log").read_text()
    assert "thread raised" in log_text and "RESOURCE_EXHAUSTED" in log_text and "Event loop is closed" in log_text
    assert "Event loop" not in capfd.readouterr().err


XLA_OOM = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 5368709120 bytes."
TENSORSTORE_FULL = (
    'RESOURCE_EXHAUSTED: Error writing "params.x/0" in OCDBT database: Failed to write 368 bytes to '
    "file 7: No space left on device [os_error_code='28']"
)


def test_out_of_memory_and_disk_full_have_one_rule_each_and_print_their_own_line(tmp_path):
    import errno
    import subprocess
    import sys
    import types

    config = types.SimpleNamespace(
        per_device_batch_size=4096,
        dataset=types.SimpleNamespace(max_duration_s=27.0),
        model=types.SimpleNamespace(rnn_size=2048, dtype="bfloat16"),
    )
    oom = errors.out_of_memory(RuntimeError(XLA_OOM), {"audio": (8, 4096, 128000)}, config)
    cases = {
        XLA_OOM: "oom",
        str(oom): "oom",
        "CUDA out of memory": "oom",
        TENSORSTORE_FULL: "disk",
        OSError(errno.ENOSPC, "No space left on device"): "disk",
        OSError(errno.EDQUOT, "quota"): "disk",
    }
    for err, kind in cases.items():
        err = err if isinstance(err, BaseException) else RuntimeError(err)
        assert (errors.is_out_of_memory(err), errors.is_disk_full(err)) == (kind == "oom", kind == "disk"), err
    script = (
        "import sys, types; from ds2_jax import errors\n"
        "config = types.SimpleNamespace(per_device_batch_size=4096, dataset=types.SimpleNamespace("
        "max_duration_s=27.0), model=types.SimpleNamespace(rnn_size=2048, dtype='bfloat16'))\n"
        "def fail():\n"
        f"    raise errors.out_of_memory(RuntimeError({XLA_OOM!r}), {{'audio': (8, 4096, 128000)}}, config)\n"
        "errors.run_explained(fail, sys.argv[1])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=helpers.ROOT),
        timeout=120,
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("error: out of device memory for batch shapes"), proc.stderr
    assert "disk full" not in last and "per_device_batch_size=4096" in last


def test_an_absurd_batch_is_refused_before_numpy_allocates_naming_per_device_batch_size(six_steps, tmp_path):
    import types

    start = time.time()
    with pytest.raises(MemoryError, match="per_device_batch_size=100000000 is too large for this machine") as err:
        train.train_and_evaluate(tiny_config(per_device_batch_size=100_000_000), str(tmp_path / "w"))
    assert "largest that fits the host is about per_device_batch_size=" in str(err.value)
    assert time.time() - start < 60 and not os.path.exists(tmp_path / "w" / "metrics.jsonl")
    with pytest.raises(MemoryError, match="per_device_batch_size=100000000 is too large"):  # --mode=eval too
        evaluation.evaluate_checkpoint(
            run_config(per_device_batch_size=100_000_000), copy_of(six_steps, tmp_path / "e")
        )
    # The largest it names fits; one more does not.
    host_bytes, shapes = 10 * 2**20, [(16000, 20)]
    with pytest.raises(MemoryError) as err:
        memory.check_host_memory(types.SimpleNamespace(per_device_batch_size=100), 800, shapes, 3, host_bytes)
    fits = int(str(err.value).split("per_device_batch_size=")[-1].split()[0])
    memory.check_host_memory(types.SimpleNamespace(per_device_batch_size=fits), 8 * fits, shapes, 3, host_bytes)
    with pytest.raises(MemoryError):
        memory.check_host_memory(
            types.SimpleNamespace(per_device_batch_size=fits + 1), 8 * (fits + 1), shapes, 3, host_bytes
        )


class _FakeDevice:
    """Stands in for a slow device: steps dispatched by the loop finish one by one, every
    `step_s` seconds, on a thread; each step's metrics are FakeScalars ready when it finishes."""

    def __init__(self, step_s: float):
        self.step_s, self.dispatched, self.finished = step_s, 0, 0
        self._lock = threading.Condition()
        self._stop = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self._stop:
            with self._lock:
                self._lock.wait_for(lambda: self.dispatched > self.finished or self._stop)
            time.sleep(self.step_s)
            with self._lock:
                self.finished += 1

    def step(self, p_train, state, batch, rng, config, first):
        with self._lock:
            self.dispatched += 1
            index = self.dispatched
            self._lock.notify_all()
        keys = (
            "loss_sum",
            "loss_count",
            "infeasible",
            "utterances",
            "grad_norm_sum",
            "finite_steps",
            "steps",
            "learning_rate_sum",
        )
        return state, {k: _FakeScalar(self, index) for k in keys}

    def close(self):
        self._stop = True
        with self._lock:
            self._lock.notify_all()


class _FakeScalar:
    def __init__(self, device, index):
        self.device, self.index = device, index

    def is_ready(self):
        return self.device.finished >= self.index

    def __array__(self, dtype=None, copy=None):
        return np.ones((), dtype or np.float32)


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGHUP"])
def test_a_stop_signal_checkpoints_within_two_steps_of_the_device(six_steps, tmp_path, monkeypatch, caplog, stop):
    """The loop dispatches at most resilience.STEPS_IN_FLIGHT steps ahead of the device, so
    SIGTERM is answered by a checkpoint a step or two after the one running (the seed config
    without a GPU queued ~30 steps of 38 s: 20 minutes). SIGHUP (the terminal closed) is a
    SIGTERM: it ended the run at once with no checkpoint (issue 40)."""
    w = copy_of(six_steps, tmp_path)
    device = _FakeDevice(step_s=0.2)  # slow enough that a loaded machine delivers the signal within a step
    monkeypatch.setattr(train, "_run_step", device.step)
    at_signal = []

    def stop_after_three():
        while device.finished < 3:
            time.sleep(0.001)
        at_signal.append(device.finished)
        os.kill(os.getpid(), getattr(signal, stop))

    threading.Thread(target=stop_after_three, daemon=True).start()
    try:
        with caplog.at_level("INFO", logger="ds2_jax"):
            train.train_and_evaluate(
                run_config(num_train_steps=2000, log_every_steps=10_000, checkpoint_every_steps=10_000), w
            )
    finally:
        device.close()
    saved = checkpoint.manager(w).latest_step()
    assert f"received {stop}" in caplog.text and f"preempted at step {saved}" in caplog.text
    assert saved - 6 <= at_signal[0] + 2 + 1, (saved, at_signal)  # 2 in flight, 1 for the race with the signal


def test_a_stop_signal_while_the_model_is_built_stops_at_the_first_step_with_a_checkpoint(
    tmp_path, monkeypatch, caplog
):
    """issue 40: a Ctrl-C before the loop (building the data, the model, the first compile) was a
    KeyboardInterrupt traceback, SIGTERM a kill leaving a stale lock; now both are the loop's stop."""
    real = train.make_source

    def source_then_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # arrives while the run is being set up
        return real(*args, **kwargs)

    monkeypatch.setattr(train, "make_source", source_then_signal)
    w = str(tmp_path / "w")
    with caplog.at_level("INFO", logger="ds2_jax"):
        state = train.train_and_evaluate(run_config(num_train_steps=1000), w)
    assert int(state.step) == 1 and "received SIGINT" in caplog.text and "preempted at step 1" in caplog.text
    assert checkpoint.manager(w).latest_step() == 1 and not os.path.exists(os.path.join(w, layout.LOCK))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are given back


def test_a_second_signal_abandons_the_wait_at_once_with_a_clear_line(monkeypatch, capfd):
    class Exited(Exception):
        pass

    def exit_(code):
        raise Exited(code)

    monkeypatch.setattr(resilience.os, "_exit", exit_)
    never = type("Never", (), {"is_ready": lambda self: False})()
    start = time.time()
    with resilience.Preemption() as preemption, pytest.raises(Exited) as exited:
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        resilience.wait_ready([never])  # a step (or the final state) the device never finishes
    assert preemption.signal == signal.SIGINT and exited.value.args == (128 + signal.SIGINT,)
    assert time.time() - start < 5
    assert "received SIGINT again: exiting now without writing a checkpoint" in capfd.readouterr().err


@pytest.mark.slow  # a launch.py run to its first compile: 30-120 s on a shared 2-core machine
def test_a_second_ctrl_c_during_the_first_compile_exits_at_once_in_one_line_leaving_no_workdir(tmp_path):
    """issue 40: Python's handler waits for the compile (C++, minutes) to return, so a second Ctrl-C there
    did nothing until then, and the exit left the half-made workdir (lock, config.json, log) behind."""
    w = tmp_path / "w"
    # a model shape no other test compiles: the session's compilation cache would make the compile instant
    proc = launch(w, "--config.num_train_steps=1000", "--config.model.conv_channels=5", wait=False)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while (
        # the first compile: on one CPU host the memory check compiles the step (the loop reuses it)
        not any("compiling the train step" in line for line in lines) and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    second = time.monotonic()
    proc.wait(timeout=300)
    reader.join(10)
    seen = "".join(lines)
    assert proc.returncode == 128 + signal.SIGINT, seen[-3000:]
    assert time.monotonic() - second < 5 and "first step (compile + run)" not in seen, seen[-3000:]  # in the compile
    lines = seen.strip().splitlines()
    assert (
        lines[-1] == f"ds2_jax: received SIGINT again: exiting now without writing a checkpoint; removed {w}, "
        "which this run created and wrote no result to"
    ), seen[-3000:]
    assert "Traceback" not in seen and seen.count("received SIGINT again") == 1 and not w.exists()


@pytest.mark.slow
def test_the_watchdog_counts_compiles_evals_and_saves_as_progress(tmp_path, monkeypatch):
    """An eval longer than step_timeout_s (each batch of the second slowed down here), the first compile
    (and the first eval, which compiles) and the checkpoint saves never trip the watchdog; a hang still does
    (test_hung_step_*)."""
    exits = []
    monkeypatch.setattr(resilience.os, "_exit", exits.append)
    greedy = evaluation.decoding.greedy_texts
    batches = []

    def slow_greedy(*args):  # the second eval's 4 batches (the first eval runs with the watchdog suspended)
        batches.append(1)
        if len(batches) > 4:
            time.sleep(1.0)
        return greedy(*args)

    monkeypatch.setattr(evaluation.decoding, "greedy_texts", slow_greedy)
    config = run_config(eval_every_steps=3, step_timeout_s=2.5, **{"eval.max_utterances": 64})  # 4 batches: 4 s
    train.train_and_evaluate(config, str(tmp_path / "w"))
    evals = [r for r in metrics.read_jsonl(str(tmp_path / "w" / "metrics.jsonl")) if "eval_wer" in r]
    assert [r["step"] for r in evals] == [3, 6] and len(batches) == 8
    assert exits == []


def test_the_watchdog_does_not_fire_while_suspended_and_fires_after(monkeypatch):
    exits = []
    monkeypatch.setattr(resilience.os, "_exit", exits.append)
    dog = resilience.Watchdog(0.4)
    try:
        with dog.suspended("compiling"):
            time.sleep(1.2)
        assert exits == []
        time.sleep(1.5)
        assert exits and exits[0] == resilience.Watchdog.EXIT_CODE
    finally:
        dog.close()


def test_a_missing_eval_split_is_found_before_training(tmp_path):
    """dataset.eval_split absent from the prepared data: an error naming it before the first
    step (it used to surface at the first eval, thousands of steps in, before that step's
    checkpoint, so a requeued job looped)."""
    from ds2_jax.datasets import build
    from tests import librispeech_testdata as td

    manual = tmp_path / "manual"
    td.write_bad_inputs(str(manual / "LibriSpeech" / "dev-clean"))
    data_dir = str(tmp_path / "tfds")
    build.build(str(manual), data_dir)
    config = tiny_config(
        **{
            "dataset.name": "librispeech_local",
            "dataset.manual_dir": str(manual),
            "dataset.data_dir": data_dir,
            "dataset.train_splits": "dev-clean",
            "dataset.eval_split": "test-clean",
            "eval_every_steps": 4,
            "num_devices": 1,
            "per_device_batch_size": 1,
            "dataset.num_workers": 0,
        }
    )
    w = tmp_path / "w"
    with pytest.raises(ValueError, match="dataset.eval_split='test-clean': split 'test_clean' is not in the prepared"):
        train.train_and_evaluate(config, str(w))
    assert not (w / "metrics.jsonl").exists() and not os.listdir(w / "checkpoints")  # no step trained


def test_eval_result_names_tell_every_decoder_apart_and_are_written_atomically(six_steps, tmp_path, monkeypatch):
    """Two beam+LM evals with another LM (even one named alike) or alpha/beta wrote the same
    eval-...-beam32-lm.json: the first was lost. And a kill mid-write left a torn file."""
    import types

    from ds2_jax import settings

    def beam(**changes):
        cfg = dataclasses.replace(settings.Decoding(beam_width=32), **changes)
        return types.SimpleNamespace(cfg=cfg, alpha=cfg.alpha, beta=cfg.beta)

    decoders = [
        None,
        beam(),
        beam(beam_width=8),
        beam(beam_prune_logp=-5.0),
        beam(lm_path="a/lm.arpa"),
        beam(lm_path="b/lm.arpa"),
        beam(lm_path="a/lm.arpa", alpha=1.0),
        beam(lm_path="a/lm.arpa", beta=0.0),
        beam(lm_path="a/lm.arpa", lexicon_path="words.txt"),
    ]
    names = [evaluation.result_path("w", "dev-clean", 6, d) for d in decoders]
    assert len(set(names)) == len(names), names
    assert names[:3] == [os.path.join("w", f"eval-dev-clean-6-{t}.json") for t in ("greedy", "beam32", "beam8")]
    assert os.path.basename(names[4]).startswith("eval-dev-clean-6-beam32-lm-lm-a0.5-b1-")
    assert names[4] == evaluation.result_path("w", "dev-clean", 6, beam(lm_path="a/lm.arpa"))  # same decoder, same name
    # issue 40: a result over a subset (eval.max_utterances) never replaces the whole split's
    subsets = [evaluation.result_path("w", "dev-clean", 6, d, n) for d in (None, beam()) for n in (0, 8, 16)]
    assert len(set(subsets)) == 6 and subsets[0] == names[0] and subsets[1].endswith("-greedy-max8.json")

    w = copy_of(six_steps, tmp_path)
    path = os.path.join(w, "eval-dev-clean-6-greedy-max8.json")
    open(path, "w").write('{"old": 1}')

    def torn_dump(obj, f, **kwargs):
        f.write('{"wer": 0.')
        raise KeyboardInterrupt  # killed mid-write

    monkeypatch.setattr(evaluation.json, "dump", torn_dump)
    with pytest.raises(KeyboardInterrupt):
        evaluation.evaluate_checkpoint(run_config(), w)
    assert open(path).read() == '{"old": 1}'


def test_the_prepared_data_fingerprint_sees_a_same_size_transcript_edit(tmp_path, caplog):
    from ds2_jax.datasets import build
    from tests import librispeech_testdata as td

    manual = tmp_path / "manual"
    td.write_bad_inputs(str(manual / "LibriSpeech" / "dev-clean"))
    data_dir = str(tmp_path / "tfds")
    build.build(str(manual), data_dir)
    build.build(str(manual), data_dir)  # unchanged: fine
    transcript = sorted((manual / "LibriSpeech" / "dev-clean").rglob("*.trans.txt"))[0]
    text = transcript.read_bytes()
    i = next(
        i
        for i in range(len(text) - 1)
        if chr(text[i]).isalpha() and chr(text[i + 1]).isalpha() and text[i] != text[i + 1] and i > text.index(b" ")
    )
    transcript.write_bytes(text[:i] + text[i + 1 : i + 2] + text[i : i + 1] + text[i + 2 :])  # two letters swapped
    with pytest.raises(errors.DatasetMismatch, match="the same sizes but other transcript text"):
        build.build(str(manual), data_dir)
    # A record from before the transcripts were hashed: checked by sizes, then upgraded.
    record = os.path.join(os.fspath(build.get_builder(data_dir).data_dir), build.SOURCE_RECORD)
    old = json.load(open(record))
    del old["content_fingerprint"]
    open(record, "w").write(json.dumps(old))
    with caplog.at_level("INFO"):
        build.build(str(manual), data_dir)
    assert "recorded its manual dir's file sizes only" in caplog.text
    assert "content_fingerprint" in json.load(open(record))


def test_long_audio_is_transcribed_in_windows_with_memory_bounded_by_the_window(six_steps, monkeypatch):
    """A long file runs as overlapping windows (here 3 s, 1 s of context each side): no
    forward pass sees more than a window, the joined outputs have the whole file's frames
    and match a single pass away from the edges; a failing batch fails only its files."""
    from ds2_jax.infer import engine, jax_backend

    t = jax_backend.JaxEngine(six_steps[0], batch_size=4)
    rng = np.random.default_rng(0)
    long = (rng.standard_normal(16_000 * 11) * 3000).astype(np.int16)  # 11 s
    whole = t.frame_outputs([long])[0]  # one pass (the default window is longer)
    monkeypatch.setattr(engine, "WINDOW_SECONDS", 3.0)
    monkeypatch.setattr(engine, "CONTEXT_SECONDS", 1.0)
    shapes = []
    forward = t._forward
    t._forward = lambda audio, lengths: shapes.append(audio.shape) or forward(audio, lengths)
    short = long[: 16_000 * 2]
    windowed, alone = t.frame_outputs([long, short])
    assert max(s[1] for s in shapes) <= engine.PAD_SECONDS * 16_000  # 3 s windows, padded to 4 s
    assert windowed.shape == whole.shape and len(t.windows(len(long))) > 3
    assert np.mean(windowed == whole) > 0.98  # greedy ids: 1 s of context each side is plenty here
    np.testing.assert_array_equal(alone, t.frame_outputs([short])[0])

    def fails_on_long_batches(audio, lengths):
        if lengths.max() > 16_000 * 2.5:
            raise MemoryError("RESOURCE_EXHAUSTED: out of memory")
        return forward(audio, lengths)

    t._forward = fails_on_long_batches
    t.batch_size = 1
    texts = t.transcribe_each([long, short])
    assert isinstance(texts[0], MemoryError) and isinstance(texts[1], str)


# ----------------------------------------------------------------------------- non-finite state, part by part


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("part", ["params", "opt_state", "batch_stats", "feature_mean", "feature_std"])
def test_a_non_finite_value_in_any_part_of_the_state_is_refused_at_save_naming_it(tmp_path, part, value):
    """One NaN or inf in one leaf of one part of the state (parameters, optimizer moments, batch-norm
    statistics, feature statistics): checkpoint.save_or_explain writes nothing and names that part."""
    import jax

    from ds2_jax import checkpoint
    from ds2_jax import state as state_lib
    from tests.helpers import tiny_settings

    config = tiny_settings()
    state = jax.device_get(
        state_lib.create_state(config, jax.random.PRNGKey(0), np.zeros(161, np.float32), np.ones(161, np.float32))
    )
    leaves = [
        (path, leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(getattr(state, part))
        if np.issubdtype(np.asarray(leaf).dtype, np.inexact)
    ]
    path, leaf = leaves[-1]
    bad_leaf = np.array(leaf, copy=True)
    bad_leaf.reshape(-1)[-1] = value
    bad_part = jax.tree_util.tree_map_with_path(lambda p, x: bad_leaf if p == path else x, getattr(state, part))
    mgr = checkpoint.manager(str(tmp_path))
    checkpoint.save_or_explain(mgr, 1, state)  # the finite state saves
    mgr.wait_until_finished()
    with pytest.raises(FloatingPointError) as e:
        checkpoint.save_or_explain(mgr, 2, state.replace(**{part: bad_part}))
    assert f".{part}{jax.tree_util.keystr(path)}" in str(e.value), str(e.value)
    assert "1 array," in str(e.value) and mgr.all_steps() == [1]
    mgr.close()


def test_a_checkpoint_deleted_while_read_gives_the_newest_not_being_written(tmp_path):
    """transcribe or eval beside a run with keep_checkpoints=1: the step it listed is deleted after the
    run's next save; it takes that newer checkpoint, never calling the deleted one 'being written'."""
    from ds2_jax import checkpoint

    writer = checkpoint.manager(str(tmp_path), keep=1)
    tree = {"w": np.ones(3, np.float32)}
    writer.save(1, args=checkpoint.ocp.args.StandardSave(tree))
    writer.wait_until_finished()
    reader = checkpoint.manager(str(tmp_path), keep=1)  # lists step 1
    assert reader.all_steps() == [1]
    writer.save(2, args=checkpoint.ocp.args.StandardSave({"w": np.full(3, 2.0, np.float32)}))
    writer.wait_until_finished()  # step 1 deleted (keep 1)
    assert not os.path.isdir(tmp_path / "checkpoints" / "1")
    state, step = checkpoint.restore_latest(reader, tree)
    assert step == 2 and float(state["w"][0]) == 2.0
