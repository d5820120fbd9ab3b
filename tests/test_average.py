"""Checkpoint averaging (ds2-average): the output is the arithmetic mean of the chosen checkpoints'
parameters, batch-norm statistics and EMA, at the newest one's step, a workdir that eval and
transcribe take like any other; --last and --best choose the right checkpoints; bad requests are
clear errors."""

import json
import os

import jax
import numpy as np
import pytest

from ds2_jax import average, checkpoint, evaluation, settings, train
from ds2_jax import state as state_lib
from tests.helpers import tiny_settings

SMALL = {
    "model.rnn_size": 16,
    "dataset.synthetic_min_duration_s": 0.4,
    "dataset.synthetic_max_duration_s": 0.6,
    "dataset.synthetic_pool_size": 8,
    "dataset.feature_stats_utterances": 8,
    "per_device_batch_size": 2,
    "num_devices": 1,
    "optimizer.learning_rate": 1e-2,
    "optimizer.ema_decay": 0.5,
    "num_train_steps": 4,
    "checkpoint_every_steps": 1,
    "keep_checkpoints": 3,
    "eval_every_steps": 1,
    "keep_best_checkpoints": 4,
    "eval.max_utterances": 4,
}


def leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(config, a workdir with checkpoints 2, 3, 4 (the newest 3) and 1-4 ranked by their evals)."""
    config = tiny_settings(**SMALL)
    workdir = str(tmp_path_factory.mktemp("avg") / "w")
    train.train_and_evaluate(config, workdir)
    return config, workdir


def raw(config, workdir, step):
    return state_lib.restore_state(settings.choosing_weights(config, False), workdir, step)[0]


@pytest.mark.slow
def test_the_average_of_two_checkpoints_is_their_arithmetic_mean(run, tmp_path):
    config, workdir = run
    out = str(tmp_path / "avg")
    steps, step = average.average_workdir(workdir, out, last=2)
    assert steps == [3, 4] and step == 4
    a, b = raw(config, workdir, 3), raw(config, workdir, 4)
    got = raw(config, out, None)
    for part in ("params", "batch_stats", "ema_params"):
        for x, y, m in zip(leaves(getattr(a, part)), leaves(getattr(b, part)), leaves(getattr(got, part))):
            np.testing.assert_allclose(m, (x + y) / 2, rtol=1e-6, atol=1e-7, err_msg=part)
        assert any(np.abs(x - y).max() > 1e-6 for x, y in zip(leaves(getattr(a, part)), leaves(getattr(b, part))))
    assert int(got.step) == 4
    np.testing.assert_array_equal(got.feature_mean, b.feature_mean)
    assert json.load(open(os.path.join(out, "averaged.json")))["steps"] == [3, 4]


def test_the_averaged_workdir_evaluates_and_transcribes_like_any_other(run, tmp_path):
    from ds2_jax.infer import load as infer

    config, workdir = run
    out = str(tmp_path / "avg")
    average.main([f"--workdir={workdir}", "--last=3", f"--out={out}"])
    result = evaluation.evaluate_splits(config, out)[config.dataset.eval_split]
    assert result["utterances"] == 4 and np.isfinite(result["loss"])
    waveform = (np.sin(np.arange(8000) / 5.0) * 4000).astype(np.int16)
    texts = infer.open_engine(workdir=out, config=settings.choosing_weights(config, True)).transcribe([waveform])
    assert len(texts) == 1 and isinstance(texts[0], str)


def test_best_averages_the_checkpoints_of_lowest_eval_wer(run, tmp_path):
    config, workdir = run
    mgr = checkpoint.manager(workdir)
    order = checkpoint.ranked(mgr)
    assert sorted(order) == [1, 2, 3, 4]
    wers = [mgr.metrics(s)["wer"] for s in order]
    assert wers == sorted(wers)
    steps, _ = average.average_workdir(workdir, str(tmp_path / "best"), best=2)
    assert steps == sorted(order[:2])


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"last": 9}, ValueError, r"--last=9: .* has 4 checkpoint"),
        ({"best": 5}, ValueError, r"--best=5: .* has 4 checkpoint\(s\) saved with an eval WER"),
        ({}, ValueError, "give one of --last=N or --best=N"),
        ({"last": 1, "best": 1}, ValueError, "give one of --last=N or --best=N"),
    ],
)
def test_a_request_the_workdir_cannot_meet_is_a_clear_error(run, tmp_path, kwargs, error, match):
    _, workdir = run
    with pytest.raises(error, match=match):
        average.average_workdir(workdir, str(tmp_path / "x"), **kwargs)


def test_the_output_must_be_a_new_workdir(run, tmp_path):
    _, workdir = run
    with pytest.raises(ValueError, match="is --workdir"):
        average.average_workdir(workdir, workdir, last=1)
    out = str(tmp_path / "o")
    average.average_workdir(workdir, out, last=1)
    with pytest.raises(FileExistsError, match="already holds checkpoints"):
        average.average_workdir(workdir, out, last=1)
