"""benchmarks/precision_parts.py: its error arithmetic, and (slow) the command on a tiny model."""

import json
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import precision_parts as pp
from tests.helpers import CORPUS, ROOT, quick_compile_env


def test_relative_error_counts_only_the_masked_frames():
    ref = np.array([[[1.0, 1.0], [3.0, 4.0]], [[0.0, 2.0], [9.0, 9.0]]])  # [B=2, T=2, C=2]
    value = ref.copy()
    value[0, 1] = [30.0, 40.0]  # a padded frame of row 0
    value[1, 0, 1] = 2.2
    mask = np.array([[True, False], [True, False]])
    assert pp.relative_error(value, ref, mask) == pytest.approx(0.2 / np.sqrt(1 + 1 + 4))
    assert pp.relative_error(value, ref) > 1.0  # unmasked, the padded garbage dominates
    assert pp.relative_error(np.zeros(3), np.zeros(3)) == 0.0 and pp.relative_error(np.ones(4), np.zeros(4)) == 2.0


def test_compare_masks_forward_parts_on_their_time_axis_and_nothing_else():
    b, t_in, t_out = 2, 6, 3
    masks = pp.time_masks(np.array([6, 2]), np.array([3, 1]), t_in, t_out)
    ref = {
        "forward/features": np.ones((b, t_in, 4)),
        "forward/RNNLayer_0": np.ones((b, t_out, 5)),
        "gradient/output/bias": np.ones((b, t_out)),
    }
    mine = {k: v.copy() for k, v in ref.items()}
    mine["forward/features"][1, 2:] = 7.0  # row 1 beyond its 2 input frames
    mine["forward/RNNLayer_0"][1, 1:] = 7.0  # row 1 beyond its 1 output frame
    mine["gradient/output/bias"][1, 2] = 2.0  # not a forward part: every entry counts
    errors = pp.compare(mine, ref, masks)
    assert errors["forward/features"] == 0.0 and errors["forward/RNNLayer_0"] == 0.0
    assert errors["gradient/output/bias"] == pytest.approx(1 / np.sqrt(6))


def test_module_outputs_are_read_from_flax_intermediates():
    inter = {"ConvBlock_0": {"__call__": (("x0", "lengths"),)}, "output": {"__call__": ("logits",)}}
    flat = pp.flat_paths(inter)
    assert set(flat) == {"ConvBlock_0/__call__", "output/__call__"}
    assert (
        pp.module_output(flat["ConvBlock_0/__call__"]) == "x0" and pp.module_output(flat["output/__call__"]) == "logits"
    )


@pytest.mark.slow
def test_parts_command_measures_every_part_and_tracks_the_error(tmp_path):
    from ds2_jax.datasets import build

    data_dir = str(tmp_path / "tfds")
    build.build(CORPUS, data_dir)
    out = tmp_path / "parts"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.precision_parts",
            f"--out={out}",
            "--batches=1",
            "--rnn_impls=scan_vjp",
            f"--data_dir={data_dir}",
            "--track_steps=2",
            "--track_points=2",
            "--config.num_devices=1",
            "--config.model.conv_channels=4",
            "--config.model.num_conv_layers=1",  # (a smaller compile: the conv count is no question here)
            "--config.model.num_rnn_layers=1",
            "--config.model.rnn_size=16",
            "--config.model.scan_unroll=1",  # the seed's 8: the same sums, a longer compile
            "--config.dataset.num_buckets=1",  # every batch one shape: each program compiled once
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=quick_compile_env(JAX_PLATFORMS="cpu"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "parts.json").read_text())
    bf16, floor = result["parts"]["bfloat16 scan_vjp"], result["parts"][" ".join(pp.FLOOR)]
    for part in (
        "forward/ConvBlock_0",
        "forward/RNNLayer_0/input_proj_bn",
        "forward/logits",
        "ctc/d_logits",
        "gradient/RNNLayer_0/recurrent_kernel",
        "gradient/output/bias",
        "adam/update",
    ):
        assert 0 < bf16[part] < 1 and 0 < floor[part] < 1, part
    assert bf16["forward/features"] == 0.0  # float32 in both
    assert bf16["reduce/gradient dtype is float32"] == 1.0
    assert [row["step"] for row in result["track"]] == [0, 2]
    assert all(0 < row["bfloat16 scan_vjp"] < 1 for row in result["track"])
    assert "| gradient/output/bias |" in (out / "NOTES.md").read_text()
