"""The project's errors, the rules that classify foreign ones, and the one place a command
line turns errors into one line.

An error a user can fix is printed as `error: <message>`, the message naming the setting or
file and the way out; its traceback goes to <workdir>/error.log, and to stderr with
--traceback or DS2_TRACEBACK=1. Anything else (a bug) keeps its full traceback.

| error | raised when (one rule each) | raised by |
|---|---|---|
| `WorkdirLocked` | another live run holds the workdir's lock | resilience.WorkdirLock |
| `CheckpointError` | no checkpoint restores, or a save failed for any reason but a full disk | checkpoint, evaluation |
| `DiskFull` | a write failed and `is_disk_full` (the OS's words for a full disk) | checkpoint, metrics, build |
| `OutOfMemory` | a step failed and `is_out_of_memory` (XLA's words, never a full disk) | `out_of_memory`, train |
| `DatasetMismatch` | prepared data came from other files than dataset.manual_dir | datasets.build |
| `InputWorkerError` | a batch worker process died or failed | loader |
| `BuildWorkerError` | a dataset build worker process died | datasets.shards |
| `DamagedArchive` | a .tar.gz is cut short or damaged (its split alone is not built) | datasets.librispeech_local |
| `AudioError` | a file gives no audio (missing, empty, undecodable) | transcribe, one line per file |
| `Unreadable` | an `AudioError` with its build-report reason (empty, missing, corrupt, truncated) | audio |
| `PeerLost` | a multi-process step failed and `is_peer_lost` (a collective's words: a peer gone); exit 3 | train |

Checks of settings and sizes raise the built-in types (`ValueError`, `OSError`, `MemoryError`
for the host's memory, `FloatingPointError` for divergence): `EXPLAINED` lists them. Any other
OSError that `is_disk_full` matches gets the disk-full line of `run_explained`. No other module
reads an error's text to classify it.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import logging
import os
import shutil
import stat
import struct
import sys
import termios
import threading
import time
import traceback
from typing import Callable, Iterator

from ds2_jax import layout

TRACEBACK_ENV = "DS2_TRACEBACK"
MAX_MESSAGE_CHARS = 1500  # longer messages are cut; the log file has the whole text


class Ds2Error(Exception):
    """An error whose message says what to change (raised by ds2_jax, printed by the CLIs)."""


class WorkdirLocked(Ds2Error):
    """Another live run holds the workdir's lock."""


class CheckpointError(Ds2Error, RuntimeError):
    """No checkpoint of the workdir restores, or one could not be written."""


class DiskFull(Ds2Error, OSError):
    """A write failed for want of space."""


class OutOfMemory(Ds2Error, MemoryError):
    """A step ran out of device memory; the message names the batch shapes and settings to lower."""


class DatasetMismatch(Ds2Error, ValueError):
    """A prepared dataset was built from other files than dataset.manual_dir holds."""


class SourceChanged(DatasetMismatch):
    """Files of the manual dir a prepared manifest dataset was built from changed since: `splits` are
    to be built again (datasets.build does, keeping the others)."""

    def __init__(self, message: str, splits: list[str]):
        super().__init__(message)
        self.splits = splits


class InputWorkerError(Ds2Error, RuntimeError):
    """A batch worker process died or failed; the message says which setting to change."""


class BuildWorkerError(Ds2Error, RuntimeError):
    """A dataset build worker process died; the message names its shard, how it died, what to change."""


class DamagedArchive(Ds2Error, OSError):
    """A .tar.gz cut short or damaged: its split is not built; the others are, and are kept
    (datasets.kept_splits). The message names the archive and says to download it again."""


class AudioError(Ds2Error, ValueError):
    """A file that gives no audio: missing, empty, or not decodable; the message names it."""


class Unreadable(AudioError):
    """Audio that gives no samples; `reason`: empty_audio, missing_audio, corrupt_audio,
    truncated_audio or not_mono (manifest.REASONS' words), `detail` what was found."""

    def __init__(self, reason: str, detail: str = "", message: str = ""):
        """`message`: what a person reads (default: `detail`, which a build report records)."""
        super().__init__(message or detail or reason)
        self.reason, self.detail = reason, detail


class PeerLost(Ds2Error, RuntimeError):
    """Another process of a jax.distributed run is gone (killed, crashed): this one exits with
    code 3, as the watchdog does for a collective that hangs, so a supervisor restarts the run."""

    exit_code = 3


