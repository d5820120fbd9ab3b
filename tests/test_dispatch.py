"""kernels.dispatch: the one place 'auto' is decided, for the recurrence and the CTC loss.

The policies are pure functions of the problem and the machine, so the GPU decisions are
checked here on the CPU. The expected answers are the decisions of the code before the
dispatch moved into one module (recurrence.resolve_impl/_impl_for, ctc.resolve_impl).
"""

import logging

import jax
import jax.numpy as jnp
import pytest

from ds2_jax.kernels import dispatch, mosaic_rnn

CPU = dispatch.Machine("cpu")
H200 = dispatch.Machine("gpu", "9.0", 132)
HOPPER_64_SMS = dispatch.Machine("gpu", "9.0", 64)
A100 = dispatch.Machine("gpu", "8.0", 108)
T4 = dispatch.Machine("gpu", "7.5", 40)  # an unknown shared-memory size: the smallest known is assumed
BF16, F32 = jnp.bfloat16, jnp.float32

# (asked, cell, rows per device, dtype, hidden, directions, machine) -> the implementation
DECISIONS = [
    ("auto", "simple", 16, F32, 2048, 2, CPU, "scan_vjp"),  # the kernels would be interpreted
    ("pallas", "simple", 64, F32, 4096, 2, CPU, "pallas"),  # explicit: interpret mode, no fit check
    ("auto", "lstm", 16, BF16, 2048, 2, CPU, "scan"),
    ("auto", "gru", 16, BF16, 2048, 2, H200, "scan"),  # the kernels are clipped-ReLU only
    ("scan_vjp", "gru", 16, BF16, 256, 2, A100, "scan_vjp"),  # explicit: the impl raises, not the policy
    ("auto", "simple", 16, BF16, 2048, 2, H200, "mosaic"),  # the seed layer on Hopper
    ("auto", "simple", 3, BF16, 2048, 2, H200, "mosaic"),  # padded to the kernel's batch
    ("auto", "simple", 16, BF16, 2048, 1, H200, "mosaic"),
    ("auto", "simple", 17, BF16, 2048, 2, H200, "mosaic"),  # two calls of 16 rows (padded)
    ("auto", "simple", 48, BF16, 2048, 2, H200, "mosaic"),  # one call, the state in 4 pieces
    ("auto", "simple", 64, BF16, 2048, 2, H200, "mosaic"),  # one call: measured faster than scan_vjp
    ("auto", "simple", 65, BF16, 2048, 2, H200, "scan_vjp"),  # above MOSAIC_AUTO_ROWS
    ("mosaic", "simple", 64, BF16, 2048, 2, H200, "mosaic"),  # explicit: one call, the state in pieces
    ("auto", "simple", 16, BF16, 4096, 1, H200, "scan_vjp"),  # half of W alone exceeds shared memory
    ("auto", "simple", 16, F32, 256, 2, H200, "pallas"),  # Mosaic: bfloat16 only
    ("auto", "simple", 16, BF16, 96, 2, H200, "pallas"),  # Mosaic: hidden a multiple of 128
    ("auto", "simple", 16, F32, 2048, 2, H200, "scan_vjp"),  # the Triton kernel's shared memory would not fit
    ("pallas", "simple", 16, BF16, 2048, 2, H200, "pallas"),  # explicit 'pallas' never becomes mosaic
    ("pallas", "simple", 32, BF16, 256, 2, H200, "pallas"),  # ... nor scan_vjp above 16 rows
    ("auto", "simple", 16, BF16, 2048, 2, HOPPER_64_SMS, "scan_vjp"),  # Mosaic's 128 CTAs cannot all be resident
    ("auto", "simple", 16, BF16, 1024, 2, HOPPER_64_SMS, "mosaic"),  # 64 CTAs can
    ("auto", "simple", 16, BF16, 2048, 2, A100, "scan_vjp"),  # no Mosaic; Triton: 64 columns x 2048 > 163 KB
    ("auto", "simple", 16, BF16, 1024, 2, A100, "pallas"),
    ("auto", "simple", 17, BF16, 256, 2, A100, "scan_vjp"),
    ("mosaic", "simple", 16, F32, 2048, 2, A100, "mosaic"),  # explicit: the impl raises, not the policy
    ("auto", "simple", 16, BF16, 1024, 2, T4, "scan_vjp"),
    ("auto", "simple", 16, BF16, 256, 2, T4, "pallas"),
]


@pytest.mark.parametrize("asked, cell, rows, dtype, hidden, directions, machine, expected", DECISIONS)
def test_rnn_policy_gives_the_decisions_of_before(asked, cell, rows, dtype, hidden, directions, machine, expected):
    assert dispatch.choose_rnn(asked, cell, rows, dtype, hidden, directions, machine) == expected


def test_explicit_pallas_that_does_not_fit_is_an_error_naming_the_way_out():
    with pytest.raises(ValueError, match="does not fit.*rnn_impl='auto'"):
        dispatch.choose_rnn("pallas", "simple", 16, F32, 2048, 2, H200)
    with pytest.raises(ValueError, match="model.rnn_impl='warp'"):
        dispatch.choose_rnn("warp", "simple", 16, F32, 16, 2, CPU)


@pytest.mark.parametrize("dtype", [BF16, F32])
@pytest.mark.parametrize("hidden", [96, 128, 256, 1000, 2048, 4096])
@pytest.mark.parametrize("directions", [1, 2])
def test_mosaic_fit_is_the_kernels_own(dtype, hidden, directions):
    """The policy's copy of the Mosaic kernels' limits says what mosaic_rnn.unsupported says
    (off Hopper unsupported skips the SM count; so does a machine whose count is unknown)."""
    hopper = dispatch.Machine("gpu", "9.0", None)
    for rows in (16, mosaic_rnn.MAX_ROWS):
        runs = mosaic_rnn.unsupported(dtype, rows, directions, hidden) is None
        assert dispatch.mosaic_runs(rows, dtype, hidden, directions, hopper) == runs, rows
        assert not dispatch.mosaic_runs(rows, dtype, hidden, directions, A100)


def test_ctc_policy():
    assert dispatch.choose_ctc("auto", CPU) == "optax"
    assert dispatch.choose_ctc("auto", A100) == "pallas"
    assert dispatch.choose_ctc("optax", H200) == "optax"
    assert dispatch.choose_ctc("pallas", CPU) == "pallas"  # interpret mode
    with pytest.raises(ValueError, match="loss.ctc_impl='warp'"):
        dispatch.choose_ctc("warp", CPU)


def test_this_machine_decides_and_logs_each_choice_once(caplog, monkeypatch):
    monkeypatch.setattr(dispatch, "_LOGGED", set())  # forget what earlier tests logged
    xs, w = jnp.zeros((5, 3, 1, 24)), jnp.zeros((2, 24, 24))
    here = dispatch.this_machine()
    assert here.backend == jax.default_backend()
    expected = dispatch.choose_rnn("auto", "simple", 5, F32, 24, 2, here)
    with caplog.at_level(logging.INFO, logger="ds2_jax"):
        for _ in range(3):
            assert dispatch.rnn_impl("auto", "simple", xs, w) == expected
            assert dispatch.ctc_impl("auto") == dispatch.choose_ctc("auto", here)
    lines = [r.getMessage() for r in caplog.records if "->" in r.getMessage()]
    assert sorted(line.split(":")[0] for line in lines) == ["ctc", "recurrence"], lines
    assert any("5 rows per device" in line for line in lines), lines
