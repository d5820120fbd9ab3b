"""The batch mesh axis, and running per-utterance computations on each device's shard of it.

Under parallelism='jit' the step sees the global batch, sharded over the mesh axis AXIS,
and XLA partitions its ops. It cannot partition the Pallas/Mosaic kernels' custom calls
(nor, it turns out, the batched FFT of the featurizer): left to itself it gathers the
batch onto every device around each one and computes all of it everywhere. `traced_on`
makes the mesh visible while the step is traced, and `map_batch` runs a per-utterance
computation (the spectrogram, the recurrence, the CTC loss) on each device's rows under
`jax.shard_map`.
That is exact, because no utterance reads another's rows; the gradients of the
replicated arguments (the recurrent weights) are summed over the devices by
shard_map's transpose. Under pmap the axis is already manual (each program holds one
shard), and eager or one-device steps have nothing to split: there `map_batch` just calls.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
from jax.sharding import PartitionSpec

AXIS = "batch"


def traced_on(fn: Callable, mesh: jax.sharding.Mesh) -> Callable:
    """fn, traced with `mesh` as the abstract mesh (jax.set_mesh is refused inside jax.jit)."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args, **kwargs)

    return traced


def shards() -> int:
    """How many devices the batch is split over that XLA, not the program, partitions (1: none)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or AXIS not in mesh.axis_names or AXIS in mesh.manual_axes:
        return 1
    return mesh.shape[AXIS]


def map_batch(fn: Callable, batched: Sequence[jax.Array], replicated: Sequence[jax.Array] = ()):
    """fn(*batched, *replicated), each device computing the rows of its own shard.

    Args:
      fn: per-utterance in its batched arguments (row i of the outputs depends only on
        row i of the `batched` inputs); every output has the batch as its leading axis.
      batched: arrays with the batch as their leading axis.
      replicated: arrays every device reads whole (weights).
    """
    if shards() == 1:
        return fn(*batched, *replicated)
    specs = (PartitionSpec(AXIS),) * len(batched) + (PartitionSpec(),) * len(replicated)
    # check_vma=False: pallas_call's outputs carry no varying-axes types; without them the
    # transpose psums the replicated arguments' cotangents.
    per_device = jax.shard_map(fn, in_specs=specs, out_specs=PartitionSpec(AXIS), axis_names={AXIS},
                               check_vma=False)
    return per_device(*batched, *replicated)
