"""ds2_jax.plot draws metrics.jsonl's curves (the figure's lines hold the rows' numbers)
to a PNG; the input-wait panel appears only when the rows have input_wait_s."""

import json

import numpy as np
import pytest

from ds2_jax import plot

TRAIN = [{"step": s, "loss": 50.0 / s, "grad_norm": 9.0 / s, "learning_rate": 1e-3} for s in (10, 20, 30, 40)]
EVAL = [
    {"step": 20, "eval_wer": 0.5, "eval_cer": 0.2, "eval_loss": 4.0},
    {"step": 40, "eval_wer": 0.3, "eval_cer": 0.1, "eval_loss": 3.0},
]


def lines_by_panel(fig):
    return {
        ax.get_title(): {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
        for ax in fig.axes
    }


def test_each_panel_draws_its_keys_in_step_order():
    rows = EVAL[::-1] + TRAIN[::-1]  # out of order, as after a resume
    panels = lines_by_panel(plot.draw(rows))
    assert set(panels) == {"loss", "gradient norm", "error rates (eval, greedy)"}  # no input_wait_s
    assert panels["loss"]["train"] == ([10, 20, 30, 40], [5.0, 2.5, 50 / 30, 1.25])
    assert panels["loss"]["eval"] == ([20, 40], [4.0, 3.0])
    assert panels["gradient norm"]["train"][1] == pytest.approx([0.9, 0.45, 0.3, 0.225])
    assert panels["error rates (eval, greedy)"] == {"WER": ([20, 40], [0.5, 0.3]), "CER": ([20, 40], [0.2, 0.1])}


def test_input_wait_gets_a_panel_when_present():
    rows = [dict(r, input_wait_s=0.01 * i) for i, r in enumerate(TRAIN)]
    panels = lines_by_panel(plot.draw(rows))
    assert panels["input wait"]["input wait"] == ([10, 20, 30, 40], [0.0, 0.01, 0.02, 0.03])
    with pytest.raises(ValueError, match="no curves"):
        plot.draw([{"step": 1, "learning_rate": 1.0}])


def test_cli_writes_a_png_of_the_workdir(tmp_path, capsys):
    from matplotlib import image

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in TRAIN + EVAL))
    assert plot.main([f"--workdir={tmp_path}"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(tmp_path / "curves.png")
    pixels = image.imread(out)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 600
    assert np.asarray(pixels)[..., :3].std() > 0.05  # not a blank canvas
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        plot.main([f"--workdir={tmp_path / 'nothing'}"])


@pytest.mark.e2e
def test_make_plot_takes_any_workdir_a_shell_accepts(tmp_path):
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT

    workdir = tmp_path / "run 1 (bob's; a&b)"
    workdir.mkdir()
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in TRAIN + EVAL))
    # -o: the venv the target depends on is not built; PY: this interpreter
    proc = subprocess.run(
        ["make", "-s", "-o", ".venv/.stamp-base", "plot", f"PY={sys.executable}", f"WORKDIR={workdir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (workdir / "curves.png").stat().st_size > 0
