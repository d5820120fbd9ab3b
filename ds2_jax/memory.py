"""Whether a run fits in memory, checked before it allocates: the train step's device memory,
estimated from shapes before anything is compiled; on the CPU the compiled step's; on the host,
the batches in flight (`check_host_memory`).

A batch too large for the device used to show as minutes of silent compiling and autotuning
before an allocation failed. This estimate traces the loss with `jax.eval_shape` (no compile,
no device memory, under a second for the seed model) and counts what cannot be avoided: the
train state, a gradient, the staged input batches and the activations the backward pass keeps
(`jax.vjp`'s residuals). XLA's own temporaries come on top, so the estimate is a lower bound:
a batch it refuses cannot fit; one it passes may still not.

On the CPU the "device" is the host's memory, and the shape estimate is about 10x low: XLA:CPU
runs convolutions through Eigen, whose patch (im2col) buffers sit outside XLA's own buffers
(smoke config, 256 rows: XLA's temporaries 110 MiB, the step's peak 1.45 GiB above the process).
So on the CPU the step is compiled first (the loop reuses that executable) and its need is XLA's
memory analysis plus the largest convolution's patches (`compiled_need`), checked against the
memory the host has available (`check_compiled`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re

import jax
import numpy as np

from ds2_jax.kernels import dispatch
from ds2_jax.pipeline import batch as batch_format

log = logging.getLogger("ds2_jax")

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Device bytes of one train step: `fixed` + `per_row` x rows per device."""

    fixed: int
    per_row: int

    def at(self, rows: int) -> int:
        return self.fixed + self.per_row * rows

    def largest_fitting(self, limit: int) -> int:
        """The most rows per device whose estimate fits `limit` bytes (0: none)."""
        return max((limit - self.fixed) // self.per_row, 0)


def batch_spec(rows: int, samples: int, label_len: int) -> dict[str, jax.ShapeDtypeStruct]:
    """The shapes and dtypes of a padded batch (pipeline.batch.pad_batch's format) of `rows` rows."""
    one = batch_format.pad_batch([], samples, label_len, 1)
    return {k: jax.ShapeDtypeStruct((rows, *v.shape[1:]), v.dtype) for k, v in one.items()}


def residual_bytes(loss_function, state, rows: int, samples: int, label_len: int, loss_kwargs: dict) -> int:
    """Bytes the backward pass keeps from the forward for a batch of `rows` rows, from shapes alone.

    loss_function(state, batch, rng, axis_name=None, **loss_kwargs) -> params -> (loss, aux),
    as train.loss_function.
    """

    def saved(st, batch, rng):
        return jax.vjp(loss_function(st, batch, rng, axis_name=None, **loss_kwargs), st.params, has_aux=True)[1]

    with dispatch.unlogged():  # the 'auto' choice is logged once, by the compile
        residuals = jax.eval_shape(saved, state, batch_spec(rows, samples, label_len), jax.random.PRNGKey(0))
    return tree_bytes(residuals)


def estimate(
    loss_function, state, rows: int, shapes: list[tuple[int, int]], loss_kwargs: dict, staged_batches: int
) -> Estimate:
    """The step's device bytes at the largest batch shape in `shapes` ((samples, label length)):
    the state, its gradient, `staged_batches` input batches on the device and the residuals,
    split into a fixed part and a part per row (the residuals at `rows` and 2 x `rows`)."""
    samples, label_len = max(shapes)
    at_rows, at_twice = (
        residual_bytes(loss_function, state, n, samples, label_len, loss_kwargs) for n in (rows, 2 * rows)
    )
    residual_per_row = (at_twice - at_rows) // rows
    batch_per_row = tree_bytes(batch_spec(1, samples, label_len))
    return Estimate(
        fixed=tree_bytes(state) + tree_bytes(state.params) + at_rows - residual_per_row * rows,
        per_row=residual_per_row + staged_batches * batch_per_row,
    )


def device_limit(device) -> int | None:
    """Bytes the device lets XLA allocate; None where it does not say (CPUs)."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    return (stats or {}).get("bytes_limit")


def size(n: int) -> str:
    return f"{n / GIB:,.1f} GiB" if n >= GIB else f"{n / 2**20:,.1f} MiB"


def check(est: Estimate, per_device_batch_size: int, limit: int | None) -> str:
    """A line on the estimate against `limit`; a MemoryError naming per_device_batch_size and
    about the largest that fits when the estimate alone exceeds it."""
    need = est.at(per_device_batch_size)
    if limit is None:
        return f"device memory: the step needs at least {size(need)} per device (the device's limit is unknown)"
    if need <= limit:
        return f"device memory: the step needs at least {size(need)} of the device's {size(limit)}"
    fits = est.largest_fitting(limit)
    advice = (
        f"the largest that could fit is about per_device_batch_size={fits} (XLA needs more than this estimate: "
        "leave headroom)"
        if fits
        else "not even one row fits: use model.dtype=bfloat16 or a smaller model"
    )
    raise MemoryError(
        f"per_device_batch_size={per_device_batch_size} cannot fit on this device: the train step needs at least "
        f"{size(need)} ({size(est.fixed)} of state, gradient and fixed activations, {size(est.per_row)} per row "
        f"at the longest batch shape), the device has {size(limit)}; "
        f"{advice}; or lower dataset.max_duration_s"
    )


_ITEM_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s32": 4, "s16": 2, "s8": 1, "u8": 1, "pred": 1}
_SHAPE = re.compile(r"%([\w.-]+) = (\w+)\[([\d,]*)\]")
_CONV = re.compile(
    r"%[\w.-]+ = \w+\[([\d,]*)\]\S* convolution\(%([\w.-]+), %[\w.-]+\), "
    r"window=\{size=([\dx]+)[^}]*\}, dim_labels=(\w+)_\w+->(\w+)(?:, feature_group_count=(\d+))?"
)


def convolution_scratch_bytes(hlo_text: str) -> int:
    """The largest convolution's patches (im2col: output positions x window x input features, per
    batch entry) in an optimized HLO module's text: the buffer Eigen builds on the CPU outside
    XLA's own (one convolution runs at a time). 0 with no convolution."""
    shapes = {m.group(1): (m.group(2), [int(d) for d in m.group(3).split(",") if d]) for m in _SHAPE.finditer(hlo_text)}
    largest = 0
    for m in _CONV.finditer(hlo_text):
        out = [int(d) for d in m.group(1).split(",") if d]
        dtype, lhs = shapes.get(m.group(2), ("f32", []))
        lhs_labels, out_labels = m.group(4), m.group(5)
        if len(lhs) != len(lhs_labels) or len(out) != len(out_labels):
            continue
        positions = math.prod(d for d, label in zip(out, out_labels) if label.isdigit())
        window = math.prod(int(w) for w in m.group(3).split("x"))
        features = lhs[lhs_labels.index("f")] // int(m.group(6) or 1)
        patches = lhs[lhs_labels.index("b")] * positions * window * features * _ITEM_BYTES.get(dtype, 4)
        largest = max(largest, patches)
    return largest


