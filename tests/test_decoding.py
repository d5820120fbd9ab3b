"""The n-gram LM builder, beam search with an LM, and --mode=eval with both decoders.

The `trained` fixture (session scope, shared with test_transcribe.py) trains the demo
model briefly on the bundled corpus and builds a trigram LM of its training transcripts.
"""

import dataclasses
import json
import os

import numpy as np
import pytest

from ds2_jax import decoding, text
from ds2_jax.tools import build_lm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "data", "tiny_librispeech")
TRAIN_STEPS = 160


@dataclasses.dataclass
class Trained:
    config: object
    workdir: str
    lm: str


_TRAINED: dict[str, Trained] = {}


def trained_model(tmp_path_factory) -> Trained:
    """Trains once per session; test_transcribe.py's fixture calls this too (a fixture
    imported into another module would be a second fixture, trained a second time)."""
    if "demo" in _TRAINED:
        return _TRAINED["demo"]
    from configs import demo
    from ds2_jax import train

    root = tmp_path_factory.mktemp("demo")
    config = demo.get_config()
    config.dataset.manual_dir = CORPUS
    config.dataset.data_dir = str(root / "tfds")
    config.num_devices = 1  # the demo's run on one CPU device: 8 fake devices only add overhead
    config.num_train_steps = TRAIN_STEPS
    config.optimizer.decay_steps = TRAIN_STEPS
    config.eval_every_steps = 0
    config.checkpoint_every_steps = TRAIN_STEPS
    workdir = str(root / "w")
    train.train_and_evaluate(config, workdir)
    lm = str(root / "lm.arpa")
    assert build_lm.main(["--manual_dir", CORPUS, "--splits", "train-clean-100", "--order", "3", "--out", lm]) == 0
    _TRAINED["demo"] = Trained(config, workdir, lm)
    return _TRAINED["demo"]


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Trained:
    return trained_model(tmp_path_factory)


# ----------------------------------------------------------------------------- LM builder

SENTENCES = ["the cat sat", "the cat ran", "a dog sat", "the dog sat on the mat", "a cat sat on a mat", "the cat"]


def _histories(model):
    return [(), ("<s>",), ("the",), ("<s>", "the"), ("the", "cat"), ("cat", "sat"), ("mat", "the"), ("zebra",), ("on", "zebra")]


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_arpa_header_matches_and_every_distribution_sums_to_one(tmp_path, order):
    probs, backoffs = build_lm.estimate(build_lm.sentences(SENTENCES), order)
    path = str(tmp_path / "lm.arpa")
    sizes = build_lm.write_arpa(probs, backoffs, path)
    model = build_lm.ArpaModel(path)
    assert model.header == sizes == model.counts()
    assert model.order == order and {"<s>", "</s>", "<unk>", "cat", "mat"} <= set(model.vocab)
    predictable = [w for w in model.vocab if w != "<s>"]
    for history in _histories(model):
        total = sum(10 ** model.log10_prob(w, history) for w in predictable)
        assert total == pytest.approx(1.0, abs=1e-5), history


def test_kneser_ney_prefers_seen_continuations_and_counts_contexts():
    probs, _ = build_lm.estimate(build_lm.sentences(SENTENCES), 3)
    assert probs[2][("<s>", "the", "cat")] > probs[2][("<s>", "the", "dog")]  # 3 vs 1 occurrences
    # 'sat' follows three different words, 'ran' one: continuation counts rank them.
    assert probs[0][("sat",)] > probs[0][("ran",)]
    assert probs[0][("<unk>",)] > 0


def test_discounts_from_count_of_counts_or_lmplz_fallback():
    counts = {("a",): 1, ("b",): 1, ("c",): 1, ("d",): 2, ("e",): 2, ("f",): 3, ("g",): 4}
    # n1..n4 = 3, 2, 1, 1: Y = 3/7, D1 = 1 - 2Y n2/n1, D2 = 2 - 3Y n3/n2, D3+ = 3 - 4Y n4/n3
    assert build_lm.discounts(counts, 1) == pytest.approx((3 / 7, 2 - 9 / 14, 3 - 12 / 7))
    assert build_lm.discounts({("a",): 1}, 1) == build_lm.FALLBACK_DISCOUNTS  # no n2..n4


