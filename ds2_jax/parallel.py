"""How the step is spread over devices: pmap (default), jit + NamedSharding, or eager.

All three run the same pure steps (`train.train_step`, `eval_step.eval_step`) on the
same placed state, so evaluating during training reads the train state where it lives:
- 'pmap': one program per device, axis name 'batch'; the step psums gradients and
  batch-norm statistics itself. State replicated with a leading device axis.
- 'jit': one SPMD program over a 1-D mesh; the batch is sharded along 'batch', the state
  replicated, and XLA inserts the all-reduces (the step runs with axis_name=None on the
  global batch, so batch norm is always global). The step is traced on the mesh, so the
  spectrogram, the recurrence and the CTC loss, with their kernels, run on each device's
  rows (batch_axis) instead of on a gathered batch.
- 'eager': config.compile=False, op by op on one device.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import queue as queue_lib
import threading
from typing import Callable, Iterator

import jax
import numpy as np
from flax import jax_utils

from ds2_jax import batch_axis, settings
from ds2_jax.pipeline.batch import Sharding, shard_for_devices

AXIS = batch_axis.AXIS


@dataclasses.dataclass
class Parallel:
    kind: str  # 'pmap', 'jit' or 'eager'
    devices: list  # devices of this process that hold a shard of the batch

    @property
    def mesh(self) -> jax.sharding.Mesh:
        # jit spans every process's devices; pmap and eager only this process's.
        devices = jax.devices() if self.kind == "jit" and jax.process_count() > 1 else self.devices
        return jax.sharding.Mesh(np.array(devices), (AXIS,))

    def _sharding(self, spec) -> jax.sharding.NamedSharding:
        return jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(*spec))

    def compile(self, step_fn: Callable, kwargs: dict, donate: bool = True) -> Callable:
        """step_fn(state, batch, *rest, axis_name=..., **kwargs) compiled for this strategy."""
        if self.kind == "pmap":
            fn = functools.partial(step_fn, **kwargs, axis_name=AXIS)
            return jax.pmap(fn, axis_name=AXIS, donate_argnums=(0,) if donate else ())
        fn = functools.partial(step_fn, **kwargs, axis_name=None)
        if self.kind == "jit":
            return jax.jit(batch_axis.traced_on(fn, self.mesh), donate_argnums=(0,) if donate else ())

        def eager(*args):
            with jax.disable_jit():
                return fn(*args)

        return eager

    def put_replicated(self, tree):
        """Host pytree -> the layout the compiled step expects for unsharded inputs."""
        if self.kind == "pmap":
            return jax_utils.replicate(tree, self.devices, axis_name=AXIS)
        if self.kind == "jit":
            if jax.process_count() > 1:  # a restored state is committed to a local device: no cross-host move
                tree = jax.tree.map(_host_value, tree)
            return jax.device_put(tree, self._sharding(()))
        return jax.device_put(tree, self.devices[0])

    def put_batch(self, batch: dict[str, np.ndarray]) -> dict:
        """This process's rows of a global batch -> device arrays, in one transfer call.

        pmap: [B, ...] -> [devices, B / devices, ...] placed on the mesh named like the
        pmap axis (the step never sees a new sharding); jit: rows sharded along 'batch'.
        """
        if self.kind == "pmap":
            return jax.device_put(shard_for_devices(batch, len(self.devices)), self._sharding((AXIS,)))
        if self.kind == "jit":
            sharding = self._sharding((AXIS,))
            return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
        return jax.device_put(batch, self.devices[0])

    def abstract_batch(self, spec: dict[str, jax.ShapeDtypeStruct]) -> dict[str, jax.ShapeDtypeStruct]:
        """Shapes of this process's rows of a batch -> the shapes (and shardings) put_batch gives
        them, to lower the step without data."""
        if self.kind == "pmap":
            n = len(self.devices)
            return {k: jax.ShapeDtypeStruct((n, v.shape[0] // n, *v.shape[1:]), v.dtype) for k, v in spec.items()}
        if self.kind == "jit":
            rows = next(iter(spec.values())).shape[0] * jax.process_count()  # the global batch
            return {
                k: jax.ShapeDtypeStruct((rows, *v.shape[1:]), v.dtype, sharding=self._sharding((AXIS,)))
                for k, v in spec.items()
            }
        return dict(spec)

    def put_batches(self, batches: Iterator[dict], size: int, with_host: bool = False) -> "Staged":
        """Stages up to `size` batches on the devices ahead of the step, from a thread.

        with_host=True yields (host batch, device batch) pairs, for steps whose outputs are
        read beside the host rows (evaluation: references, padding weights).
        """
        put = (lambda b: (b, self.put_batch(b))) if with_host else self.put_batch
        return Staged(batches, put, size)

    def batch_sharding(self, per_device_batch: int) -> Sharding:
        """How a global batch of `per_device_batch` rows per device splits over the processes."""
        return Sharding(
            global_batch=per_device_batch * len(self.devices) * jax.process_count(),
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )

    def get(self, tree):
        """A replicated device pytree -> one host copy."""
        return jax.device_get(unreplicate(tree) if self.kind == "pmap" else tree)

    def get_rows(self, tree):
        """Batch-sharded step outputs -> this process's rows on the host, <[B, ...]> each,
        in the order of the host batch that put_batch placed."""
        if self.kind == "pmap":  # [devices, B / devices, ...] over this process's devices
            return jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), jax.device_get(tree))
        if self.kind == "jit":
            return jax.tree_util.tree_map(_local_rows, tree)
        return jax.device_get(tree)


def _host_value(x):
    """A process-local device array as its host value (the same on every process): the placement
    jax.device_put gives a replicated global sharding without moving data between hosts."""
    return np.asarray(x) if isinstance(x, jax.Array) and x.is_fully_addressable else x


def unreplicate(tree):
    """First device's copy of a pmap-replicated pytree (any device count).

    flax.jax_utils.unreplicate returns the unsqueezed (1, ...) array with one device.
    """
    return jax.tree_util.tree_map(lambda x: x.addressable_shards[0].data[0], tree)


def _local_rows(x: jax.Array) -> np.ndarray:
    """The rows of a batch-sharded global array held by this process's devices, in order."""
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    blocks = {}
    for shard in x.addressable_shards:  # a block held by several devices appears once
        blocks.setdefault(shard.index[0].start or 0, shard.data)
    if any(b.shape[0] == x.shape[0] for b in blocks.values()):  # every process's rows: not ours alone
        raise ValueError(f"get_rows: a step output of shape {x.shape} is not sharded along the batch")
    return np.concatenate([np.asarray(jax.device_get(blocks[k])) for k in sorted(blocks)])


