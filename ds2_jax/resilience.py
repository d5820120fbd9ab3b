"""What keeps a long run alive or stops it cleanly: preemption signals, a watchdog
for hung steps or collectives, workdir checks and lock. Which error is
which (out of memory, disk full) is decided in errors.py only; the fault injection
(config.faults) that the tests use to prove all of it is ds2_jax.faults.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time

from ds2_jax import errors, layout

log = logging.getLogger("ds2_jax")


STEPS_IN_FLIGHT = 2  # steps dispatched ahead of the device: enough to hide dispatch, few to wait for on a stop


def wait_ready(tree, poll_s: float = 0.0005) -> None:
    """Waits until every array of `tree` is computed, polling from Python (not blocking in
    C), so that a signal's handler runs at once: a second Ctrl-C can abandon the wait."""
    leaves = [x for x in _leaves(tree) if hasattr(x, "is_ready")]
    while not all(x.is_ready() for x in leaves):
        time.sleep(poll_s)


def _leaves(tree) -> list:
    import jax

    return jax.tree_util.tree_leaves(tree)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # SIGHUP: the terminal closed; stop as for SIGTERM


class Preemption:
    """Turns SIGTERM / SIGINT / SIGHUP into a flag checked at step boundaries (main thread only).

    A second signal exits at once (128 + signal) with one line, also while the main thread is
    in a long call into C++ (the first compile: minutes), which holds Python's handler back: a
    thread reads the signals off `signal.set_wakeup_fd` and exits when the handler has not.
    A `workdir` this run created and wrote no result to is removed first (`remove_half_made`).
    """

    HANDLER_GRACE_S = 0.2  # the thread leaves the exit to the handler when it runs this soon

    def __init__(self, workdir: str | None = None):
        self.signal: int | None = None
        self._previous: dict = {}
        self._workdir = workdir if workdir and not os.path.exists(workdir) else None  # None: not this run's
        self._exiting = threading.Lock()
        self._wakeup: tuple[int, int] | None = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
            read, write = os.pipe()
            os.set_blocking(write, False)
            if signal.set_wakeup_fd(write, warn_on_full_buffer=False) != -1:  # someone else's: left to them
                signal.set_wakeup_fd(-1)
                os.close(read), os.close(write)
            else:
                self._wakeup = (read, write)
                threading.Thread(target=self._watch, args=(read,), name="ds2-second-signal", daemon=True).start()
        return self

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.signal is not None:  # a second signal: the user will not wait for the checkpoint
            self._exit_now(signum)
            return
        self.signal = signum
        log.warning(
            "received %s: checkpointing after the steps in flight (at most %d), then exiting; send it again "
            "to exit at once without a checkpoint",
            name,
            STEPS_IN_FLIGHT,
        )

    def _watch(self, read: int) -> None:
        """The second stop signal, seen as it arrives (the wakeup fd), even while the main thread is in C++."""
        seen = 0
        while data := os.read(read, 64):
            for signum in data:
                seen += signum in STOP_SIGNALS
                if seen >= 2:
                    time.sleep(self.HANDLER_GRACE_S)
                    self._exit_now(signum)
        os.close(read)

    def _exit_now(self, signum: int) -> None:
        if not self._exiting.acquire(blocking=False):  # the handler or the thread is at it already
            return
        removed = self._workdir is not None and remove_half_made(self._workdir)
        state = (
            f"removed {self._workdir}, which this run created and wrote no result to"
            if removed
            else "the checkpoints on disk are intact (rerun the same command to resume from the newest)"
        )
        msg = f"received {signal.Signals(signum).name} again: exiting now without writing a checkpoint; {state}"
        sys.stderr.flush()
        os.write(2, f"ds2_jax: {msg}\n".encode())  # the one line (logging it too would print it twice)
        os._exit(128 + signum)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._wakeup is not None:
            signal.set_wakeup_fd(-1)
            os.close(self._wakeup[1])  # the thread reads the end of the pipe and stops
            self._wakeup = None
        return False


# What a run writes before it has a result (a checkpoint, metrics); a workdir holding only these
# (and empty folders) is half-made.
SCAFFOLDING = (layout.LOCK, layout.ERROR_LOG, layout.CONFIG, layout.LOG)
SCAFFOLDING_PREFIXES = ("events.out.tfevents.",)  # TensorBoard's file, created before its first scalar


def half_made(workdir: str) -> bool:
    """True when `workdir` holds nothing but SCAFFOLDING (no checkpoint, no metrics, no result)."""
    return os.path.isdir(workdir) and all(
        f in SCAFFOLDING or f.startswith(SCAFFOLDING_PREFIXES) for _, _, files in os.walk(workdir) for f in files
    )


def remove_half_made(workdir: str) -> bool:
    """Removes `workdir` if it is half_made; whether it did."""
    if not half_made(workdir):
        return False
    shutil.rmtree(workdir, ignore_errors=True)
    return not os.path.exists(workdir)


