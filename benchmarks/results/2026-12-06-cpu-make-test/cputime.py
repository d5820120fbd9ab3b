"""A pytest plugin: each test's CPU seconds (this process's threads and its waited children), the 60
largest printed at the end. CPU time, unlike wall time, hardly moves when other work shares the cores.

    PYTHONPATH=.:benchmarks/results/2026-12-06-cpu-make-test python -m pytest -p cputime -m "e2e and not slow"
"""

import resource
import time

import pytest

_rows: list[tuple[float, float, str]] = []


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    c0, w0 = _cpu(), time.perf_counter()
    yield
    _rows.append((_cpu() - c0, time.perf_counter() - w0, item.nodeid))


def pytest_terminal_summary(terminalreporter):
    cpu, wall = sum(r[0] for r in _rows), sum(r[1] for r in _rows)
    terminalreporter.write_line(f"CPU total {cpu:.1f} s over {len(_rows)} tests (wall {wall:.1f} s)")
    for c, w, n in sorted(_rows, reverse=True)[:60]:
        terminalreporter.write_line(f"{c:8.1f} cpu {w:8.1f} wall  {n}")
