"""Writing a file so that a reader (or a rerun after kill -9) sees the old or the new
contents, never a torn or empty file: write a temporary file beside it, then rename.

The file gets the mode any program's `open(path, "w")` would give it: an existing file's
own, a new one 0666 less the umask (tempfile.mkstemp makes 0600, so a shared data_dir's
record or a shared run's config.json became unreadable to the other users)."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile


def umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc), else set and restored."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def mode_for(path: str) -> int:
    """The permission bits `open(path, 'w')` leaves `path` with: its own if it exists, else 0666 & ~umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~umask()


@contextlib.contextmanager
def replacing(path: str, mode: str = "w"):
    """An open file whose contents replace `path` (atomically: os.replace) when the block
    ends without an error; on an error (or a kill) `path` keeps its old contents."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, mode_for(path))
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_text(path: str, text: str) -> None:
    """path's contents replaced by text, atomically (see `replacing`)."""
    with replacing(path) as f:
        f.write(text)
