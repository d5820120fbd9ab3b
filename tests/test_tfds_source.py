"""TfdsSource: filters (and at their limits), buckets, SortaGrad, determinism, sharding, eval coverage, no TF."""

import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from configs import default
from ds2_jax import features, settings, text
from ds2_jax.pipeline import tfds_source
from ds2_jax.pipeline.batch import Sharding
from ds2_jax.pipeline.source import DataSettings, make_source
from tests import librispeech_testdata as td

BATCH = 4
# 48 training utterances from 0.3 s to 4.0 s, shuffled so record order means nothing.
TRAIN_SECONDS = list(np.random.default_rng(0).permutation(np.linspace(0.3, 4.0, 48)))
TEST_SECONDS = list(np.linspace(0.5, 3.5, 11))  # 11: the last eval batch is partial


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    manual = str(root / "manual")
    train = td.write_durations_corpus(manual, "train-clean-100", TRAIN_SECONDS)
    test = td.write_durations_corpus(manual, "test-clean", TEST_SECONDS, first_speaker=50)
    return {"manual": manual, "data_dir": str(root / "tfds"), "train": train, "test": test}


def open_source(config, sharding: Sharding) -> tfds_source.TfdsSource:
    """The source of a ConfigDict (checked into Settings as an entry point does), as make_source builds it."""
    return tfds_source.TfdsSource(DataSettings.of(settings.from_config_dict(config)), sharding)


def make_config(corpus, **dataset):
    c = default.get_config()
    c.dataset.name = "librispeech_local"
    c.dataset.manual_dir = corpus["manual"]
    c.dataset.data_dir = corpus["data_dir"]
    c.dataset.train_splits = "train-clean-100"
    c.dataset.eval_split = "test_clean"  # either spelling works
    c.dataset.min_duration_s = 1.0
    c.dataset.max_duration_s = 3.5
    c.dataset.num_buckets = 3
    c.dataset.feature_stats_utterances = 4
    c.dataset.update(dataset)
    return c


def in_range(utts, lo=1.0, hi=3.5):
    return [u for u in utts if lo * td.RATE <= u["num_samples"] <= hi * td.RATE]


def epoch_lengths(src, epoch):
    spe = src.steps_per_epoch
    return [src.train_batch(epoch * spe + k)["audio_lengths"] for k in range(spe)]


