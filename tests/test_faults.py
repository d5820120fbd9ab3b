"""Fault injection: every failure a long run meets, and what is kept.

kill -9 at three points, SIGTERM, a damaged newest checkpoint, non-finite steps, a
hung step, an unwritable or full workdir, out-of-memory, bad configs.
"""

import json
import os
import signal
import subprocess
import time

import jax
import numpy as np
import pytest

from ds2_jax import checkpoint, input_pipeline, resilience, train
from tests import helpers
from tests.helpers import tiny_config

COMMON = ["--config.num_train_steps=8", "--config.log_every_steps=2", "--config.checkpoint_every_steps=3",
          "--config.eval_every_steps=4", "--config.eval.max_utterances=8"]


def launch(workdir, *extra, wait=True):
    """launch.py with COMMON: (exit status, stderr), or the running process with wait=False."""
    proc = helpers.launch(f"--workdir={workdir}", *COMMON, *extra, wait=wait)
    return (proc.returncode, proc.stderr) if wait else proc


def final_params(workdir):
    config = tiny_config()
    source = input_pipeline.make_source(config, input_pipeline.Sharding(16))
    template = train.initial_state(config, source, jax.random.PRNGKey(0))
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
@pytest.mark.parametrize("kill_at", ["step:5", "checkpoint:6", "eval:4"])
def test_kill_9_then_rerun_matches_uninterrupted_bit_for_bit(tmp_path, uninterrupted, kill_at):
    rc, _ = launch(tmp_path, f"--config.faults.kill_at={kill_at}")
    assert rc == -signal.SIGKILL
    rc, err = launch(tmp_path)
    assert rc == 0, err[-2000:]
    step, params = final_params(tmp_path)
    assert step == uninterrupted[0] == 8
    for a, b in zip(params, uninterrupted[1]):
        np.testing.assert_array_equal(a, b)
    steps = [json.loads(l)["step"] for l in open(tmp_path / "metrics.jsonl") if "loss" in l and "eval" not in l]
    assert steps == [2, 4, 6, 8]  # records of repeated steps are not duplicated


@pytest.mark.slow
@pytest.mark.e2e
def test_sigterm_checkpoints_and_exits_zero_then_resumes(tmp_path):
    proc = launch(tmp_path, "--config.num_train_steps=100000", "--config.log_every_steps=1",
                  "--config.checkpoint_every_steps=100000", "--config.eval_every_steps=0", wait=False)
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
    rc, err = launch(tmp_path, f"--config.num_train_steps={saved + 2}", "--config.eval_every_steps=0")
    assert rc == 0 and f"restored checkpoint at step {saved}" in err


def _corrupt(directory, how):
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            if how == "truncate":
                with open(path, "r+b") as f:
                    f.truncate(max(os.path.getsize(path) // 3, 0))
            else:
                os.remove(path)


@pytest.mark.parametrize("how", ["truncate", "delete"])
def test_damaged_latest_checkpoint_falls_back_with_warning(tmp_path, how, caplog):
    common = {"log_every_steps": 3, "eval_every_steps": 0, "checkpoint_every_steps": 3}
    train.train_and_evaluate(tiny_config(num_train_steps=6, **common), str(tmp_path))
    _corrupt(tmp_path / "checkpoints" / "6", how)
    with caplog.at_level("INFO", logger="ds2_jax"):
        state = train.train_and_evaluate(tiny_config(num_train_steps=7, **common), str(tmp_path))
    assert "checkpoint 6" in caplog.text and "damaged" in caplog.text
    assert "restored checkpoint at step 3" in caplog.text
    assert int(state.step) == 7
    _corrupt(tmp_path / "checkpoints", how)
    with pytest.raises(RuntimeError, match="none of the checkpoints"):
        train.train_and_evaluate(tiny_config(num_train_steps=9, **common), str(tmp_path))


def test_non_finite_steps_skipped_counted_and_bounded(tmp_path):
    common = {"log_every_steps": 1, "eval_every_steps": 0, "checkpoint_every_steps": 100}
    train.train_and_evaluate(tiny_config(num_train_steps=6, **common, **{"faults.nan_at_steps": "2,3"}), str(tmp_path / "a"))
    records = [json.loads(l) for l in open(tmp_path / "a" / "metrics.jsonl")]
    assert [r["skipped_steps"] for r in records] == [0, 0, 1, 2, 2, 2]
    assert all(np.isfinite(r["loss"]) for r in records)
    bad = tiny_config(num_train_steps=20, **common, **{"faults.nan_at_steps": "1-20", "optimizer.max_consecutive_skips": 3})
    with pytest.raises(FloatingPointError, match="3 consecutive steps"):
        train.train_and_evaluate(bad, str(tmp_path / "b"))


@pytest.mark.slow
@pytest.mark.e2e
def test_hung_step_ends_with_an_error_instead_of_hanging(tmp_path):
    start = time.time()
    rc, err = launch(tmp_path, "--config.faults.hang_at_step=3", "--config.step_timeout_s=5", "--config.eval_every_steps=0")
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
        train.train_and_evaluate(tiny_config(**{"model.rnn_size": 256}), str(small_disk / "run"))


def test_out_of_memory_names_the_settings_to_lower():
    config = tiny_config()

    def exhausted(*args):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 123 bytes")

    batch = {"audio": np.zeros((1, 16, 128000), np.int16)}
    with pytest.raises(MemoryError) as err:
        train._run_step(exhausted, None, batch, None, config, first=True)
    assert "per_device_batch_size" in str(err.value) and "max_duration_s" in str(err.value)
    assert "(1, 16, 128000)" in str(err.value)


def test_missing_dataset_is_a_clear_error(tmp_path):
    config = tiny_config(**{"dataset.name": "librispeech_local", "dataset.manual_dir": str(tmp_path / "nowhere"),
                            "dataset.data_dir": str(tmp_path / "tfds")})
    with pytest.raises(FileNotFoundError, match="manual_dir.*is missing or empty"):
        train.train_and_evaluate(config, str(tmp_path / "w"))
