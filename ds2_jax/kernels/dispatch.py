"""Which implementation runs: 'auto' (and an explicit choice) decided for the recurrence and
the CTC loss in one place, and logged once per distinct choice.

The policies are pure functions of the problem and of the `Machine` (backend, compute
capability, SM count), so every GPU decision can be tested on a CPU; `rnn_impl` and
`ctc_impl` read this machine and log. 'auto' on the recurrence (the simple cell):

  CPU/TPU                                     scan_vjp (the kernels would run interpreted)
  Hopper, bfloat16, hidden a multiple of 128,
    grid fits SMs, <= MOSAIC_AUTO_ROWS rows       mosaic
  other GPUs: <= 16 rows and the Triton
    kernel's shared memory fits               pallas
  otherwise                                   scan_vjp
  GRU / LSTM anywhere                         scan

Above 16 rows the Triton kernel's row chunks run one after another and scan_vjp is faster;
the Mosaic kernels take as many rows per call as shared memory holds (64 at hidden 2048), beat
the Triton kernel where both run, and are taken by 'auto' up to MOSAIC_AUTO_ROWS, where they
were measured faster than scan_vjp. The CTC: the Pallas kernels on GPUs, optax elsewhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import jax
import jax.numpy as jnp

from ds2_jax import settings
from ds2_jax.kernels import common, mosaic_rnn, triton_rnn

# Rows per device up to which 'auto' takes the Mosaic kernels: where the seed layer measured
# faster than scan_vjp (benchmarks/results/2026-12-06-gpu-wide-calls/NOTES.md). At hidden 2048
# one call takes all 64 rows; above 64, calls would run one after another, not measured against
# scan_vjp: scan_vjp.
MOSAIC_AUTO_ROWS = 64
_LOGGED: set = set()
_QUIET: list = []  # non-empty inside unlogged()


@dataclasses.dataclass(frozen=True)
class Machine:
    """What the policies need to know of the device that runs the step."""

    backend: str  # jax.default_backend(): 'cpu', 'gpu', 'tpu'
    capability: str = ""  # NVIDIA compute capability ('9.0'); '' elsewhere
    sms: int | None = None  # streaming multiprocessors; None where unknown


def this_machine() -> Machine:
    device = jax.devices()[0]
    return Machine(jax.default_backend(), common.compute_capability(), getattr(device, "core_count", None))


def mosaic_runs(rows: int, dtype, hidden: int, directions: int, machine: Machine) -> bool:
    """Whether 'auto' runs the Mosaic GPU kernels on this problem here: Hopper, bfloat16, a
    hidden size they tile, a grid that is resident at once (`mosaic_rnn.unsupported`, with the
    SM count given instead of read), and at most MOSAIC_AUTO_ROWS rows (where measured)."""
    ctas = 2 * directions * (hidden // mosaic_rnn.COLS)
    return (
        machine.capability == common.HOPPER
        and jnp.dtype(dtype) == jnp.bfloat16
        and hidden % mosaic_rnn.HIDDEN_MULTIPLE == 0
        and mosaic_rnn.max_rows(hidden) > 0
        and rows <= MOSAIC_AUTO_ROWS
        and (machine.sms is None or ctas <= machine.sms)
    )


def choose_rnn(asked: str, cell: str, rows: int, dtype, hidden: int, directions: int, machine: Machine) -> str:
    """model.rnn_impl `asked` -> the implementation that runs `rows` rows (one device's) of a
    `directions` x `hidden` recurrence in `dtype` on `machine`.

    An explicit choice runs as asked (the kernels raise where they cannot), except that
    'pallas' whose shared memory would not fit is an error here, where 'auto' takes scan_vjp.
    """
    if asked not in settings.RNN_IMPLS:
        raise ValueError(f"model.rnn_impl={asked!r}: expected one of {sorted(settings.RNN_IMPLS)}")
    if asked == "auto" and cell not in settings.KERNEL_CELLS:
        return "scan"
    if asked not in ("auto", "pallas"):
        return asked
    if machine.backend != "gpu":  # the Triton kernel would run in Pallas interpret mode
        return "scan_vjp" if asked == "auto" else "pallas"
    if asked == "auto" and mosaic_runs(rows, dtype, hidden, directions, machine):
        return "mosaic"
    if not triton_rnn.fits(
        hidden, directions, jnp.dtype(dtype).itemsize, machine.sms or 1, common.shared_memory_bytes(machine.capability)
    ):
        if asked == "pallas":
            raise ValueError(
                f"rnn_impl='pallas': a {jnp.dtype(dtype).name} recurrence of width {hidden} does not fit "
                "the GPU's shared memory; use model.rnn_impl='auto' (falls back to scan_vjp) or bfloat16"
            )
        return "scan_vjp"
    if asked == "auto" and rows > triton_rnn.ROWS:
        return "scan_vjp"
    return "pallas"


def choose_ctc(asked: str, machine: Machine) -> str:
    """loss.ctc_impl `asked` -> 'optax' or 'pallas' (the forward-backward kernels, on GPUs)."""
    if asked not in settings.CTC_IMPLS:
        raise ValueError(f"loss.ctc_impl={asked!r}: expected one of {settings.CTC_IMPLS}")
    if asked == "auto":
        return "pallas" if machine.backend == "gpu" else "optax"
    return asked


@contextlib.contextmanager
def unlogged():
    """No choice is logged inside (parameter init traces the model on a dummy row; its
    choice is not the one training runs)."""
    _QUIET.append(True)
    try:
        yield
    finally:
        _QUIET.pop()


def log_choice(what: str, asked: str, chosen: str, detail: str = "") -> None:
    """Logs once per distinct choice which implementation 'auto' (or the config) ran."""
    key = (what, asked, chosen, detail)
    if key not in _LOGGED and not _QUIET:
        _LOGGED.add(key)
        where = ", ".join(filter(None, [detail, jax.default_backend()]))
        logging.getLogger("ds2_jax").info("%s: %s -> %s (%s)", what, asked, chosen, where)


def rnn_impl(asked: str, cell: str, xs: jax.Array, recurrent: jax.Array) -> str:
    """choose_rnn on this machine for projections xs [B, T, Dx, W] (one device's rows) and
    recurrent [D, H, G*H]; logged."""
    directions, hidden = recurrent.shape[0], recurrent.shape[1]
    chosen = choose_rnn(asked, cell, xs.shape[0], xs.dtype, hidden, directions, this_machine())
    log_choice("recurrence", asked, chosen, f"{cell}, {xs.shape[0]} rows per device, {xs.dtype}")
    return chosen


def ctc_impl(asked: str) -> str:
    """choose_ctc on this machine; logged."""
    chosen = choose_ctc(asked, this_machine())
    log_choice("ctc", asked, chosen)
    return chosen