def test_kenlm_reads_the_arpa_with_the_same_probabilities(tmp_path):
    kenlm = pytest.importorskip("kenlm")
    path = str(tmp_path / "lm.arpa")
    build_lm.write_arpa(*build_lm.estimate(build_lm.sentences(SENTENCES), 3), path)
    ours, theirs = build_lm.ArpaModel(path), kenlm.Model(path)
    for s in ["the cat sat", "a dog sat on the mat", "the zebra ran", "mat mat mat"]:
        assert theirs.score(s, bos=True, eos=True) == pytest.approx(ours.sentence_log10_prob(s.split()), abs=1e-4)


def test_build_lm_cli_reads_librispeech_transcripts(tmp_path):
    out = str(tmp_path / "lm.arpa")
    assert build_lm.main(["--manual_dir", CORPUS, "--splits", "train-clean-100", "--order", "2", "--out", out]) == 0
    model = build_lm.ArpaModel(out)
    words = set(model.vocab) - {"<s>", "</s>", "<unk>"}
    assert words and all(w == w.lower() and not text.unknown_chars(w) for w in words)
    # transcripts from a .trans.txt are read without their utterance ids
    assert not any(w[0].isdigit() for w in words)
    lines = [l.split(maxsplit=1)[1] for root, _, files in os.walk(os.path.join(CORPUS, "LibriSpeech", "train-clean-100"))
             for f in files if f.endswith(".trans.txt") for l in open(os.path.join(root, f))]
    assert words == {w for l in lines for w in text.normalize(l).split()}
    with pytest.raises(FileNotFoundError, match="train-other-500"):
        build_lm.main(["--manual_dir", CORPUS, "--splits", "train-other-500", "--out", out])


# ----------------------------------------------------------------------------- decoders


def _log_probs(chars: str, confusion: dict[int, tuple[str, float]] | None = None) -> np.ndarray:
    """<float32>[T, 29]: each character for one frame then a blank frame; confusion[i] =
    (other char, its probability) at character i."""
    frames = []
    for i, c in enumerate(chars):
        p = np.full(text.VOCAB_SIZE, 1e-4)
        p[text.encode(c)[0]] = 1.0
        if confusion and i in confusion:
            other, q = confusion[i]
            p[text.encode(c)[0]], p[text.encode(other)[0]] = 1 - q, q
        frames.append(p / p.sum())
        blank = np.full(text.VOCAB_SIZE, 1e-4)
        blank[text.BLANK] = 1.0
        frames.append(blank / blank.sum())
    return np.log(np.stack(frames)).astype(np.float32)


def test_greedy_texts_collapse_repeats_and_respect_lengths():
    ids = np.array([[5, 5, 0, 5, 2, 3, 3, 7], [3, 0, 3, 3, 0, 0, 0, 0]])
    assert decoding.greedy_texts(ids, np.array([6, 3])) == ["cc a", "aa"]


def test_beam_without_lm_equals_greedy_on_a_confident_path():
    pytest.importorskip("pyctcdecode")
    lp = _log_probs("the cat sat")
    beam = decoding.BeamSearchDecoder(decoding.DecoderConfig(beam_width=8))
    assert beam.decode(lp) == "the cat sat"
    assert beam.decode_batch(np.stack([lp, lp]), np.array([len(lp), 6])) == ["the cat sat", "the"]


