"""keep_best_checkpoints: the checkpoints with the lowest in-training eval WER kept beside the
newest (orbax's own BestN and LatestN), --eval_step=best, and a kill while they are chosen."""

import glob
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from ds2_jax import checkpoint, evaluation, metrics, train
from ds2_jax.infer import jax_backend
from ds2_jax.tools import build_lm
from tests import helpers
from tests.helpers import tiny_config


def test_the_lowest_wer_checkpoints_are_kept_beside_the_newest_across_a_restart(tmp_path):
    wers = {1: 0.9, 2: 0.5, 3: 0.7, 4: 0.3, 5: 0.8, 6: 0.95}
    mgr = checkpoint.manager(str(tmp_path), keep=1, keep_best=2)
    for step, wer in wers.items():
        checkpoint.save(mgr, step, {"w": np.full(3, step, np.float32)}, wait=True, metrics={"wer": wer, "cer": wer / 2})
    assert mgr.all_steps() == [2, 4, 6]  # the 2 best (0.3, 0.5) and the newest
    assert checkpoint.best(mgr) == (4, {"wer": 0.3, "cer": 0.15})
    mgr.close()
    mgr = checkpoint.manager(str(tmp_path), keep=1, keep_best=2)  # a resumed run reads the WERs back from disk
    checkpoint.save(mgr, 7, {"w": np.zeros(3, np.float32)}, wait=True)  # a checkpoint without an eval
    checkpoint.save(mgr, 8, {"w": np.zeros(3, np.float32)}, wait=True, metrics={"wer": 0.4, "cer": 0.2})
    assert mgr.all_steps() == [4, 8]  # 0.3 and 0.4; 7 is no longer the newest and has no WER
    assert checkpoint.best(checkpoint.manager(str(tmp_path))) == (4, {"wer": 0.3, "cer": 0.15})
    mgr.close()


def test_a_resume_that_keeps_no_best_deletes_none_of_those_kept_before(tmp_path, caplog):
    mgr = checkpoint.manager(str(tmp_path), keep=1, keep_best=1)
    for step, wer in {1: 0.5, 2: 0.9, 3: 0.7}.items():
        checkpoint.save(mgr, step, {"w": np.full(3, step, np.float32)}, wait=True, metrics={"wer": wer, "cer": wer / 2})
    assert mgr.all_steps() == [1, 3]  # the best and the newest (both ranked by their eval)
    mgr.close()
    caplog.set_level("INFO", logger="ds2_jax")
    with checkpoint.managed(str(tmp_path), keep=1) as mgr:  # resumed with keep_best_checkpoints=0
        for step in (4, 5, 6):
            checkpoint.save(mgr, step, {"w": np.full(3, step, np.float32)}, wait=True)
        assert mgr.all_steps() == [1, 3, 6]  # 4 and 5 went as newest; 1 and 3 stay
    assert "the best checkpoints an earlier run kept (steps 1, 3) stay untouched" in caplog.text
    assert checkpoint.best(checkpoint.manager(str(tmp_path))) == (1, {"wer": 0.5, "cer": 0.25})
    mgr = checkpoint.manager(str(tmp_path), keep=1, keep_best=1)  # ranking again drops the worse of them
    checkpoint.save(mgr, 7, {"w": np.zeros(3, np.float32)}, wait=True)
    assert mgr.all_steps() == [1, 7]
    mgr.close()


def _eval_wers(workdir) -> dict[int, tuple[float, float]]:
    """{step: (eval WER, CER)} of metrics.jsonl."""
    return {
        r["step"]: (r["eval_wer"], r["eval_cer"])
        for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
        if "eval_wer" in r
    }


def _best(wers: dict[int, tuple[float, float]]) -> int:
    """The lowest WER, then CER; the newest of equals."""
    return min(wers, key=lambda s: (*wers[s], -s))


