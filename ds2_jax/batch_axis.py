"""The batch mesh axis, and running per-utterance computations on each device's shard of it.

Under parallelism='jit' the step sees the global batch, sharded over the mesh axis AXIS,
and XLA partitions its ops. It cannot partition the Pallas/Mosaic kernels' custom calls,
and it does not split the featurizer's batched FFT: around each it gathers the whole
batch onto every device and computes all of it everywhere. `traced_on` makes the mesh
visible while the step is traced, and `map_batch` runs a per-utterance computation (the
spectrogram, the recurrence, the CTC loss) on each device's rows under `jax.shard_map`.
That is exact, because no utterance reads another's rows; the gradients of replicated
arguments (the recurrent weights) are summed over the devices by shard_map's transpose.
A one-device mesh takes the same path (no collectives remain), so one GPU runs the code
that eight run. Under pmap the axis is already manual (each program holds one shard) and
an eager step has no mesh: there `map_batch` just calls fn.
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


def sharded() -> bool:
    """Whether the step being traced holds the global batch over a mesh axis AXIS that XLA
    partitions (parallelism='jit'); under pmap the axis is manual, eagerly there is none."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and AXIS in mesh.axis_names and AXIS not in mesh.manual_axes


def mesh_size() -> int:
    """The devices along AXIS of the mesh the step is traced on (where `sharded()`)."""
    return jax.sharding.get_abstract_mesh().shape[AXIS]


def map_batch(fn: Callable, batched: Sequence[jax.Array], replicated: Sequence[jax.Array] = ()):
    """fn(*batched, *replicated), each device computing the rows of its own shard.

    Args:
      fn: per-utterance in its batched arguments (row i of the outputs depends only on
        row i of the `batched` inputs); every output has the batch as its leading axis.
      batched: arrays with the batch as their leading axis.
      replicated: arrays every device reads whole (weights).
    """
    if not sharded():
        return fn(*batched, *replicated)
    specs = (PartitionSpec(AXIS),) * len(batched) + (PartitionSpec(),) * len(replicated)
    # check_vma=False: under the check pallas_call wants a varying-axes type on every
    # out_shape. Unchecked, shard_map's transpose psums the replicated arguments' cotangents.
    per_device = jax.shard_map(fn, in_specs=specs, out_specs=PartitionSpec(AXIS), axis_names={AXIS}, check_vma=False)
    return per_device(*batched, *replicated)


def psum(x, axis_name: str | None):
    """Sum over the pmap axis `axis_name`; the identity when the step sees the whole batch."""
    return x if axis_name is None else jax.lax.psum(x, axis_name)
