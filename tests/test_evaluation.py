"""The eval step is compiled and placed by `parallel.Parallel`, as the train step is:
evaluating during training reads the train state where it lives on the devices (no host
round trip under parallelism='jit'), and --mode=eval gives the same figures under pmap,
jit and eager, placing the restored state once, and scores several splits each on its own."""

import jax
import numpy as np
import pytest

from ds2_jax import eval_step, evaluation, parallel, settings, train
from tests.helpers import tiny_config, tiny_settings

SHORT = {"dataset.synthetic_min_duration_s": 0.3, "dataset.synthetic_max_duration_s": 0.4}  # eager stays quick


def _record_steps(monkeypatch) -> dict:
    """Wraps Parallel.compile: records the state each train step returns and the state
    each eval step is given; the eval step runs with host<->device transfers refused."""
    seen = {"train": None, "eval": []}
    compile_ = parallel.Parallel.compile

    def compile(self, step_fn, kwargs, donate=True):
        fn = compile_(self, step_fn, kwargs, donate)
        if step_fn is train.train_step:

            def train_fn(*args):
                seen["train"] = (out := fn(*args))[0]
                return out

            return train_fn
        if step_fn is eval_step.eval_step:

            def eval_fn(state, batch):
                seen["eval"].append((state, seen["train"]))
                with (
                    jax.transfer_guard_host_to_device("disallow_explicit"),
                    jax.transfer_guard_device_to_host("disallow_explicit"),
                ):
                    return fn(state, batch)

            return eval_fn
        return fn

    monkeypatch.setattr(parallel.Parallel, "compile", compile)
    return seen


@pytest.mark.parametrize("kind", settings.PARALLELISMS)
@pytest.mark.slow
def test_eval_during_training_reads_the_placed_train_state(kind, tmp_path, monkeypatch):
    seen = _record_steps(monkeypatch)
    config = tiny_config(
        parallelism=kind,
        num_train_steps=2,
        log_every_steps=1,
        eval_every_steps=1,
        checkpoint_every_steps=100,
        **{"eval.max_utterances": 8, **SHORT},
    )
    train.train_and_evaluate(config, str(tmp_path))
    assert len(seen["eval"]) == 2  # one batch after each of steps 1 and 2, through Parallel's eval step
    for eval_state, train_state in seen["eval"]:
        # the very arrays the last train step returned: not a host copy placed again
        for got, want in zip(
            jax.tree_util.tree_leaves(eval_state), jax.tree_util.tree_leaves(train_state), strict=True
        ):
            assert got is want


@pytest.mark.slow  # 15-60 s on 2 idle cores (2026-12-05): make test runs it, test-fast does not
def test_pmap_jit_and_eager_evaluate_a_checkpoint_alike_placing_it_once(tmp_path, monkeypatch):
    w = str(tmp_path)
    common = {
        "log_every_steps": 2,
        "eval_every_steps": 0,
        "checkpoint_every_steps": 100,
        "eval.max_utterances": 12,
        **SHORT,
    }  # 12 of a 16-row batch: the last rows are padding
    train.train_and_evaluate(tiny_config(num_train_steps=2, **common), w)
    placed, put = [], parallel.Parallel.put_replicated
    monkeypatch.setattr(parallel.Parallel, "put_replicated", lambda self, t: placed.append(self.kind) or put(self, t))
    results = {}
    # 8 devices x 2 rows; eagerly one device takes the same 16 rows (one batch: op by op is slow)
    for kind, overrides in [
        ("pmap", {}),
        ("jit", {"parallelism": "jit"}),
        ("eager", {"compile": False, "per_device_batch_size": 16}),
    ]:
        config = tiny_config(num_train_steps=2, **common, **overrides)
        results[kind] = evaluation.evaluate_splits(config, w, split="dev-clean, test-clean")
    assert placed == ["pmap", "jit", "eager"]  # once per evaluation, for both splits
    ref = results["pmap"]["dev-clean"]
    assert ref["utterances"] == 12 and np.isfinite(ref["loss"]) and ref["loss"] > 0
    for kind, by_split in results.items():
        for split, r in by_split.items():
            assert r["utterances"] == 12, (kind, split)
            np.testing.assert_allclose(
                [r["loss"], r["cer"], r["wer"]],
                [ref["loss"], ref["cer"], ref["wer"]],
                rtol=1e-5,
                err_msg=f"{kind} {split}",
            )
            assert [e["hypothesis"] for e in r["examples"]] == [e["hypothesis"] for e in ref["examples"]], kind


