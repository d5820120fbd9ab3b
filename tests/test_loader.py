"""Input off the critical path: grain workers give the inline batches, resume exactly,
fail clearly; the synthetic pool; device staging; the input-wait warning."""

import logging

import jax
import numpy as np
import pytest

from ds2_jax import errors, parallel, reporting, settings, train
from ds2_jax.datasets import build
from ds2_jax.pipeline import loader, synthetic
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import DataSettings, make_source
from tests import librispeech_testdata as td
from tests.helpers import tiny_config, tiny_settings
from tests.test_tfds_source import TRAIN_SECONDS, make_config

BATCH = 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    manual = str(root / "manual")
    td.write_durations_corpus(manual, "train-clean-100", TRAIN_SECONDS)
    td.write_durations_corpus(manual, "test-clean", [1.5, 2.0, 2.5], first_speaker=50)
    build.build(manual, str(root / "tfds"))  # once, before any sharded or worker reader
    return {"manual": manual, "data_dir": str(root / "tfds")}


def batches(config, sharding, start, stop):
    config = settings.from_config_dict(config)
    source = make_source(config, sharding)
    return list(loader.train_batches(config, sharding, source, start, stop))


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.mark.parametrize("process_index", [0, 1])
def test_workers_give_exactly_the_inline_batches(corpus, process_index):
    sharding = Sharding(BATCH, process_index, 2)
    start, stop = 3, 3 + 12  # crosses the epoch boundary (8 steps per epoch)
    inline = batches(make_config(corpus, sortagrad=False, num_workers=0), sharding, start, stop)
    workers = batches(make_config(corpus, sortagrad=False, num_workers=3), sharding, start, stop)
    assert_same_batches(inline, workers)
    assert len({b["audio"].shape for b in inline}) > 1  # several buckets went through the workers
    # The two processes read different rows of the same global batches.
    other = batches(
        make_config(corpus, sortagrad=False, num_workers=0), Sharding(BATCH, 1 - process_index, 2), start, stop
    )
    assert not np.array_equal(inline[0]["audio_lengths"], other[0]["audio_lengths"])


@pytest.mark.timeout(180)
def test_a_dead_worker_is_a_clear_error_not_a_hang(corpus):
    config = make_config(corpus, num_workers=2)
    config.faults.kill_input_worker_at_step = 4
    with pytest.raises(errors.InputWorkerError, match="num_workers=0"):
        batches(config, Sharding(BATCH), 0, 10)


def corpus_train_config(corpus, **overrides):
    c = make_config(corpus, sortagrad=False, num_buckets=1, feature_stats_utterances=8)
    c.per_device_batch_size, c.num_devices = 2, 2
    c.log_every_steps, c.eval_every_steps, c.checkpoint_every_steps = 2, 0, 3
    c.model.conv_channels, c.model.num_rnn_layers, c.model.rnn_size = 4, 1, 16
    c.update(overrides)
    return c


@pytest.mark.slow  # 15-60 s on 2 idle cores (2026-12-05): make test runs it, test-fast does not
@pytest.mark.timeout(600)
def test_resume_with_workers_is_bit_identical(corpus, tmp_path):
    full = train.train_and_evaluate(corpus_train_config(corpus, num_train_steps=5), str(tmp_path / "full"))
    split = str(tmp_path / "split")
    workers = {"dataset": {**corpus_train_config(corpus).dataset.to_dict(), "num_workers": 2}}
    train.train_and_evaluate(corpus_train_config(corpus, num_train_steps=3, **workers), split)
    resumed = train.train_and_evaluate(corpus_train_config(corpus, num_train_steps=5, **workers), split)
    assert int(resumed.step) == int(full.step) == 5
    for a, b in zip(jax.tree_util.tree_leaves(full.params), jax.tree_util.tree_leaves(resumed.params)):
        np.testing.assert_array_equal(a, b)
    rows = [r for r in td_read_jsonl(split) if "input_wait_s" in r]
    assert rows and all(r["input_wait_s"] >= 0 for r in rows) and len(rows) == len(td_read_jsonl(split))