def test_duration_filter_and_buckets(corpus):
    src = open_source(make_config(corpus), Sharding(BATCH))
    kept = in_range(corpus["train"])
    assert src.steps_per_epoch == sum(n // BATCH for n in (len(b) for b in src.buckets.members))
    assert sum(len(b) for b in src.buckets.members) == len(kept) == 32
    shapes = src.shapes()
    assert len(shapes) == 3 and shapes == sorted(shapes)
    seen = set()
    for step in range(2 * src.steps_per_epoch):
        b = src.train_batch(step)
        samples, label_len = b["audio"].shape[1], b["labels"].shape[1]
        assert (samples, label_len) in shapes
        assert b["audio"].dtype == np.int16 and b["labels"].dtype == np.int32
        assert np.all(b["weights"] == 1)
        assert np.all((b["audio_lengths"] >= td.RATE) & (b["audio_lengths"] <= 3.5 * td.RATE))
        seen.update(b["audio_lengths"].tolist())
    assert seen <= {u["num_samples"] for u in kept}
    assert len(seen) >= len(kept) - 3 * (BATCH - 1)  # only per-bucket remainders unseen


def test_labels_and_audio_are_the_utterance(corpus):
    src = open_source(make_config(corpus), Sharding(BATCH))
    by_len = {u["num_samples"]: u for u in corpus["train"]}
    b = src.train_batch(5)
    for audio, n, labels, m in zip(b["audio"], b["audio_lengths"], b["labels"], b["label_lengths"]):
        u = by_len[int(n)]
        assert text.decode(labels[:m]) == u["text"]
        np.testing.assert_array_equal(audio[:n], td.tone(n, freq=200 + 10 * int(u["id"][-1])))
        assert not audio[n:].any() and not labels[m:].any()


def test_sortagrad_epoch_zero_ascending_after_the_longest_first(corpus):
    src = open_source(make_config(corpus, sortagrad=True), Sharding(BATCH))
    e0 = epoch_lengths(src, 0)
    assert max(e0[0]) == max(max(x) for x in e0)  # step 0: the longest batch
    rest = np.concatenate(e0[1:])
    assert np.all(np.diff(rest) >= 0)
    e1 = np.concatenate(epoch_lengths(src, 1))
    assert np.any(np.diff(e1) < 0)  # later epochs are shuffled
    assert not np.array_equal(e1, np.concatenate(epoch_lengths(src, 2)))


@pytest.mark.parametrize("sortagrad", [True, False])
def test_step_zero_is_the_longest_bucket(corpus, sortagrad):
    src = open_source(make_config(corpus, sortagrad=sortagrad), Sharding(BATCH))
    assert src.train_batch(0)["audio"].shape[1] == max(s for s, _ in src.shapes())


def test_train_batch_is_a_function_of_seed_and_step(corpus):
    a = open_source(make_config(corpus, sortagrad=False), Sharding(BATCH))
    b = open_source(make_config(corpus, sortagrad=False), Sharding(BATCH))
    steps = [0, 17, 3, 40, 17, 9]
    for step in steps:  # random access, any order: what a resumed run sees
        for k, v in a.train_batch(step).items():
            np.testing.assert_array_equal(v, b.train_batch(step)[k])
    c = make_config(corpus, sortagrad=False)
    c.seed = 1
    other = open_source(c, Sharding(BATCH))
    assert any(
        not np.array_equal(a.train_batch(s)["audio_lengths"], other.train_batch(s)["audio_lengths"])
        for s in range(1, 6)
    )


def test_process_shards_concatenate_to_the_global_batch(corpus):
    config = make_config(corpus, sortagrad=False)
    whole = open_source(config, Sharding(BATCH))
    parts = [open_source(config, Sharding(BATCH, i, 2)) for i in range(2)]
    for step in (0, 1, 7, 20):
        got = [p.train_batch(step) for p in parts]
        for k, v in whole.train_batch(step).items():
            np.testing.assert_array_equal(np.concatenate([g[k] for g in got]), v)
    for want, *got in zip(whole.eval_batches("test-clean"), *(p.eval_batches("test-clean") for p in parts)):
        for k, v in want.items():
            np.testing.assert_array_equal(np.concatenate([g[k] for g in got]), v)


def test_eval_covers_every_utterance_once(corpus):
    src = open_source(make_config(corpus), Sharding(BATCH))
    kept = {u["num_samples"]: u["text"] for u in in_range(corpus["test"])}
    seen, shapes = [], set()
    for b in src.eval_batches("test-clean"):
        assert b["audio"].shape[0] == BATCH
        shapes.add((b["audio"].shape[1], b["labels"].shape[1]))
        for w, n, labels, m in zip(b["weights"], b["audio_lengths"], b["labels"], b["label_lengths"]):
            if w == 1:
                seen.append(int(n))
                assert text.decode(labels[:m]) == kept[int(n)]
            else:
                assert w == 0 and n == 0 and m == 0
    assert sorted(seen) == sorted(kept)  # each exactly once
    assert shapes <= set(src.shapes())
    assert len(list(src.eval_batches("test-clean", max_utterances=5))) >= 1
    assert sum(b["weights"].sum() for b in src.eval_batches("test-clean", max_utterances=5)) == 5


def test_too_few_buckets_when_data_is_small(corpus):
    src = open_source(make_config(corpus, num_buckets=8), Sharding(16))
    assert len(src.shapes()) == 32 // 16


def test_feature_stats_are_cached(corpus):
    src = open_source(make_config(corpus), Sharding(BATCH))
    mean, std = src.feature_stats(features.spectrogram_stats)
    assert mean.shape == std.shape == (161,) and np.all(std > 0)
    files = [f for f in os.listdir(src.builder.data_dir) if f.startswith("feature_stats_")]
    assert len(files) == 1
    again = open_source(make_config(corpus), Sharding(BATCH)).feature_stats(features.spectrogram_stats)
    np.testing.assert_array_equal(again[0], mean)


def test_unknown_split_and_missing_manual_dir_are_clear(corpus, tmp_path):
    with pytest.raises(ValueError, match="dev_other"):
        open_source(make_config(corpus, train_splits="dev-other"), Sharding(BATCH))
    c = make_config(corpus, data_dir=str(tmp_path / "empty_tfds"), manual_dir=str(tmp_path / "none"))
    with pytest.raises(FileNotFoundError, match="dataset.manual_dir"):
        make_source(settings.from_config_dict(c), Sharding(BATCH))


def test_builds_and_reads_without_tensorflow(corpus, tmp_path):
    """A fresh build and batches in a process where `import tensorflow` fails."""
    script = textwrap.dedent(f"""
        import importlib.abc, importlib.machinery, sys

        class Refuse(importlib.abc.Loader):
            def create_module(self, spec):
                raise ImportError("tensorflow is blocked in this test")

            def exec_module(self, module):
                pass

        class NoTensorflow(importlib.abc.MetaPathFinder):
            # "Installed" as far as find_spec can tell, but every import of it fails, so
            # any code path that would use TensorFlow when present is exercised and fails.
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "tensorflow":
                    return importlib.machinery.ModuleSpec(name, Refuse())

        sys.meta_path.insert(0, NoTensorflow())
        from configs import default
        from ds2_jax.pipeline.batch import Sharding
        from ds2_jax import settings
        from ds2_jax.pipeline.source import make_source
        c = default.get_config()
        c.dataset.name = "librispeech_local"
        c.dataset.manual_dir = {corpus["manual"]!r}
        c.dataset.data_dir = {str(tmp_path / "tfds")!r}
        c.dataset.train_splits = "train-clean-100"
        src = make_source(settings.from_config_dict(c), Sharding(4))
        b = src.train_batch(0)
        n = sum(int(e["weights"].sum()) for e in src.eval_batches("test-clean"))
        assert "tensorflow" not in sys.modules
        print("OK", b["audio"].shape, n)
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK (4," in out.stdout and f" {len(TEST_SECONDS)}" in out.stdout


def test_official_librispeech_missing_is_a_clear_error(corpus, tmp_path):
    c = make_config(corpus, name="librispeech", data_dir=str(tmp_path / "no_tfds"))
    with pytest.raises(FileNotFoundError, match="librispeech_local"):
        open_source(c, Sharding(BATCH))


def test_official_layout_reads_without_tensorflow(corpus, tmp_path):
    """A prepared array_record dir named `librispeech` is read by files, not by tfds's builder."""
    import shutil

    built = open_source(make_config(corpus), Sharding(BATCH)).builder  # make sure it is built
    shutil.copytree(os.fspath(built.data_dir), tmp_path / "tfds" / "librispeech" / str(built.version))
    c = make_config(corpus, name="librispeech", data_dir=str(tmp_path / "tfds"))
    c.dataset.train_splits = "train_clean100"  # the official spelling resolves too
    src = open_source(c, Sharding(BATCH))
    assert src.train_batch(0)["audio"].shape[1] == max(s for s, _ in src.shapes())


def test_vectorized_min_frames_match_the_per_sequence_rule():
    """The index's CTC need, computed over all labels at once, is geometry.ctc_min_frames per row."""
    from ds2_jax import geometry
    from ds2_jax.pipeline.split_index import min_frames_of

    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, 4, size=n).astype(np.int32) for n in [0, 1, 5, 0, 7, 2, 3, 9]]
    seqs[2][:] = 2  # repeats inside one row
    seqs[5][:] = seqs[4][-1]  # a row starting with the previous row's last label: no repeat across rows
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in seqs])])
    got = min_frames_of(np.concatenate(seqs), offsets)
    np.testing.assert_array_equal(got, [geometry.ctc_min_frames(x) for x in seqs])


