"""Per-test wall and CPU seconds (setup + call + teardown; CPU: this process and its waited children),
one line per test: wall, cpu, time, node id, appended to $WALLTIME_DIR/<worker>.tsv.

    WALLTIME_DIR=<dir> PYTHONPATH=$PWD:<this dir> python -m pytest -p walltime tests/...
"""

import os
import resource
import time

import pytest


def _cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    c0, w0 = _cpu(), time.perf_counter()
    yield
    wid = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(os.environ["WALLTIME_DIR"], f"{wid}.tsv"), "a") as f:
        f.write(f"{time.perf_counter() - w0:.2f}\t{_cpu() - c0:.2f}\t{time.time():.1f}\t{item.nodeid}\n")