def td_read_jsonl(workdir):
    import json
    import os

    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_num_workers_resolves_from_the_cores(monkeypatch):
    def workers(**dataset):
        return loader.resolve_num_workers(settings.Dataset(**dataset))

    tfds = {"name": "librispeech_local", "manual_dir": "unused"}
    monkeypatch.setattr(loader.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert workers(**tfds) == 14  # the default: -1, from the cores
    monkeypatch.setattr(loader.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert workers(**tfds) == loader.MAX_AUTO_WORKERS
    monkeypatch.setattr(loader.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert workers(**tfds) == 0
    assert workers(**tfds, num_workers=5) == 5
    assert workers(num_workers=-1) == 0  # synthetic
    with pytest.raises(ValueError, match="dataset.num_workers"):  # checked once, with every setting
        settings.from_config_dict(tiny_config(**{"dataset.num_workers": -2}))


def test_synthetic_pool_repeats_after_its_size_and_keeps_eval_apart():
    config = tiny_settings(**{"dataset.synthetic_pool_size": 6})
    src = synthetic.SyntheticSource(DataSettings.of(config), Sharding(4))
    a, b = src.utterance(1), src.utterance(7)
    assert a is b  # pooled, not regenerated
    assert not np.array_equal(src.utterance(1)["audio"][:100], src.utterance(2)["audio"][:100])
    np.testing.assert_array_equal(src.train_batch(1)["audio"][2:], src.train_batch(0)["audio"][:2])  # 6, 7 = 0, 1
    np.testing.assert_array_equal(src.train_batch(3)["audio"], src.train_batch(0)["audio"])  # 12..15 = 0..3
    assert src.train_batch(3) is src.train_batch(0)  # the same padded batch, handed out again
    assert not src.train_batch(0)["audio"].flags.writeable  # so nobody can change what later steps get
    held_out = src.utterance(synthetic.EVAL_INDEX_OFFSET + 1)
    assert all(not np.array_equal(held_out["audio"], src.utterance(i)["audio"]) for i in range(6))
    # A fresh source (what a resumed run opens) gives the same batches.
    fresh = synthetic.SyntheticSource(DataSettings.of(config), Sharding(4))
    assert_same_batches([src.train_batch(5)], [fresh.train_batch(5)])
    with pytest.raises(ValueError, match="synthetic_pool_size"):
        synthetic.SyntheticSource(DataSettings.of(tiny_settings(**{"dataset.synthetic_pool_size": 0})), Sharding(4))


@pytest.mark.parametrize("kind", ["pmap", "jit"])
def test_staged_batches_are_the_host_rows_on_each_device(kind):
    devices = jax.local_devices()[:4]
    par = parallel.Parallel(kind, devices)
    host = [
        {"audio": np.arange(8 * 5, dtype=np.int16).reshape(8, 5) + 100 * i, "weights": np.arange(8, dtype=np.float32)}
        for i in range(3)
    ]
    staged = list(par.put_batches(iter(host), 2))
    assert len(staged) == 3
    for h, s in zip(host, staged):
        audio = s["audio"]
        assert {sh.device for sh in audio.addressable_shards} == set(devices)
        got = np.asarray(audio).reshape(8, 5)
        np.testing.assert_array_equal(got, h["audio"])
        first = sorted(audio.addressable_shards, key=lambda sh: devices.index(sh.device))[0]
        np.testing.assert_array_equal(np.asarray(first.data).reshape(-1, 5), h["audio"][:2])


def test_input_wait_warns_once_after_two_slow_intervals(caplog):
    wait = loader.InputWait(0.05, num_workers=3)
    with caplog.at_level(logging.WARNING, logger="ds2_jax"):
        wait.add(0.5)
        assert wait.take(1.0) == 0.5  # one slow interval (a compile, a checkpoint): no warning
        wait.add(0.01)
        assert wait.take(1.0) == 0.01
        wait.add(0.5)
        wait.take(1.0)
        assert not caplog.records
        wait.add(0.2)
        wait.take(1.0)  # second slow interval in a row
        wait.add(0.9)
        wait.take(1.0)
    assert len(caplog.records) == 1 and "num_workers (now 3)" in caplog.records[0].getMessage()
    assert wait.take(1.0) == 0.0  # taken intervals reset


def test_staging_thread_reraises_upstream_errors_and_closes_upstream():
    par = parallel.Parallel("pmap", jax.local_devices()[:2])
    closed = []

    def failing():
        try:
            yield {"x": np.zeros((2, 3), np.float32)}
            raise errors.InputWorkerError("worker 1 died")
        finally:
            closed.append(True)

    staged = par.put_batches(failing(), 2)
    assert np.asarray(next(staged)["x"]).shape == (2, 1, 3)
    with pytest.raises(errors.InputWorkerError, match="worker 1 died"):
        next(staged)
    staged.close()
    assert closed == [True]

    def endless():
        try:
            while True:
                yield {"x": np.ones((2, 3), np.float32)}
        finally:
            closed.append("endless")

    staged = par.put_batches(endless(), 2)
    next(staged)
    staged.close()  # returns (no hang) and closes the host iterator: that stops the workers
    assert closed[-1] == "endless"


class _Step:
    """Stands in for a dispatched step's metrics: finished or still running."""

    def __init__(self, done: bool):
        self.done = done

    def is_ready(self) -> bool:
        return self.done


def test_input_wait_counts_only_time_the_devices_sit_idle():
    import time

    def slow():
        while True:
            time.sleep(0.05)
            yield {"x": np.zeros((1, 2), np.float32)}

    staged = parallel.Parallel("pmap", jax.local_devices()[:1]).put_batches(slow(), 1)
    try:
        next(staged)  # the thread is now producing the next batch, 50 ms away
        _, idle = reporting.next_batch(staged, {"steps": _Step(done=True)})
        assert 0.03 < idle < 0.5  # the step had finished: all of the wait is input-bound
        _, idle = reporting.next_batch(staged, {"steps": _Step(done=False)})
        assert idle == 0.0  # the step was still running the whole time: waiting cost nothing
    finally:
        staged.close()


def test_compilation_cache_goes_where_configured_unless_the_environment_says(monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "env"))
    assert parallel.enable_compilation_cache(str(tmp_path / "cfg")) == str(tmp_path / "env")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    before = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        assert parallel.enable_compilation_cache("") is None
        assert parallel.enable_compilation_cache(str(tmp_path / "cfg")) == str(tmp_path / "cfg")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cfg") and (tmp_path / "cfg").is_dir()
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_process_that_read_with_workers_leaves_no_shared_memory_behind(corpus):
    """Batches still alive when the interpreter exits (the last one on the devices) used to leave
    their segments to resource_tracker: 'There appear to be N leaked shared_memory objects'."""
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT

    script = f"""
from ds2_jax.pipeline import loader
from ds2_jax.pipeline.batch import Sharding
from ds2_jax import settings
from ds2_jax.pipeline.source import make_source
from tests.test_tfds_source import make_config
config = settings.from_config_dict(make_config({corpus!r}, num_workers=2))
sharding = Sharding({BATCH}, 0, 1)
kept = list(loader.train_batches(config, sharding, make_source(config, sharding), 0, 4))
print(sum(len(b) for b in kept), "arrays kept until exit")
"""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert proc.returncode == 0 and "arrays kept until exit" in proc.stdout, proc.stderr[-3000:]
    assert "leaked shared_memory" not in proc.stderr, proc.stderr[-3000:]


ORPHAN_SCRIPT = """
import json, multiprocessing, sys, time
from multiprocessing import resource_tracker
from ds2_jax import settings
from ds2_jax.pipeline import loader
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import make_source
from tests.helpers import tiny_settings
config = tiny_settings(**{"dataset.num_workers": 2, "per_device_batch_size": 1,
                          "dataset.synthetic_min_duration_s": 0.5, "dataset.synthetic_max_duration_s": 0.6})
source = make_source(config, Sharding(2))
batches = loader.train_batches(config, Sharding(2), source, 0, 1000)
next(batches)
print(json.dumps({"workers": [p.pid for p in multiprocessing.active_children()],
                  "tracker": resource_tracker._resource_tracker._pid}), flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may never reap an orphan)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(180)
def test_input_workers_and_the_resource_tracker_die_with_a_killed_trainer():
    """issue 40: after kill -9 of the trainer with num_workers=2 both workers and the resource
    tracker stayed alive, holding 110 /dev/shm segments. Workers watch their parent and exit."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests import helpers

    proc = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_SCRIPT],
        cwd=helpers.ROOT,
        env=helpers.repo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids = {"workers": []}
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()[-2000:]
        pids = json.loads(line)
        assert len(pids["workers"]) == 2 and all(_running(p) for p in pids["workers"])
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.time() + 60
        while any(_running(p) for p in [*pids["workers"], pids["tracker"]] if p) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(_running(p) for p in pids["workers"]), "an input worker outlived the killed trainer"
        assert not (pids["tracker"] and _running(pids["tracker"])), "the resource tracker outlived the trainer"
    finally:  # a failing run leaves no orphans behind either
        proc.kill()
        for pid in pids["workers"]:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
