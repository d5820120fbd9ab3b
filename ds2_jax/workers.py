"""Worker processes that end with their parent (input workers, dataset build workers).

A parent killed with -9 runs no cleanup, so its spawned workers would live on, each holding the
resource tracker (and its /dev/shm segments) open. `die_with_parent`, called once in a worker,
starts a thread that waits on the parent's sentinel and ends the worker when the parent is gone.
(The sentinel, not prctl's PDEATHSIG: that fires when the parent's *thread* that started the
worker ends, and grain starts them from the batch-staging thread.) Host code: no jax.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import threading

_WATCHING: list[bool] = []


def die_with_parent() -> None:
    """In a worker process, once: a thread that ends it (exit 1) as soon as its parent is gone."""
    if _WATCHING:
        return
    sentinel = getattr(multiprocessing.parent_process(), "sentinel", None)
    if sentinel is None:  # not a multiprocessing child
        return

    def watch():
        multiprocessing.connection.wait([sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="ds2-parent-watch", daemon=True).start()
    _WATCHING.append(True)