@dataclasses.dataclass(frozen=True)
class CompiledNeed:
    """Host bytes of one compiled step on the CPU, over all of this process's devices."""

    xla: int  # XLA's buffers: temporaries, arguments and outputs not aliased, code
    convolution: int  # Eigen's patches of the largest convolution

    @property
    def total(self) -> int:
        return self.xla + self.convolution


def compiled_need(compiled, devices: int) -> CompiledNeed | None:
    """What `compiled` (a jax Compiled step) needs on the host when `devices` run it at once; None
    where XLA gives no memory analysis."""
    try:
        stats = compiled.memory_analysis()
        text = compiled.as_text() or ""
    except Exception:  # noqa: BLE001 - not every backend or version offers them: the shape estimate stands
        return None
    if stats is None:
        return None
    xla = (
        stats.temp_size_in_bytes
        + stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
        + stats.generated_code_size_in_bytes
    )
    return CompiledNeed(xla=devices * xla, convolution=devices * convolution_scratch_bytes(text))


def check_compiled(
    need: CompiledNeed, est: Estimate, per_device_batch_size: int, devices: int, available: int | None
) -> str:
    """A line on the compiled step's host need against `available` bytes; a MemoryError naming
    per_device_batch_size and about the largest that fits when it exceeds them. The rows scale
    what is not the state and its gradient (est.fixed, per device)."""
    if available is None:
        return f"host memory: the step needs about {size(need.total)} (the available memory is unknown)"
    if need.total <= available:
        return f"host memory: the step needs about {size(need.total)} of the {size(available)} available"
    fixed = est.fixed * devices
    per_row = max((need.total - fixed) / per_device_batch_size, 1)
    fits = max(int((available - fixed) // per_row), 0)
    advice = (
        f"the largest that could fit is about per_device_batch_size={fits} (the process and its input "
        "batches need more: leave headroom)"
        if fits
        else "not even one row fits: use a smaller model"
    )
    raise MemoryError(
        f"per_device_batch_size={per_device_batch_size} cannot fit in this machine's memory: the train step on "
        f"the CPU needs about {size(need.total)} ({size(need.xla)} of XLA's buffers, {size(need.convolution)} of "
        f"convolution patches, {devices} device(s)), the host has {size(available)} available; "
        f"{advice}; or lower dataset.max_duration_s"
    )


def tree_bytes(tree) -> int:
    """Bytes of the arrays (or shape structs) in a pytree."""
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "shape"))


# ----------------------------------------------------------------------------- the host


def host_memory_bytes() -> int | None:
    """The host's physical memory in bytes; None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def available_host_memory() -> int | None:
    """Bytes the host can still give (MemAvailable: free plus reclaimable cache), else its total."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return host_memory_bytes()


def check_host_memory(
    config, local_batch: int, shapes: list[tuple[int, int]], batches_in_flight: int, memory_bytes: int | None = None
) -> None:
    """Before anything is allocated: a MemoryError naming per_device_batch_size (and about the
    largest that fits) when the host copies of the batches in flight (staged, in the workers'
    buffers) exceed this machine's memory; numpy would fail at the first step otherwise."""
    memory = memory_bytes or host_memory_bytes()
    if not memory:
        return
    samples, label_len = max(shapes)
    row = tree_bytes(batch_spec(1, samples, label_len))  # the padded batch format's bytes per row
    need = local_batch * row * batches_in_flight
    if need <= memory:
        return
    devices = max(local_batch // config.per_device_batch_size, 1)
    fits = memory // (row * batches_in_flight * devices)
    raise MemoryError(
        f"per_device_batch_size={config.per_device_batch_size} is too large for this machine: the "
        f"{batches_in_flight} batches in flight on the host ({local_batch} rows of {samples} samples each) need "
        f"{need / 2**30:,.1f} GiB of memory, it has {memory / 2**30:,.1f} GiB. The largest that fits the host is "
        f"about per_device_batch_size={fits} (the devices may hold fewer)"
    )