class Watchdog:
    """Ends the process (exit 3) if `ping` is not called for `timeout_s` seconds.

    A hung step or a collective waiting on a dead peer never returns; a supervisor can
    only restart a process that exits. 0 disables it.
    """

    EXIT_CODE = errors.PeerLost.exit_code  # one code for a dead peer, found either way

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._last = time.monotonic()
        self._what = "start"
        self._suspended = 0
        self._stop = threading.Event()
        self._thread = None
        if timeout_s > 0:
            self._thread = threading.Thread(target=self._run, name="ds2-watchdog", daemon=True)
            self._thread.start()

    def ping(self, what: str) -> None:
        self._last, self._what = time.monotonic(), what

    @contextlib.contextmanager
    def suspended(self, what: str):
        """No timeout while the block runs: work that is progress but cannot ping (compiling
        the first step, writing a checkpoint). Its end counts as progress."""
        self.ping(what)
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1
            self.ping(f"{what} (done)")

    def _run(self):
        while not self._stop.wait(min(self.timeout_s / 4, 5.0)):
            if self._suspended:
                continue
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                msg = (
                    f"no progress for {idle:.0f} s after {self._what} (step_timeout_s={self.timeout_s}): "
                    "a hung step or collective (dead peer?); exiting so a supervisor can restart the run"
                )
                log.error(msg)
                print(f"ds2_jax watchdog: {msg}", file=sys.stderr, flush=True)
                os._exit(self.EXIT_CODE)

    def close(self):
        self._stop.set()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class WorkdirLock:
    """workdir/run.lock ({host, pid, start}) held for a training run.

    A second run on the same workdir is refused, naming the first one's host and pid; a
    lock whose process is gone (same host, pid not running: killed with -9, machine
    crashed) is taken over with a warning. Only process 0 of a multi-process run locks.
    """

    def __init__(self, workdir: str, enabled: bool = True):
        self.path = os.path.join(workdir, layout.LOCK)
        self.workdir = workdir
        self.enabled = enabled
        self._held = False

    def __enter__(self):
        if self.enabled:
            self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def owner(self) -> dict | None:
        try:
            with open(self.path) as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # torn or unreadable: written by a run that died while writing it

    def acquire(self) -> None:
        me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "start": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        try:
            os.makedirs(self.workdir, exist_ok=True)
        except OSError as e:
            raise OSError(f"workdir {self.workdir!r} is not writable ({e}); choose another --workdir") from e
        for _ in range(3):  # create, or take over a stale lock, without racing another run
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._refuse_or_clear(self.owner(), me)
                continue
            except OSError as e:
                raise OSError(f"workdir {self.workdir!r} is not writable ({e}); choose another --workdir") from e
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self._held = True
            return
        raise errors.WorkdirLocked(f"could not take {self.path}: another run keeps creating it")

    def _refuse_or_clear(self, owner: dict | None, me: dict) -> None:
        if owner is None:
            return  # removed meanwhile: try again
        host, pid = owner.get("host"), owner.get("pid")
        stale = owner == {} or (host == me["host"] and isinstance(pid, int) and not _pid_alive(pid))
        if not stale:
            raise errors.WorkdirLocked(
                f"workdir {self.workdir!r} is in use by another run (host {host}, pid {pid}, started "
                f"{owner.get('start')}); wait for it to finish, stop it, or choose another --workdir. If that "
                f"run is gone (e.g. its machine died), delete {self.path}"
            )
        log.warning(
            "taking over the stale lock %s of a run that is gone (host %s, pid %s, started %s)",
            self.path,
            host,
            pid,
            owner.get("start"),
        )
        try:
            if self.owner() == owner:  # not a lock another run took over meanwhile
                os.remove(self.path)
        except FileNotFoundError:
            pass

    def release(self) -> None:
        if self._held:
            self._held = False
            try:
                if (self.owner() or {}).get("pid") == os.getpid():
                    os.remove(self.path)
            except OSError as e:
                log.warning("could not remove %s (%s); the next run will take it over", self.path, e)


def check_workdir(workdir: str, checkpoint_bytes: int) -> None:
    """Fails before training if workdir can't be written or can't hold two more checkpoints."""
    try:
        os.makedirs(workdir, exist_ok=True)
        # One probe per process: processes of a multi-process run share the workdir.
        probe = os.path.join(workdir, f".write_probe.{os.getpid()}.{threading.get_ident()}")
        with open(probe, "wb") as f:
            f.write(b"0" * 4096)
        os.remove(probe)
    except OSError as e:
        raise OSError(f"workdir {workdir!r} is not writable ({e}); choose another --workdir") from e
    free = shutil.disk_usage(workdir).free
    need = 2 * checkpoint_bytes
    if free < need:
        raise OSError(
            f"workdir {workdir!r} has {free / 2**20:.0f} MiB free but a checkpoint needs about "
            f"{checkpoint_bytes / 2**20:.0f} MiB (and one more while the next is written); free disk space "
            "or choose another --workdir"
        )