def test_several_splits_are_each_scored_on_their_own_and_written_to_their_own_file(tmp_path, monkeypatch):
    """--mode=eval with eval.split='dev-clean, test-clean' and beam search: one result per
    split, in the order listed, each over its own utterances, each in its own json (the
    slow test of the trained model checks the same on real splits)."""
    import json
    import os

    from ds2_jax import checkpoint, workdir_config
    from ds2_jax import state as state_lib
    from ds2_jax.pipeline.synthetic import SyntheticSource

    pytest.importorskip("flashlight.lib.text")
    sizes = {"dev-clean": 12, "test-clean": 4}  # the synthetic source serves one split: sizes tell them apart
    real = SyntheticSource.eval_batches
    monkeypatch.setattr(
        SyntheticSource, "eval_batches", lambda self, split, max_utterances=0: real(self, split, sizes[split])
    )
    config = tiny_settings(**{**SHORT, "decoding.beam_width": 2})
    w = str(tmp_path)
    num_bins = 161
    fresh = state_lib.create_state(
        config, jax.random.PRNGKey(0), np.zeros(num_bins, np.float32), np.ones(num_bins, np.float32)
    )
    with checkpoint.managed(w) as mgr:
        checkpoint.save(mgr, 3, jax.device_get(fresh), wait=True)
    workdir_config.save_config(config, w)
    results = evaluation.evaluate_splits(config, w, split="dev-clean, test-clean")
    assert list(results) == ["dev-clean", "test-clean"]
    for split, n in sizes.items():
        r = results[split]
        assert (r["split"], r["step"], r["utterances"]) == (split, 3, n)
        assert np.isfinite(r["loss"]) and r["beam"]["beam_width"] == 2
        saved = json.load(open(os.path.join(w, f"eval-{split}-3-beam2-max16.json")))
        assert (saved["split"], saved["utterances"]) == (split, n) and saved["beam"]["wer"] == r["beam"]["wer"]


def test_one_run_scores_two_splits_of_other_contents_each_over_its_own_utterances(tmp_path):
    """--mode=eval over a real prepared dataset (librispeech_local) with eval.split='test-clean,
    dev-clean' (dataset.eval_split is dev-clean): each result holds exactly its own split's
    references (every one: each split has fewer than the 10 examples a result keeps), its own
    count, and the loss, error rates and texts the split gets when evaluated alone."""
    from ds2_jax import checkpoint, workdir_config
    from ds2_jax import state as state_lib
    from tests import librispeech_testdata as td

    manual = str(tmp_path / "manual")
    # word counts 2, 4, 6, 8 (dev) and 3, 5, 7 (test): no transcript is in both splits
    td.write_durations_corpus(manual, "train-clean-100", [1.0, 1.4, 1.8, 3.4])  # one shape fits every eval row
    want = {
        "dev-clean": td.write_durations_corpus(manual, "dev-clean", [0.8, 1.6, 2.4, 3.2], first_speaker=40),
        "test-clean": td.write_durations_corpus(manual, "test-clean", [1.2, 2.0, 2.8], first_speaker=60),
    }
    assert not {u["text"] for u in want["dev-clean"]} & {u["text"] for u in want["test-clean"]}
    config = tiny_settings(
        num_devices=1,
        **{
            "dataset.name": "librispeech_local",
            "dataset.manual_dir": manual,
            "dataset.data_dir": str(tmp_path / "tfds"),
            "dataset.train_splits": "train-clean-100",
            "dataset.eval_split": "dev-clean",
            "dataset.num_workers": 0,
            "dataset.num_buckets": 1,
            "eval.max_utterances": 0,
        },
    )
    w = str(tmp_path / "w")
    num_bins = 161
    fresh = state_lib.create_state(
        config, jax.random.PRNGKey(0), np.zeros(num_bins, np.float32), np.ones(num_bins, np.float32)
    )
    with checkpoint.managed(w) as mgr:
        checkpoint.save(mgr, 1, jax.device_get(fresh), wait=True)
    workdir_config.save_config(config, w)
    both = evaluation.evaluate_splits(config, w, split="test-clean, dev-clean")
    assert list(both) == ["test-clean", "dev-clean"]
    run = evaluation.prepare(config, w)
    for split, utts in want.items():
        r = both[split]
        assert (r["split"], r["utterances"]) == (split, len(utts))
        assert sorted(e["reference"] for e in r["examples"]) == sorted(u["text"] for u in utts), split
        alone = evaluation.evaluate(run.p_eval, run.state, run.source, split, 0, run.par)
        for key in ("loss", "cer", "wer"):
            assert r[key] == pytest.approx(alone[key], rel=1e-6), (split, key)
        assert r["examples"] == alone["examples"]
    assert both["test-clean"]["loss"] != pytest.approx(both["dev-clean"]["loss"], rel=1e-3)