@pytest.mark.slow  # 15 s or more on 2 cores (2026-12-06 durations): make test runs it, test-fast does not
def test_eval_of_best_scores_the_step_with_the_lowest_in_training_wer(tmp_path, caplog):
    config = tiny_config(
        num_train_steps=8,
        eval_every_steps=2,
        checkpoint_every_steps=3,
        keep_checkpoints=1,
        keep_best_checkpoints=1,
        log_every_steps=2,
        **{"eval.max_utterances": 8, "optimizer.learning_rate": 3e-3},
    )
    workdir = str(tmp_path / "w")
    train.train_and_evaluate(config, workdir)
    wers = _eval_wers(workdir)
    assert sorted(wers) == [2, 4, 6, 8] and len(set(wers.values())) > 1, wers  # they differ (in CER at least)
    best = _best(wers)
    mgr = checkpoint.manager(workdir)
    assert mgr.all_steps() == sorted({best, 8})  # the best and the newest; 3 and 6 (no eval at 3) are gone
    result = evaluation.evaluate_checkpoint(config, workdir, step="best")
    assert result["step"] == best == result["best_checkpoint"]["step"]
    # the same utterances, the same state
    assert (result["wer"], result["cer"]) == pytest.approx(wers[best], abs=1e-9)
    assert (result["best_checkpoint"]["wer"], result["best_checkpoint"]["cer"]) == pytest.approx(wers[best], abs=1e-9)
    assert jax_backend.JaxEngine(workdir, step="best").step == best  # transcribe --step=best
    lm = str(tmp_path / "lm.arpa")  # tune_lm --step=best: the same checkpoint, by the same resolution
    build_lm.write_arpa(*build_lm.estimate(build_lm.sentences(["the cat sat", "a dog ran"]), 2), lm)
    tune = subprocess.run(
        [
            sys.executable,
            "-m",
            "ds2_jax.tools.tune_lm",
            f"--workdir={workdir}",
            f"--lm={lm}",
            "--step=best",
            "--alphas=0",
            "--betas=0",
            "--beam_width=4",
            "--max_utterances=8",
        ],
        cwd=helpers.ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tune.returncode == 0, tune.stderr[-2000:]
    (tuned,) = glob.glob(os.path.join(workdir, "tune_lm-dev-clean-*.json"))
    assert best != 8 and os.path.basename(tuned).startswith(f"tune_lm-dev-clean-{best}-")  # 8, the newest: 'latest'
    greedy = json.load(open(tuned))["greedy"]
    assert (greedy["wer"], greedy["cer"]) == pytest.approx(wers[best], abs=1e-9)
    assert not [r for r in caplog.records if "tracked_metric" in r.getMessage()]  # orbax's warning at step 3's save


def test_best_without_any_ranked_checkpoint_is_one_error_naming_the_setting(tmp_path):
    config = tiny_config(num_train_steps=2, eval_every_steps=0, checkpoint_every_steps=2)
    train.train_and_evaluate(config, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"none is 'best': train with --config.keep_best_checkpoints=N"):
        evaluation.evaluate_checkpoint(config, str(tmp_path), step="best")


@pytest.mark.slow
@pytest.mark.e2e
def test_a_kill_while_the_best_are_chosen_loses_none_of_them(tmp_path):
    common = [
        "--config.num_train_steps=8",
        "--config.eval_every_steps=2",
        "--config.checkpoint_every_steps=100",
        "--config.keep_checkpoints=1",
        "--config.keep_best_checkpoints=1",
        "--config.eval.max_utterances=8",
        "--config.optimizer.learning_rate=3e-3",
        f"--workdir={tmp_path}",
    ]
    # SIGKILL right after checkpoint 6 (ranked by its eval) was handed to orbax: the choice among 2, 4, 6 in flight
    killed = helpers.launch(*common, "--config.faults.kill_at=checkpoint:6", quick_compile=True)
    assert killed.returncode == -signal.SIGKILL
    before = _eval_wers(tmp_path)
    kept = checkpoint.manager(str(tmp_path)).all_steps()
    assert _best({s: w for s, w in before.items() if s < 6}) in kept  # the best before 6 survived the kill
    done = helpers.launch(*common, quick_compile=True)
    assert done.returncode == 0, done.stderr[-2000:]
    wers = _eval_wers(tmp_path)
    assert sorted(wers) == [2, 4, 6, 8]
    assert checkpoint.manager(str(tmp_path)).all_steps() == sorted({_best(wers), 8})
    ev = helpers.launch(*common, "--mode=eval", "--eval_step=best", quick_compile=True)
    assert ev.returncode == 0, ev.stderr[-2000:]
    result = json.load(open(tmp_path / f"eval-dev-clean-{_best(wers)}-greedy-max8.json"))  # eval.max_utterances=8
    assert result["best_checkpoint"]["step"] == result["step"] == _best(wers)
    bad = helpers.launch(*common, "--mode=eval", "--eval_step=newest", quick_compile=True)
    assert (
        bad.returncode == 2
        and bad.stderr.strip() == "error: --eval_step=newest: must be a step number (>= 0) or 'best'"
    )


@pytest.mark.parametrize(
    "scores, best",
    [
        ({1: (0.5, 0.2), 2: (0.5, 0.1), 3: (0.6, 0.0)}, 2),  # equal WER: the lower CER
        ({1: (0.5, 0.1), 2: (0.5, 0.2), 3: (0.6, 0.0)}, 1),  # ... whichever step holds it
        ({1: (0.5, 0.2), 2: (0.5, 0.2), 3: (0.9, 0.9)}, 2),  # equal WER and CER: the newest
        ({1: (0.9, 0.9), 2: (0.5, 0.2), 3: (0.5, 0.2)}, 3),
        ({1: (0.4, 0.3), 2: (0.5, 0.0), 3: (0.7, 0.0)}, 1),  # WER first, CER only between equals
    ],
)
@pytest.mark.parametrize("keep_best", [1, 3])
def test_ties_and_orders_of_eval_results_pick_the_best_by_wer_then_cer_then_the_newest(
    tmp_path, scores, best, keep_best
):
    """Hand-made eval results with ties: checkpoint.best (with every step kept: keep_best=3) and the
    checkpoint orbax keeps as the best (keep_best=1, beside the newest) agree, by WER, then CER,
    then the newest of equals."""
    mgr = checkpoint.manager(str(tmp_path), keep=1, keep_best=keep_best)
    for step, (wer, cer) in scores.items():
        checkpoint.save(mgr, step, {"w": np.full(2, step, np.float32)}, wait=True, metrics={"wer": wer, "cer": cer})
    newest = max(scores)
    assert checkpoint.best(mgr) == (best, {"wer": scores[best][0], "cer": scores[best][1]})
    assert mgr.all_steps() == (sorted({best, newest}) if keep_best == 1 else sorted(scores))
    mgr.close()
    reopened = checkpoint.manager(str(tmp_path))  # a later --eval_step=best reads them back
    assert checkpoint.best(reopened)[0] == best
    reopened.close()
