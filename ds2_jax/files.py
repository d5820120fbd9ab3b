"""Writing a file so that a reader (or a rerun after kill -9) sees the old or the new
contents, never a torn or empty file: write a temporary file beside it, then rename."""

from __future__ import annotations

import contextlib
import os
import tempfile


@contextlib.contextmanager
def replacing(path: str, mode: str = "w"):
    """An open file whose contents replace `path` (atomically: os.replace) when the block
    ends without an error; on an error (or a kill) `path` keeps its old contents."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode) as f:
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