# One rule each, not overlapping: XLA and tensorstore both say RESOURCE_EXHAUSTED, so that
# word alone decides nothing; the operating system's words for a full disk decide disk full.
DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "os_error_code='28'", "os_error_code='122'")


def chain(err: BaseException) -> Iterator[BaseException]:
    """`err` and every error behind it, each once: its cause (raise ... from), its context (raised
    while handling), theirs, and the members of an exception group. The classifiers below ask each:
    orbax, tensorstore and the input workers raise their own error from the one that happened."""
    seen, todo = set(), [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [*getattr(e, "exceptions", ()), e.__context__, e.__cause__]


def is_disk_full(err: BaseException) -> bool:
    """ENOSPC/EDQUOT, or a wrapping of it (tensorstore: RESOURCE_EXHAUSTED ... No space left on device),
    anywhere in its chain."""
    return any(
        (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) or any(t in str(e) for t in DISK_FULL_TEXT)
        for e in chain(err)
    )


# A collective whose peer process is gone: gloo (CPU) reports the closed connection, NCCL the exited
# process, the coordination service the missed heartbeats. Only asked of multi-process runs.
PEER_LOST_TEXT = (
    "Connection reset by peer",
    "Connection closed by peer",
    "remote process exited",
    "heartbeat timeout",
    "stopped sending heartbeats",
)


def is_peer_lost(err: BaseException) -> bool:
    """A multi-process step's error that says another process is gone (PEER_LOST_TEXT), anywhere in its chain."""
    return any(t in str(e) for e in chain(err) for t in PEER_LOST_TEXT)


def peer_lost(err: BaseException, process: int, processes: int) -> PeerLost:
    """The explained form of `err` (is_peer_lost(err)) in process `process` of `processes`."""
    return PeerLost(
        f"process {process} of {processes}: another process of this run is gone (killed or crashed: "
        f"{one_line(err)[:200]}); exiting with code 3 so a supervisor can restart the run (the checkpoints on "
        "disk are intact; rerun the same command on every process to resume)"
    )


def is_out_of_memory(err: BaseException) -> bool:
    """Out of (device or host) memory: a MemoryError, XLA's RESOURCE_EXHAUSTED or 'out of memory' anywhere
    in its chain, never a full disk."""
    return not is_disk_full(err) and any(
        isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower()
        for e in chain(err)
    )


def out_of_memory(err: BaseException, batch_shapes: dict, config) -> OutOfMemory:
    """The explained form of a step's out-of-memory error `err` (is_out_of_memory(err))."""
    return OutOfMemory(
        f"out of device memory for batch shapes {batch_shapes} "
        f"(per_device_batch_size={config.per_device_batch_size}, "
        f"dataset.max_duration_s={config.dataset.max_duration_s}, "
        f"model.rnn_size={config.model.rnn_size}, model.dtype={config.model.dtype}); lower per_device_batch_size or "
        f"dataset.max_duration_s, or use model.dtype=bfloat16. Original error: {str(err)[:500]}"
    )


def free_space(path: str) -> str:
    """'123 MiB free' on the file system of path (or of its nearest existing parent)."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        return f"{shutil.disk_usage(path or '.').free / 2**20:.0f} MiB free"
    except OSError:
        return "free space unknown"


def disk_full(what: str, where: str, way_out: str) -> DiskFull:
    """The project's disk-full line: '<what>: disk full (N MiB free in <where>); free disk space or
    <way_out>, then rerun the same command'."""
    return DiskFull(
        f"{what}: disk full ({free_space(where)} in {where}); free disk space or {way_out}, then rerun the same command"
    )


# Errors whose message is the whole story: the project's own, and the built-in types
# its checks raise (config validation, files, memory, divergence).
EXPLAINED = (Ds2Error, OSError, ValueError, MemoryError, FloatingPointError, NotImplementedError, ImportError)


def traceback_wanted(argv: list[str] | None = None) -> bool:
    argv = sys.argv if argv is None else argv
    return os.environ.get(TRACEBACK_ENV, "") not in ("", "0") or any(
        a in ("--traceback", "--traceback=true", "--traceback=True") for a in argv
    )


def one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + " ..."
    return text


def log_traceback(workdir: str | None, err: BaseException) -> str | None:
    """Appends err's traceback to workdir/error.log; its path, or None if it can't be written."""
    if not workdir or not os.path.isdir(workdir):
        return None
    path = os.path.join(workdir, layout.ERROR_LOG)
    try:
        with open(path, "a") as f:
            f.write(f"--- {datetime.datetime.now().isoformat(timespec='seconds')} pid {os.getpid()}: {sys.argv}\n")
            f.write("".join(traceback.format_exception(type(err), err, err.__traceback__)))
        return path
    except OSError:
        return None


def _wait_until_read(fd: int, timeout_s: float = 2.0, poll_s: float = 0.02) -> None:
    """When fd is a pipe, waits (at most timeout_s) until its reader has emptied it twice in a
    row: a write another thread had blocked on the full pipe before stderr moved then lands
    ahead of the message instead of after it."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        empty, deadline = 0, time.monotonic() + timeout_s
        while empty < 2 and time.monotonic() < deadline:
            unread = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
            empty = empty + 1 if unread == 0 else 0
            time.sleep(poll_s)
    except OSError:  # not a pipe this can ask: write at once
        return


def _divert_stderr(log_path: str | None) -> int:
    """Points fd 2 and sys.stderr at log_path (or devnull) so other threads' late output
    lands there; returns a new fd on the terminal's stderr."""
    sys.stdout.flush()
    sys.stderr.flush()
    terminal = os.dup(2)
    sink = open(log_path or os.devnull, "a")
    os.dup2(sink.fileno(), 2)
    sys.stderr = sink
    return terminal


class _ToLog(logging.Filter):
    """Keeps ERROR records of the absl logger that come from `package`'s code off the terminal,
    appending them (with their tracebacks) to a file instead."""

    def __init__(self, path: str, package: str):
        super().__init__()
        self.path, self.package = path, f"{os.sep}{package}{os.sep}"

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or self.package not in record.pathname:
            return True
        with contextlib.suppress(OSError):  # a full disk: dropping them is still better than 400 tracebacks
            with open(self.path, "a") as f:
                f.write(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s").format(record) + "\n")
        return False


@contextlib.contextmanager
def background_errors_to_log(workdir: str, package: str, unraisable: str):
    """While the block runs, `package`'s (absl-logged) errors, and the unraisable exceptions
    whose text is `unraisable` (asyncio callbacks of a loop that is gone), go to
    workdir/error.log: the error that reaches the caller is the one explained."""
    path = os.path.join(workdir, layout.ERROR_LOG)
    keep = _ToLog(path, package)
    logger = logging.getLogger("absl")
    logger.addFilter(keep)
    previous = sys.unraisablehook

    def hook(info):
        if str(info.exc_value) != unraisable:
            return previous(info)
        with contextlib.suppress(OSError):
            with open(path, "a") as f:
                f.write("".join(traceback.format_exception(info.exc_type, info.exc_value, info.exc_traceback)))

    sys.unraisablehook = hook
    try:
        yield
    finally:
        logger.removeFilter(keep)
        sys.unraisablehook = previous


def run_explained(fn: Callable[[], object], workdir: str | None, show_traceback: bool = False) -> int:
    """fn()'s exit code (0 unless it returns an int); an explained error becomes `error: ...`
    as the last line of stderr, and exit code 1 (its `exit_code` where it has one: PeerLost's 3).

    The process then ends at once (os._exit). Before the message, stderr is pointed at
    the error log: orbax's and tensorstore's background threads otherwise print
    `Event loop is closed` tracebacks after it while they wind down.
    """
    try:
        result = fn()
        return result if isinstance(result, int) else 0
    except EXPLAINED as e:
        log_path = log_traceback(workdir, e)
        if show_traceback:
            traceback.print_exc()
        hint = f"traceback: {log_path}" if log_path else f"traceback: rerun with {TRACEBACK_ENV}=1"
        message = one_line(e)
        if is_disk_full(e) and not isinstance(e, (Ds2Error, MemoryError)):  # a write this code did not expect to fail
            message = str(disk_full(message, workdir or os.getcwd(), "choose another --workdir"))
        # Other threads alive may be halfway through a line on stderr: start on a fresh one.
        fresh_line = "\n" if threading.active_count() > 1 else ""
        terminal = _divert_stderr(log_path)
        _wait_until_read(terminal)
        os.write(terminal, f"{fresh_line}error: {message} [{hint}]\n".encode())
        os._exit(getattr(e, "exit_code", 1))  # and no atexit: jax.distributed's shutdown waits on a lost peer
