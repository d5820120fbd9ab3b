"""Error rates against hand-counted edits, and the per-step metric sums."""

import numpy as np
import pytest

from ds2_jax import metrics


def test_error_rates_are_corpus_edits_over_reference_length():
    refs = ["the cat sat", "a dog"]
    hyps = ["the bat sat", "a dog ran"]
    # words: cat -> bat (1 substitution), + ran (1 insertion), over 3 + 2 reference words
    # characters: c -> b (1), + " ran" (4 insertions), over 11 + 5 reference characters
    rates = metrics.error_rates(refs, hyps)
    assert rates["wer"] == pytest.approx(2 / 5)
    assert rates["cer"] == pytest.approx(5 / 16)
    # a corpus rate is not the mean of the utterances' rates (1/3 and 1/2 words)
    assert metrics.error_rates(refs[:1], hyps[:1]) == pytest.approx({"wer": 1 / 3, "cer": 1 / 11})
    assert metrics.error_rates(["hello world"], ["hello world"]) == {"wer": 0.0, "cer": 0.0}
    assert metrics.error_rates(["one two three"], [""]) == {"wer": 1.0, "cer": 1.0}
    assert metrics.error_rates([], []) == {"wer": 0.0, "cer": 0.0}


def test_reduce_sums_adds_each_key_over_steps_reading_one_replica():
    steps = [
        {"loss_sum": np.array([2.0, 2.0]), "steps": np.array(1.0)},
        {"loss_sum": np.array([3.5, 3.5]), "steps": np.array(1.0)},
    ]
    assert metrics.reduce_sums(steps) == {"loss_sum": 5.5, "steps": 2.0}


def test_the_metric_writer_writes_tensorboard_scalars_without_importing_torch(tmp_path):
    """A training process writes its TensorBoard scalars without importing torch (tensorboardX would,
    for seconds of CPU each time) and leaves it importable; the events hold the finite values."""
    import subprocess
    import sys
    import textwrap

    from tests.helpers import ROOT, repo_env

    code = textwrap.dedent(f"""
        import sys
        from ds2_jax import metrics
        w = metrics.MetricWriter({str(tmp_path)!r})
        w.write(1, {{"loss": 1.5}})
        w.write(2, {{"loss": float("nan"), "cer": 0.25}})
        w.close()
        assert "torch" not in sys.modules, "torch imported, or left hidden (None) for later imports"
        from tests.test_reporting import tensorboard_scalars
        print(sorted(tensorboard_scalars({str(tmp_path / "tensorboard")!r}).items()))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=repo_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[(('cer', 2), 0.25), (('loss', 1), 1.5)]"
