"""The train loop's progress bar counts finished steps, shows loss and utt/s, and lets log
lines through whole; a finished workdir says there is nothing to train."""

import io
import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ds2_jax import progress, train
from tests.helpers import TRAIN_STEPS


@jax.jit
def slow_step(x, loss):
    """Step metrics that take a while to compute (so they are not ready at dispatch)."""
    y = jax.lax.fori_loop(0, 300, lambda i, a: jnp.tanh(a @ a), x)
    return {
        "steps": 1.0 + 0 * y.sum(),
        "utterances": jnp.float32(8),
        "loss_sum": loss * 4,
        "loss_count": jnp.float32(4),
    }


def test_bar_advances_when_steps_finish_not_when_dispatched():
    x = jnp.full((256, 256), 0.01)
    jax.block_until_ready(slow_step(x, 1.0))  # compiled
    bar = progress.StepProgress(start=10, total=20, enabled=True)
    bar.bar.fp = io.StringIO()
    steps = [slow_step(x, jnp.float32(loss)) for loss in (3.0, 2.0, 1.5)]
    bar.dispatched(steps[0])
    assert bar.finished == 10 and bar.bar.n == 10  # still running on the device
    bar.dispatched(steps[1])
    bar.dispatched(steps[2])
    bar.wait_all()
    assert bar.finished == bar.bar.n == 13
    postfix = bar.bar.postfix
    assert "loss=1.500" in postfix  # the last finished step's loss_sum / loss_count
    assert "utt/s=" in postfix and float(postfix.split("utt/s=")[1].split(",")[0]) > 0
    bar.dispatched(slow_step(x, jnp.float32(1.0)))
    jax.block_until_ready(steps)
    bar.wait_all()
    assert bar.bar.n == 14
    bar.close()


def test_rates_and_eta_leave_out_the_first_step_which_compiles(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    bar = progress.StepProgress(start=0, total=1000, enabled=True)
    bar.bar.fp = io.StringIO()
    step = {
        "steps": np.float32(1),
        "utterances": np.float32(16),
        "loss_sum": np.float32(3),
        "loss_count": np.float32(2),
    }
    clock[0] += 60.0  # the first step compiles for a minute
    bar.dispatched(step)
    for _ in range(100):  # then 100 steps/s
        clock[0] += 0.01
        bar.dispatched(step)
    assert bar.bar.postfix == "last step loss=1.500, step/s=100, utt/s=1600.0, eta=00:08"  # 899 steps left
    assert "s/step" not in str(bar.bar) and "step/s]" not in str(
        bar.bar
    )  # tqdm's own rate (since the start) is not shown
    bar.close()


def _absl_handler():
    from absl import logging as absl_logging

    return absl_logging.ABSLHandler(absl_logging.PythonFormatter())  # what absl.app puts on the root


@pytest.mark.parametrize("make_handler", [logging.StreamHandler, _absl_handler], ids=["stream", "absl"])
def test_log_lines_clear_the_bar_and_it_comes_back(capsys, make_handler):
    handler = make_handler()  # writes to sys.stderr, where the bar is drawn
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        bar = progress.StepProgress(start=0, total=5, enabled=True)
        bar.bar.update(2)
        bar.bar.refresh()
        logging.getLogger("ds2_jax").warning("a log line")
        bar.close()
        logging.getLogger("ds2_jax").warning("after close")
    finally:
        root.removeHandler(handler)
    err = capsys.readouterr().err
    # The record (absl's: a first 'Logging before flag parsing' line, then 'W1203 12:00:00.123
    # ... file.py:N] ') starts where the bar was cleared (spaces after the last \r), not after it.
    record = re.search(r"(WARNING: Logging before flag parsing[^\n]*\n)?(W\d{4} [^\r\n]*\] )?a log line\n", err)
    assert record, repr(err[:300])
    before = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", err[: record.start()])  # tqdm's cursor moves (another bar open)
    assert before.rsplit("\r", 1)[-1].strip() == "", repr(before[-120:])
    assert "2/5" in err[record.end() :]  # and redrawn below the log line
    assert "handle" not in handler.__dict__  # close() put the handler back as it was


@pytest.mark.slow
@pytest.mark.xdist_group("trained")  # one worker trains it (conftest.py)
def test_a_finished_workdir_has_nothing_to_train(trained, caplog):
    """`trained` (conftest.py): the demo model, trained once per session."""
    caplog.set_level(logging.INFO, logger="ds2_jax")
    state = train.train_and_evaluate(trained.config, trained.workdir)
    assert int(state.step) == TRAIN_STEPS
    messages = [r.getMessage() for r in caplog.records if r.name == "ds2_jax"]
    assert any(
        m.startswith(f"nothing to train: workdir already at step {TRAIN_STEPS} of {TRAIN_STEPS}") for m in messages
    )
    assert not any(m.startswith("first step") or m.startswith("step ") for m in messages), messages


def test_the_training_bar_is_shown_on_a_terminal_only(tmp_path, monkeypatch):
    import os

    from ds2_jax import reporting, settings

    master, follower = os.openpty()
    with open(follower, "w") as terminal, open(tmp_path / "log.txt", "w") as log_file:
        assert progress.on_a_terminal(terminal) and not progress.on_a_terminal(log_file)
        assert not progress.on_a_terminal(io.StringIO()) and not progress.on_a_terminal(object())
        config = settings.from_config_dict(settings.to_config_dict())
        shown = {}
        for name, stream in (("terminal", terminal), ("file", log_file)):
            monkeypatch.setattr("sys.stderr", stream)
            for chief, key in ((True, name), (False, f"{name}, not the chief")):
                with (
                    reporting.Reporter(config, str(tmp_path / key), start=0, is_chief=chief) as report,
                    report.showing_bar(),
                ):  # closed: it gives the log handlers back
                    shown[key] = not report.bar.bar.disable
    os.close(master)
    assert shown == {"terminal": True, "file": False, "terminal, not the chief": False, "file, not the chief": False}


def test_the_log_line_says_the_time_left():
    from ds2_jax import reporting

    assert reporting.time_left(0.25, 14_400) == " eta=1:00:00" and reporting.time_left(2.0, 1) == " eta=0:00:02"
    assert reporting.time_left(0.25, 0) == ""