class Staged:
    """Iterator of device batches staged by a background thread, `size` ahead.

    The thread pulls host batches and starts their transfers, so the training loop only
    dispatches steps; the thread mostly waits in calls that release the GIL. An error
    upstream (a dead input worker) is re-raised by `next`. `close()` stops the thread and
    closes the host iterator (which stops its workers).
    """

    _DONE = object()

    def __init__(self, batches: Iterator[dict], put: Callable[[dict], dict], size: int):
        self._batches, self._put = batches, put
        self._queue: queue_lib.Queue = queue_lib.Queue(maxsize=max(1, size))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stage-batches", daemon=True)
        self._thread.start()

    def _offer(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue_lib.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for batch in self._batches:
                if not self._offer(self._put(batch)):
                    return
            self._offer(self._DONE)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self._offer(e)
        finally:
            close = getattr(self._batches, "close", None)
            if close is not None:
                close()

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        return self.next_within(None)

    def next_within(self, timeout: float | None):
        """The next batch, or None if none is staged within `timeout` seconds."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue_lib.Empty:
            return None
        if item is self._DONE:
            self._queue.put(item)  # later calls stop too
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def enable_compilation_cache(path: str) -> str | None:
    """Turns on JAX's persistent compilation cache at `path`; returns the directory in use.

    A restarted run (same shapes) then loads its compiled steps instead of compiling
    them again. JAX_COMPILATION_CACHE_DIR, when set, wins; '' turns the cache off.
    """
    current = os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir
    if current:
        return current
    if not path:
        return None
    path = os.path.abspath(os.path.expanduser(path))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        logging.warning("compilation cache off: cannot create %s (%s); set compilation_cache_dir", path, e)
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    return path


GPU_SIZED_RNN = 1024  # model.rnn_size from which a config is meant for GPUs (the seed's: 2048)


def devices_line(devices: list) -> str:
    """'1 local (gpu: NVIDIA H200)' / '8 local (cpu)': what the run found."""
    kinds = sorted({d.device_kind for d in devices})
    platform = devices[0].platform
    kind = "" if kinds == [platform] or platform == "cpu" else f": {', '.join(kinds)}"
    return f"{len(devices)} local ({platform}{kind})"


def cpu_warning(config: settings.Settings, devices: list) -> str | None:
    """What to expect when a GPU-sized config runs on the CPU (None otherwise)."""
    if devices[0].platform != "cpu" or config.model.rnn_size < GPU_SIZED_RNN:
        return None
    return (
        f"no GPU found: jax runs on the CPU, and this config is sized for GPUs (model.rnn_size="
        f"{config.model.rnn_size}): expect a long compile and seconds to minutes per step. With an NVIDIA GPU, "
        "install jax for it (pip install -e '.[cuda]'; `python -c \"import jax; print(jax.devices())\"` should "
        "list it); on the CPU, configs/demo.py trains in minutes"
    )


def make(config: settings.Settings) -> Parallel:
    """The strategy named by config.parallelism (checked by settings) over config.num_devices
    local devices."""
    devices = jax.local_devices()
    if config.num_devices > len(devices):
        raise ValueError(f"num_devices={config.num_devices} but only {len(devices)} local devices are present")
    if not config.compile:
        return Parallel("eager", devices[:1])
    if config.parallelism == "jit" and jax.process_count() > 1 and config.num_devices not in (0, len(devices)):
        raise ValueError("parallelism='jit' with several processes uses every device: set num_devices=0")
    return Parallel(config.parallelism, devices[: config.num_devices or len(devices)])
