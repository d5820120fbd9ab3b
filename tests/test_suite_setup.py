"""What conftest.py gives every process the suite starts (the xdist workers, launch.py subprocesses)."""

import os
import re
import subprocess
import sys

import pytest

# A process allocating, touching and freeing BUFFERS buffers of BUFFER_MB, as XLA:CPU does every step;
# it prints its minor page faults.
BUFFER_MB, BUFFERS = 64, 8
_FAULTS = f"""
import ctypes, resource
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = {BUFFER_MB} << 20
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range({BUFFERS}):
    buffer = libc.malloc(size)
    ctypes.memset(buffer, 1, size)
    libc.free(buffer)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _transparent_huge_pages() -> str:
    """The kernel's THP mode ('always', 'madvise', 'never'), '' where there is none."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return re.search(r"\[(\w+)\]", f.read()).group(1)
    except (OSError, AttributeError):
        return ""


def _glibc_version() -> tuple[int, ...]:
    """(2, 36) for glibc 2.36; () for another C library."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
    except (AttributeError, ValueError, OSError):
        return ()
    return tuple(int(part) for part in version.split(".")[:2]) if name == "glibc" else ()


@pytest.mark.skipif(
    _glibc_version() < (2, 35) or _transparent_huge_pages() not in ("always", "madvise"),
    reason="needs glibc >= 2.35 (glibc.malloc.hugetlb) and Linux's transparent huge pages given on request",
)
def test_the_processes_the_suite_starts_take_large_buffers_in_huge_pages():
    """Page faults of a started process: 4 kB pages would take BUFFER_MB * 256 per buffer; huge pages
    a 512th of that. Fails where conftest's GLIBC_TUNABLES does not reach the processes the suite starts."""
    assert "glibc.malloc.hugetlb=1" in os.environ["GLIBC_TUNABLES"]
    faults = int(subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True, check=True).stdout)
    small_pages = BUFFERS * BUFFER_MB * 256
    assert faults < small_pages / 4, f"{faults} page faults for {small_pages} 4 kB pages: not in huge pages"