def test_lm_corrects_an_acoustically_ambiguous_word(tmp_path):
    pytest.importorskip("pyctcdecode")
    pytest.importorskip("kenlm")
    path = str(tmp_path / "lm.arpa")
    build_lm.write_arpa(*build_lm.estimate(build_lm.sentences(SENTENCES), 3), path)
    lp = _log_probs("the cat sat", confusion={4: ("k", 0.6)})  # the model hears 'kat'
    greedy = decoding.greedy_texts(lp.argmax(-1)[None], np.array([len(lp)]))[0]
    assert greedy == "the kat sat"
    lm_beam = decoding.BeamSearchDecoder(decoding.DecoderConfig(beam_width=16, lm_path=path, alpha=1.0, beta=1.0))
    assert lm_beam.decode(lp) == "the cat sat"
    assert decoding.BeamSearchDecoder(decoding.DecoderConfig(beam_width=16)).decode(lp) == "the kat sat"
    lm_beam.set_weights(alpha=2.0, beta=0.5)
    assert (lm_beam.alpha, lm_beam.beta) == (2.0, 0.5) and lm_beam.decode(lp) == "the cat sat"


def test_decoder_config_errors_name_the_setting(tmp_path):
    with pytest.raises(ValueError, match="decoding.beam_width"):
        decoding.DecoderConfig(lm_path="lm.arpa")
    with pytest.raises(ValueError, match="decoding.beam_width"):
        decoding.DecoderConfig(beam_width=-1)
    with pytest.raises(ValueError, match="decoding.alpha"):
        decoding.DecoderConfig(beam_width=4, alpha=-1.0)
    assert decoding.DecoderConfig.from_config(None) == decoding.DecoderConfig()
    pytest.importorskip("pyctcdecode")
    with pytest.raises(FileNotFoundError, match="missing.arpa"):
        decoding.BeamSearchDecoder(decoding.DecoderConfig(beam_width=4, lm_path=str(tmp_path / "missing.arpa")))


# ----------------------------------------------------------------------------- trained model


@pytest.mark.slow
def test_eval_beam_with_lm_is_no_worse_than_greedy_on_each_split(trained):
    pytest.importorskip("pyctcdecode")
    from ds2_jax import evaluation

    config = trained.config.copy_and_resolve_references()
    config.num_devices, config.per_device_batch_size = 0, 2  # all 8 devices, same global batch
    config.decoding.beam_width = 32
    config.decoding.lm_path = trained.lm
    results = evaluation.evaluate_splits(config, trained.workdir, split="test-clean, dev-clean")
    assert list(results) == ["test-clean", "dev-clean"]
    for split, result in results.items():
        saved = json.load(open(os.path.join(trained.workdir, f"eval-{split}-{TRAIN_STEPS}-beam32-lm.json")))
        assert saved["split"] == split and saved["utterances"] == result["utterances"] > 0
        assert saved["beam"]["beam_width"] == 32 and saved["beam"]["lm"] == trained.lm
        assert len(saved["worst"]) == len(saved["beam"]["worst"]) == min(10, saved["utterances"])
        assert saved["cer"] < 0.25, saved["worst"][:3]  # the model learned something
        assert saved["beam"]["cer"] <= saved["cer"] and saved["beam"]["wer"] <= saved["wer"]
    # each split alone, not pooled: test-clean has 3 held-out speakers x 13 utterances
    assert results["test-clean"]["utterances"] == 39


@pytest.mark.slow
def test_tune_lm_grid_picks_a_weight_that_beats_no_lm(trained):
    pytest.importorskip("pyctcdecode")
    from ds2_jax.tools import tune_lm

    result = tune_lm.tune(trained.config, trained.workdir, trained.lm, "dev-clean", [0, 1.0], [0, 1.0], beam_width=16)
    assert [(r["alpha"], r["beta"]) for r in result["grid"]] == [(0, 0), (0, 1.0), (1.0, 0), (1.0, 1.0)]
    no_lm = result["grid"][0]
    assert result["best"]["alpha"] > 0 and result["best"]["wer"] < no_lm["wer"]
    assert os.path.exists(os.path.join(trained.workdir, f"tune_lm-dev-clean-{TRAIN_STEPS}.json"))
    assert result["best"]["wer"] < result["greedy"]["wer"] and result["utterances"] == 26