# ----------------------------------------------------------------------------- filters at their limits
# A TfdsSource over splits held in memory (no tfds build): each split is a list of
# (num_samples, transcript); the filters, buckets and eval batches are the real code.


@pytest.fixture
def memory_source(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from ds2_jax.pipeline import split_index

    def make(
        splits: dict[str, list[tuple[int, str]]], batch: int = BATCH, seed: int = 0, **dataset
    ) -> tfds_source.TfdsSource:
        names = {split_index.split_names(s)[0]: utts for s, utts in splits.items()}
        builder = SimpleNamespace(
            name="memory",
            data_dir=str(tmp_path),
            info=SimpleNamespace(splits=dict.fromkeys(names), features={"audio": None}),
        )
        monkeypatch.setattr(tfds_source, "_open_builder", lambda dataset, sharding: builder)

        def index(self, split):
            utts = names[split]
            labels = [text.encode(t) for _, t in utts]
            offsets = np.concatenate([[0], np.cumsum([len(x) for x in labels])])
            return split_index.SplitIndex.from_flat(
                [n for n, _ in utts], np.concatenate(labels), offsets, np.zeros(len(utts), bool)
            )

        monkeypatch.setattr(tfds_source.TfdsSource, "_index", index)
        monkeypatch.setattr(
            tfds_source.TfdsSource,
            "_source",
            lambda self, split: [{"audio": np.ones(n, np.int16)} for n, _ in names[split]],
        )
        c = default.get_config()
        c.dataset.name, c.dataset.manual_dir = "librispeech_local", "memory"
        c.dataset.train_splits, c.dataset.eval_split = list(splits)[0], list(splits)[-1]
        c.dataset.update(dataset)
        c.seed = seed
        return open_source(c, Sharding(batch))

    return make


def eval_rows(src: tfds_source.TfdsSource, split: str) -> list[tuple[int, int, tuple[int, int]]]:
    """(samples, labels, batch shape) of every real row the eval batches of `split` hold."""
    return [
        (int(n), int(m), (b["audio"].shape[1], b["labels"].shape[1]))
        for b in src.eval_batches(split)
        for w, n, m in zip(b["weights"], b["audio_lengths"], b["label_lengths"])
        if w == 1
    ]


FILLER = [(16_000 + 160 * i, "hello") for i in range(8)]  # a training set for the buckets


def test_duration_filter_keeps_utterances_exactly_at_each_limit(memory_source):
    """min/max_duration_s are inclusive, in whole samples: 2.01 s is 32160 samples (not the
    32159 that int(2.01 * 16000) gives)."""
    rate = td.RATE
    lo, hi = round(2.01 * rate), round(4.02 * rate)
    dev = [(n, "hello") for n in (lo - 1, lo, lo + 1, 3 * rate, hi - 1, hi, hi + 1)]
    src = memory_source({"train-clean-100": FILLER + dev, "dev-clean": dev}, min_duration_s=2.01, max_duration_s=4.02)
    assert sorted(n for n, _, _ in eval_rows(src, "dev-clean")) == [lo, lo + 1, 3 * rate, hi - 1, hi]


def _samples_for_frames(frames: int, num_conv_layers: int = 2) -> int:
    """The fewest samples whose conv stack emits `frames` output frames."""
    from ds2_jax import geometry

    n = 320
    while geometry.output_frames(geometry.num_frames(n), num_conv_layers) < frames:
        n += 160
    return n


@pytest.mark.parametrize("transcript", ["ab", "aa", "hello"])  # 'aa' and 'hello' need a blank between repeats
def test_ctc_filter_keeps_an_utterance_whose_frames_equal_what_its_labels_need(memory_source, transcript):
    """Frames == ctc_min_frames is feasible (one path): kept by the host filter, as the loss's
    mask (ctc.feasible) counts it; one frame fewer is dropped by both."""
    import jax.numpy as jnp

    from ds2_jax import ctc, geometry

    labels = text.encode(transcript)
    need = geometry.ctc_min_frames(labels)
    at = _samples_for_frames(need)
    below = _samples_for_frames(need - 1)
    assert geometry.output_frames(geometry.num_frames(at - 1), 2) == need - 1  # `at` is the limit itself
    dev = [(below, transcript), (at - 1, transcript), (at, transcript), (_samples_for_frames(need + 1), transcript)]
    src = memory_source({"train-clean-100": FILLER, "dev-clean": dev})
    kept = sorted(n for n, _, _ in eval_rows(src, "dev-clean"))
    assert kept == [at, _samples_for_frames(need + 1)]
    frames = jnp.array([need - 1, need, need + 1])
    rows = jnp.asarray(np.tile(labels, (3, 1)))
    np.testing.assert_array_equal(ctc.feasible(frames, rows, jnp.full(3, len(labels))), [False, True, True])


def test_eval_keeps_utterances_longer_than_the_largest_bucket_each_in_the_smallest_shape(memory_source):
    """Eval drops nothing: an utterance exactly the largest bucket's size uses that bucket; one
    sample longer, or with more labels than it holds, gets the one extra shape."""
    src = memory_source({"train-clean-100": FILLER, "dev-clean": []}, num_buckets=2)
    (s0, l0), (s1, l1) = src.shapes()
    dev = [(s0, "hello"), (s0 + 1, "hello"), (s1, "hello"), (s1 + 1, "hello"), (s0 - 160, "a" * 3 + "b" * 3 + "c" * l1)]
    src = memory_source({"train-clean-100": FILLER, "dev-clean": dev}, num_buckets=2)
    assert src.shapes() == [(s0, l0), (s1, l1)]
    rows = eval_rows(src, "dev-clean")
    assert sorted((n, m) for n, m, _ in rows) == sorted((n, len(t)) for n, t in dev)  # each once
    shapes = {(n, m): shape for n, m, shape in rows}
    assert shapes[(s0, 5)] == (s0, l0) and shapes[(s0 + 1, 5)] == shapes[(s1, 5)] == (s1, l1)
    extra = shapes[(s1 + 1, 5)]
    assert extra[0] > s1 and extra[0] % src.spectrogram.hop == 0 and extra[1] >= l1
    assert shapes[(s0 - 160, 6 + l1)] == extra and extra[1] >= 6 + l1  # too many labels for every bucket


def test_a_torn_split_index_cache_is_rebuilt_with_a_warning_and_written_whole(tmp_path, caplog):
    """issue 40: the cache was written to one fixed temporary name (two builders at once mixed their
    bytes) and a torn .npz was an unexplained zipfile traceback at every start."""
    from ds2_jax.pipeline import split_index

    built = []

    def build():
        built.append(1)
        return split_index.flat_index([(1600, "a b"), (3200, "c")], 2)

    path = tmp_path / "index.npz"
    path.write_bytes(b"PK\x03\x04 a torn zip")
    with caplog.at_level("WARNING"):
        first = split_index.cached(str(path), 2, build, "dev_clean")
    assert "the cached index of dev_clean" in caplog.text and "is torn" in caplog.text and built == [1]
    again = split_index.cached(str(path), 2, build, "dev_clean")  # read back, not rebuilt
    assert built == [1] and list(again.num_samples) == list(first.num_samples) == [1600, 3200]
    assert sorted(os.listdir(tmp_path)) == ["index.npz"]  # no temporary left beside it


# 24 utterances of distinct lengths (their ids in a batch): 3 buckets of 8, 2 batches of 4 each.
EPOCH_UTTS = [(16_000 + 320 * i, "hello") for i in range(24)]


def epoch_order(src: tfds_source.TfdsSource, epoch: int, steps=None) -> list[tuple[int, ...]]:
    """The utterances (by length) of each batch of `epoch`, its steps asked for in `steps` order."""
    spe = src.steps_per_epoch
    got = {k: tuple(src.train_batch(epoch * spe + k)["audio_lengths"].tolist()) for k in (steps or range(spe))}
    return [got[k] for k in range(spe)]


@pytest.mark.parametrize("sortagrad", [False, True])
def test_each_epoch_covers_every_utterance_once_in_a_new_order_a_function_of_seed_and_epoch(memory_source, sortagrad):
    """The order of an epoch, through the source a run reads: every utterance exactly once per
    epoch; epoch e+1 reorders epoch e, the batches drawn anew (not the same batches shuffled);
    and the order is a function of (seed, epoch) alone: a fresh source asked for the epochs out of
    order and each epoch's steps backwards (a resumed run) gives the same, another seed another."""
    src = memory_source({"train-clean-100": EPOCH_UTTS}, num_buckets=3, sortagrad=sortagrad)
    assert src.steps_per_epoch == 6
    epochs = [epoch_order(src, e) for e in range(4)]
    for e, order in enumerate(epochs):
        assert sorted(n for batch in order for n in batch) == [n for n, _ in EPOCH_UTTS], e
    for e in range(3):
        assert epochs[e + 1] != epochs[e], e
        assert {frozenset(b) for b in epochs[e + 1]} != {frozenset(b) for b in epochs[e]}, e
    fresh = memory_source({"train-clean-100": EPOCH_UTTS}, num_buckets=3, sortagrad=sortagrad)
    backwards = list(reversed(range(6)))
    assert [epoch_order(fresh, e, backwards) for e in (3, 1, 0, 2)] == [epochs[e] for e in (3, 1, 0, 2)]
    other = memory_source({"train-clean-100": EPOCH_UTTS}, num_buckets=3, sortagrad=sortagrad, seed=1)
    for e in range(1, 4):  # epoch 0 with SortaGrad ascends whatever the seed
        assert epoch_order(other, e) != epochs[e], e


def test_input_workers_open_the_prepared_data_without_checking_its_source_again(corpus, monkeypatch):
    """The main process checks the prepared data against dataset.manual_dir once (build.check_source
    walks every file); the StepBatch a grain worker unpickles opens it unchecked and gives the same
    batch. A StepBatch whose process opened no source still checks."""
    from ds2_jax.datasets import build
    from ds2_jax.pipeline import loader

    config = settings.from_config_dict(make_config(corpus))
    sharding = Sharding(4)
    source = make_source(config, sharding)  # the main process: builds or checks
    checks = []
    monkeypatch.setattr(build, "check_source", lambda builder, manual_dir: checks.append(manual_dir))
    worker_copy = pickle.loads(pickle.dumps(loader.StepBatch(DataSettings.of(config), sharding, source)))
    assert worker_copy.data.source_checked and worker_copy._source is None
    np.testing.assert_array_equal(worker_copy(3)["audio"], source.train_batch(3)["audio"])
    assert checks == []  # opened unchecked
    again = pickle.loads(pickle.dumps(worker_copy))  # a worker's copy stays checked
    assert again.data.source_checked
    unopened = pickle.loads(pickle.dumps(loader.StepBatch(DataSettings.of(config), sharding)))
    unopened(0)
    assert checks == [corpus["manual"]]  # no source opened before: it checks


@pytest.mark.parametrize("fault", ["none", "short", "long", "bad_text", "ctc_infeasible"])
def test_each_filter_drops_an_utterance_for_its_own_reason_alone(fault):
    """pipeline.filters.Filter over a split index of one good utterance and one with a single fault
    (shorter than min_duration_s, longer than max_duration_s, text outside the alphabet, more labels
    than its frames can emit): the faulty one alone is dropped, whichever the fault."""
    from ds2_jax.pipeline import filters, split_index

    config = settings.override(settings.Settings(), {"dataset.min_duration_s": 1.0, "dataset.max_duration_s": 3.0})
    good = (32_000, "hello world", False)
    other = {
        "none": (24_000, "fine", False),
        "short": (15_000, "fine", False),
        "long": (49_000, "fine", False),
        "bad_text": (24_000, "fine", True),
        "ctc_infeasible": (16_000, "abcdefghijklmnopqrstuvwxyz" * 2, False),
    }[fault]
    labels = [text.encode(t) for _, t, _ in (good, other)]
    index = split_index.SplitIndex.from_flat(
        [good[0], other[0]],
        np.concatenate(labels),
        np.cumsum([0] + [len(x) for x in labels]),
        np.array([good[2], other[2]]),
    )
    kept = filters.Filter(DataSettings.of(config)).kept(index, "memory/train")
    assert kept.tolist() == ([0, 1] if fault == "none" else [0])
