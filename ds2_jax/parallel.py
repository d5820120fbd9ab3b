"""How the step is spread over devices: pmap (default), jit + NamedSharding, or eager.

All three run the same pure `train.train_step`:
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

import collections
import dataclasses
import functools
from typing import Callable, Iterator

import jax
import numpy as np
from flax import jax_utils

from ds2_jax import batch_axis, input_pipeline

AXIS = batch_axis.AXIS
KINDS = ("pmap", "jit")


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
            return jax.device_put(tree, self._sharding(()))
        return jax.device_put(tree, self.devices[0])

    def put_batch(self, batch: dict[str, np.ndarray]) -> dict:
        """This process's rows of a global batch -> device arrays."""
        if self.kind == "pmap":
            return input_pipeline.shard_for_devices(batch, len(self.devices))
        if self.kind == "jit":
            sharding = self._sharding((AXIS,))
            return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
        return batch

    def put_batches(self, batches: Iterator[dict], size: int) -> Iterator[dict]:
        """Stages `size` batches ahead of the step, so host-to-device copies overlap it."""
        if self.kind == "pmap":
            return input_pipeline.prefetch_to_devices(batches, self.devices, size, AXIS)
        return _prefetch(map(self.put_batch, batches), size)

    def get(self, tree):
        """A replicated device pytree -> one host copy."""
        return jax.device_get(unreplicate(tree) if self.kind == "pmap" else tree)


def unreplicate(tree):
    """First device's copy of a pmap-replicated pytree (any device count).

    flax.jax_utils.unreplicate returns the unsqueezed (1, ...) array with one device.
    """
    return jax.tree_util.tree_map(lambda x: x.addressable_shards[0].data[0], tree)


def _prefetch(items: Iterator, size: int) -> Iterator:
    queue = collections.deque()
    for item in items:
        queue.append(item)
        if len(queue) > size:
            yield queue.popleft()
    while queue:
        yield queue.popleft()


def make(config) -> Parallel:
    """The strategy named by config.parallelism over config.num_devices local devices."""
    if config.parallelism not in KINDS:
        raise ValueError(f"parallelism={config.parallelism!r}: expected one of {KINDS}")
    devices = jax.local_devices()
    if config.num_devices > len(devices):
        raise ValueError(f"num_devices={config.num_devices} but only {len(devices)} local devices are present")
    if not config.compile:
        return Parallel("eager", devices[:1])
    if config.parallelism == "jit" and jax.process_count() > 1 and config.num_devices not in (0, len(devices)):
        raise ValueError("parallelism='jit' with several processes uses every device: set num_devices=0")
    return Parallel(config.parallelism, devices[: config.num_devices or len(devices)])
