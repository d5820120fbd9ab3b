"""ds2_jax.errors: the one-line message is the last thing on stderr; which errors are a full disk."""

import errno
import subprocess
import sys

import pytest

from ds2_jax import errors
from tests import helpers

LATE_WRITER = """
import os, sys, threading
from ds2_jax import errors

started, noisy = threading.Event(), threading.Event()

def wind_down():  # like orbax's threads: they print while the main thread reports the error
    started.set()
    noisy.wait()
    while True:
        print("Traceback: Event loop is closed", file=sys.stderr, flush=True)
        os.write(2, b"C++ noise\\n")

def fail():
    threading.Thread(target=wind_down, daemon=True).start()
    started.wait()
    noisy.set()
    raise errors.Ds2Error("the message")

errors.run_explained(fail, sys.argv[1])
"""


def test_other_threads_output_after_an_error_goes_to_the_log(tmp_path):
    proc = subprocess.run([sys.executable, "-c", LATE_WRITER, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, cwd=helpers.ROOT)
    assert proc.returncode == 1
    # (a line the thread had half written when stderr moved may end in front of the message)
    assert "error: the message [traceback:" in proc.stderr.splitlines()[-1], proc.stderr[-2000:]
    assert proc.stderr.split("error: the message")[-1].count("\n") == 1, proc.stderr[-2000:]  # nothing after it
    assert "Ds2Error" in (tmp_path / "error.log").read_text()


# ----------------------------------------------------------------------------- classification
# (Rules of ds2_jax.errors.is_disk_full; the errno cases carry a neutral message so that each
# rule is tested on its own, not through the text of the other.)

@pytest.mark.parametrize("err,disk_full", [
    (OSError(errno.ENOSPC, "write failed"), True),
    (OSError(errno.EDQUOT, "write failed"), True),  # a quota is a full disk to the user
    (PermissionError(errno.EACCES, "write failed"), False),
    (OSError(errno.EROFS, "write failed"), False),
    (FileNotFoundError(errno.ENOENT, "write failed"), False),
    (OSError(errno.EIO, "write failed"), False),
    (OSError("write failed"), False),  # no errno
    (RuntimeError("tensorstore: Error writing 'x': No space left on device"), True),  # wrapped, as text only
    (RuntimeError("tensorstore: Error writing 'x': Disk quota exceeded"), True),
    (ValueError("model.rnn_size=0: must be >= 1"), False),
], ids=["ENOSPC", "EDQUOT", "EACCES", "EROFS", "ENOENT", "EIO", "no-errno", "text-ENOSPC", "text-EDQUOT", "other"])
def test_disk_full_is_recognized_by_errno_and_by_wrapped_text(err, disk_full):
    assert errors.is_disk_full(err) is disk_full


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_or_quota_is_explained_as_disk_full_by_checkpoint_and_metrics_writes(tmp_path, monkeypatch, code):
    from types import SimpleNamespace

    from ds2_jax import checkpoint, metrics

    mgr = SimpleNamespace(directory=str(tmp_path))
    err = checkpoint.explain_save_error(mgr, 7, OSError(code, "write failed"))
    assert isinstance(err, errors.DiskFull) and "disk full" in str(err)
    other = checkpoint.explain_save_error(mgr, 7, OSError(errno.EACCES, "write failed"))
    assert type(other) is errors.CheckpointError
    writer = metrics.MetricWriter(str(tmp_path), enabled=True)
    try:
        writer.write(1, {"loss": 1.0})

        def failing_dumps(*args, **kwargs):
            raise OSError(code, "write failed")

        monkeypatch.setattr(metrics.json, "dumps", failing_dumps)
        with pytest.raises(errors.DiskFull, match="writing metrics to .* failed \\(disk full"):
            writer.write(2, {"loss": 1.0})
    finally:
        monkeypatch.undo()
        writer.close()
