"""Several processes (jax.distributed, gloo CPU collectives): 2 processes x 4 devices
train like 1 process x 8 devices (under pmap, killed, and resumed under jit), and a killed
peer ends the other process with exit code 3 and one line."""

import os
import signal
import socket
import time

import numpy as np
import pytest

from ds2_jax import metrics
from tests import helpers

pytestmark = pytest.mark.e2e

ARGS = [
    "--config=configs/smoke.py",
    "--config.num_train_steps=6",
    "--config.log_every_steps=1",
    "--config.eval_every_steps=6",
    "--config.eval.max_utterances=32",
    "--config.checkpoint_every_steps=3",
    "--config.per_device_batch_size=2",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_processes(workdir, num_processes, devices_per_process, *extra):
    port = free_port()
    procs = []
    for pid in range(num_processes):
        dist = (
            []
            if num_processes == 1
            else [f"--coordinator_address=localhost:{port}", f"--num_processes={num_processes}", f"--process_id={pid}"]
        )
        procs.append(
            helpers.launch(
                f"--workdir={workdir}",
                *ARGS,
                *dist,
                *extra,
                devices=devices_per_process,
                wait=False,
                quick_compile=True,
            )
        )
    results = [p.communicate(timeout=600) for p in procs]
    return [p.returncode for p in procs], [err for _, err in results]


def losses(workdir, evals=1):
    """Train losses, then the final eval's loss, WER and CER (gathered over processes); `evals`: how
    many evals the run wrote (0: the train losses only)."""
    records = metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    scored = [[r["eval_loss"], r["eval_wer"], r["eval_cer"]] for r in records if "eval_loss" in r]
    assert len(scored) == evals
    return [r["loss"] for r in records if "loss" in r] + (scored[0] if scored else [])


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The reference: one process of 8 devices under pmap (its workdir). test_train.py's
    test_jit_sharding_path_matches_pmap holds that jit on one process trains like it."""
    w = tmp_path_factory.mktemp("single")
    rcs, errs = run_processes(w, 1, 8)
    assert rcs == [0], errs[0][-3000:]
    return w


@pytest.mark.slow
def test_two_processes_match_one_process_and_resume_after_kill_under_jit(tmp_path, single):
    """kill -9 both processes (pmap) before the last step's eval (every train step done, checkpoint 3
    the newest): their steps 1-6 match one process's. Then the same command again, under
    parallelism='jit' over every process's devices: it resumes from checkpoint 3, the eval step reads
    each process's rows of its batch-sharded outputs (Parallel.get_rows), and steps 4-6 and the gathered
    eval figures match one process's."""
    w = tmp_path / "killed"
    rcs, _ = run_processes(w, 2, 4, "--config.faults.kill_at=eval:6")
    assert rcs == [-signal.SIGKILL] * 2
    uninterrupted = losses(single)[:6]
    np.testing.assert_allclose(losses(w, evals=0), uninterrupted, rtol=1e-5)
    rcs, errs = run_processes(w, 2, 4, "--config.parallelism=jit", "--config.num_devices=0")
    assert rcs == [0, 0], "\n".join(e[-3000:] for e in errs)
    assert "restored checkpoint at step 3" in errs[0]
    assert "process 1 of 2" in errs[1]
    assert "x 2 process(es), jit" in errs[0]
    assert "(32 utterances)" in errs[0]  # process 0 scored both processes' rows
    np.testing.assert_allclose(losses(w), losses(single), rtol=1e-5)


@pytest.mark.slow
def test_a_killed_peer_ends_the_survivor_at_once_with_code_3_and_one_line(tmp_path):
    """issue 40: after kill -9 of one process, the other's collective failed (gloo: connection reset by
    peer), its traceback printed, then jax.distributed's shutdown waited for the dead peer and aborted
    ~100 s later with a C++ stack trace (rc -6). Now: one `error:` line, exit 3, as the watchdog's."""
    common = [
        f"--workdir={tmp_path}",
        *ARGS,
        "--config.num_train_steps=200",
        "--config.checkpoint_every_steps=200",
        "--config.eval_every_steps=0",
        "--config.step_timeout_s=30",
        f"--coordinator_address=localhost:{free_port()}",
        "--num_processes=2",
    ]
    survivor = helpers.launch(*common, "--process_id=0", devices=1, wait=False, quick_compile=True)
    victim = helpers.launch(
        *common, "--process_id=1", "--config.faults.kill_at=step:3", devices=1, wait=False, quick_compile=True
    )
    victim.communicate(timeout=600)
    assert victim.returncode == -signal.SIGKILL
    killed = time.monotonic()
    _, err = survivor.communicate(timeout=600)
    lines = err.strip().splitlines()
    assert survivor.returncode == 3, err[-3000:]
    assert lines[-1].startswith("error: process 0 of 2: another process of this run is gone"), err[-3000:]
    assert "Traceback" not in err and "Check failure" not in err and "step 200" not in err
    assert time.monotonic() - killed < 30, err[-3000:]  # the collective's error, not a timeout
