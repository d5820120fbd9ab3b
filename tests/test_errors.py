"""errors.run_explained: the one-line message is the last thing on stderr."""

import subprocess
import sys

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
