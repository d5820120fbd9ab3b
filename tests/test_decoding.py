"""The n-gram LM builder, beam search with an LM, and --mode=eval with both decoders.

The `trained` fixture (conftest.py, session scope) trains the demo model briefly on the
bundled corpus and builds a trigram LM of its training transcripts.
"""

import concurrent.futures
import dataclasses
import glob
import json
import os

import numpy as np
import pytest

from ds2_jax import decoding, settings, text
from ds2_jax.tools import build_lm
from tests import arpa
from tests.helpers import CORPUS, TRAIN_STEPS

# ----------------------------------------------------------------------------- LM builder

SENTENCES = ["the cat sat", "the cat ran", "a dog sat", "the dog sat on the mat", "a cat sat on a mat", "the cat"]


def _histories(model):
    return [
        (),
        ("<s>",),
        ("the",),
        ("<s>", "the"),
        ("the", "cat"),
        ("cat", "sat"),
        ("mat", "the"),
        ("zebra",),
        ("on", "zebra"),
    ]


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_arpa_header_matches_and_every_distribution_sums_to_one(tmp_path, order):
    probs, backoffs = build_lm.estimate(build_lm.sentences(SENTENCES), order)
    path = str(tmp_path / "lm.arpa")
    sizes = build_lm.write_arpa(probs, backoffs, path)
    model = arpa.ArpaModel(path)
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
    """The decoder's KenLM (flashlight-text's) scores our ARPA file as our reader does."""
    pytest.importorskip("flashlight.lib.text")
    from flashlight.lib.text.decoder.kenlm import KenLM
    from flashlight.lib.text.dictionary import Dictionary

    path = str(tmp_path / "lm.arpa")
    build_lm.write_arpa(*build_lm.estimate(build_lm.sentences(SENTENCES), 3), path)
    sentences = ["the cat sat", "a dog sat on the mat", "the zebra ran", "mat mat mat"]
    words = sorted({w for s in sentences for w in s.split()})
    ours, theirs = arpa.ArpaModel(path), KenLM(path, Dictionary(words))
    for s in sentences:
        state, total = theirs.start(False), 0.0
        for w in s.split():
            state, score = theirs.score(state, words.index(w))
            total += score
        total += theirs.finish(state)[1]
        assert total == pytest.approx(ours.sentence_log10_prob(s.split()), abs=1e-4), s


def test_build_lm_cli_reads_librispeech_transcripts(tmp_path):
    out = str(tmp_path / "lm.arpa")
    assert build_lm.main(["--manual_dir", CORPUS, "--splits", "train-clean-100", "--order", "2", "--out", out]) == 0
    model = arpa.ArpaModel(out)
    words = set(model.vocab) - {"<s>", "</s>", "<unk>"}
    assert words and all(w == w.lower() and not text.unknown_chars(w) for w in words)
    # transcripts from a .trans.txt are read without their utterance ids
    assert not any(w[0].isdigit() for w in words)
    lines = [
        line.split(maxsplit=1)[1]
        for root, _, files in os.walk(os.path.join(CORPUS, "LibriSpeech", "train-clean-100"))
        for f in files
        if f.endswith(".trans.txt")
        for line in open(os.path.join(root, f))
    ]
    assert words == {w for line in lines for w in text.normalize(line).split()}
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


def _path(spelled: str, alphabet: text.Alphabet = text.LIBRISPEECH) -> np.ndarray:
    """A hand-made argmax path: '_' is the blank, any other character its label."""
    return np.array([text.BLANK if c == "_" else alphabet.symbols.index(c) + 1 for c in spelled], np.int32)


@pytest.mark.parametrize(
    "spelled, length, expected",
    [
        ("__hh_e_ll_lo__  _wo_rld_", None, [("hello", 2, 12), ("world", 17, 23)]),  # a blank splits the double l
        ("aa a", None, [("a", 0, 2), ("a", 3, 4)]),  # a repeat's frames belong to its character
        (" _ab  c", 4, [("ab", 2, 4)]),  # frames past the length are not read
        ("a_a", None, [("aa", 0, 3)]),
        ("___", None, []),
    ],
)
def test_word_timings_span_each_words_frames_and_spell_greedys_words(spelled, length, expected):
    path = _path(spelled)
    n = len(path) if length is None else length
    words = decoding.word_timings(path, n, text.LIBRISPEECH, frame_seconds=0.03)
    assert [(w.word, round(w.start / 0.03, 6), round(w.end / 0.03, 6)) for w in words] == expected
    assert " ".join(w.word for w in words) == decoding.greedy_texts(path[None], np.array([n]))[0]


def test_beam_without_lm_equals_greedy_on_a_confident_path():
    pytest.importorskip("flashlight.lib.text")
    lp = _log_probs("the cat sat")
    beam = decoding.BeamSearchDecoder(settings.Decoding(beam_width=8))
    assert beam.decode(lp) == "the cat sat"
    assert beam.decode_batch(np.stack([lp, lp]), np.array([len(lp), 6])) == ["the cat sat", "the"]


def test_lm_corrects_an_acoustically_ambiguous_word(tmp_path):
    pytest.importorskip("flashlight.lib.text")
    path = str(tmp_path / "lm.arpa")
    build_lm.write_arpa(*build_lm.estimate(build_lm.sentences(SENTENCES), 3), path)
    lp = _log_probs("the cat sat", confusion={4: ("k", 0.6)})  # the model hears 'kat'
    greedy = decoding.greedy_texts(lp.argmax(-1)[None], np.array([len(lp)]))[0]
    assert greedy == "the kat sat"
    lm_beam = decoding.BeamSearchDecoder(settings.Decoding(beam_width=16, lm_path=path, alpha=1.0, beta=1.0))
    assert lm_beam.decode(lp) == "the cat sat"
    assert decoding.BeamSearchDecoder(settings.Decoding(beam_width=16)).decode(lp) == "the kat sat"
    lm_beam.set_weights(alpha=2.0, beta=0.5)
    assert (lm_beam.alpha, lm_beam.beta) == (2.0, 0.5) and lm_beam.decode(lp) == "the cat sat"


def test_alpha_weighs_the_natural_log_lm_score(tmp_path):
    """score = log P_ctc + alpha * ln P_lm + beta * words: with alpha set between the
    values where 'the cat sat' (LM) and 'the kat sat' (acoustics) win under ln and under
    log10, only the documented ln scale picks 'cat'."""
    import math

    pytest.importorskip("flashlight.lib.text")
    path = str(tmp_path / "lm.arpa")
    build_lm.write_arpa(*build_lm.estimate(build_lm.sentences(SENTENCES), 3), path)
    lexicon = tmp_path / "words.txt"
    lexicon.write_text("the\ncat\nkat\nsat\n")  # 'kat' is out of the LM: scored as <unk>
    q = 0.9  # the model hears 'kat': acoustic margin ln(0.9 / 0.1) for it
    lm = arpa.ArpaModel(path)
    lm_margin = lm.sentence_log10_prob("the cat sat".split()) - lm.sentence_log10_prob("the kat sat".split())
    alpha = math.log(q / (1 - q)) / (lm_margin * math.sqrt(math.log(10)))  # ln scale: LM wins by 1.5x
    lp = _log_probs("the cat sat", confusion={4: ("k", q)})
    cfg = settings.Decoding(beam_width=16, lm_path=path, lexicon_path=str(lexicon), alpha=alpha, beta=0.0)
    assert decoding.BeamSearchDecoder(cfg).decode(lp) == "the cat sat"
    weaker = decoding.BeamSearchDecoder(dataclasses.replace(cfg, alpha=alpha / math.log(10)))
    assert weaker.decode(lp) == "the kat sat"  # the same alpha on the log10 score: acoustics win


def test_lexicon_file_limits_the_words_of_the_lm_search(tmp_path):
    pytest.importorskip("flashlight.lib.text")
    path = str(tmp_path / "lm.arpa")
    build_lm.write_arpa(*build_lm.estimate(build_lm.sentences(SENTENCES), 3), path)
    lexicon = tmp_path / "words.txt"
    lexicon.write_text("the\nkat\nsat\n")  # 'kat' is not in the LM: KenLM scores it as <unk>
    lp = _log_probs("the cat sat", confusion={4: ("k", 0.4)})  # the model leans to 'cat'
    cfg = dict(beam_width=16, lm_path=path, alpha=1.0, beta=1.0)
    assert decoding.BeamSearchDecoder(settings.Decoding(**cfg)).decode(lp) == "the cat sat"
    only = decoding.BeamSearchDecoder(settings.Decoding(**cfg, lexicon_path=str(lexicon)))
    assert only.words == ["the", "kat", "sat"] and only.decode(lp) == "the kat sat"


def test_a_binary_lm_needs_a_lexicon_and_bad_words_are_named(tmp_path):
    pytest.importorskip("flashlight.lib.text")
    binary = tmp_path / "lm.bin"
    binary.write_bytes(b"mmap lm http://kheafield.com/code format version 5\0" + bytes(64))
    with pytest.raises(ValueError, match="decoding.lexicon_path"):
        decoding.BeamSearchDecoder(settings.Decoding(beam_width=4, lm_path=str(binary)))
    lexicon = tmp_path / "words.txt"
    lexicon.write_text("cat\nCaf\u00e9\n")
    with pytest.raises(ValueError, match="words.txt: words outside the model.s alphabet"):
        decoding.lexicon_words(str(lexicon))


def test_a_split_decodes_on_a_process_pool_as_in_one_process(monkeypatch, tmp_path):
    pytest.importorskip("flashlight.lib.text")
    path = str(tmp_path / "lm.arpa")
    build_lm.write_arpa(*build_lm.estimate(build_lm.sentences(SENTENCES), 3), path)
    utterances = [_log_probs(s, confusion={1: ("k", 0.3)}) for s in SENTENCES * 2]
    beam = decoding.BeamSearchDecoder(settings.Decoding(beam_width=8, lm_path=path, alpha=1.0, beta=0.5))
    serial = [beam.decode(lp) for lp in utterances]
    assert serial == SENTENCES * 2
    pools = []
    real = concurrent.futures.ProcessPoolExecutor
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", lambda n, **kw: pools.append(n) or real(n, **kw))
    assert beam.decode_all(utterances, workers=2) == serial and pools == []  # too few frames for a pool
    monkeypatch.setattr(decoding, "MIN_FRAMES_PER_WORKER", 1)
    assert beam.decode_all(utterances, workers=2) == serial and pools == [2]


def _ambiguous(tmp_path):
    """(decoder config, log-probs, lexicon) where alpha and beta each change the best text:
    the model hears 'kat' (0.9) for 'cat', and the space after 'the' only at 0.6 (else blank)."""
    path = str(tmp_path / "lm.arpa")
    build_lm.write_arpa(*build_lm.estimate(build_lm.sentences(SENTENCES), 3), path)
    lexicon = tmp_path / "words.txt"
    lexicon.write_text("the\ncat\nkat\nsat\nthecat\n")  # 'kat' and 'thecat' are out of the LM
    lp = _log_probs("the cat sat", confusion={4: ("k", 0.9)})
    space = np.full(text.VOCAB_SIZE, 1e-4)
    space[text.encode(" ")[0]], space[text.BLANK] = 0.6, 0.4
    lp[6] = np.log(space / space.sum())  # frame 6: the space after 'the'
    cfg = settings.Decoding(beam_width=16, lm_path=path, lexicon_path=str(lexicon), alpha=0.0, beta=0.0)
    return cfg, lp


# (alpha, beta) -> best text: acoustics alone; the LM's 'cat'; a word penalty merging 'the cat'
BY_WEIGHTS = {(0.0, 0.0): "the kat sat", (3.0, 0.0): "the cat sat", (0.0, -5.0): "thecat sat"}


def test_new_alpha_and_beta_change_what_the_decoder_outputs(tmp_path, monkeypatch):
    """set_weights rebuilds the search with both weights (tune_lm's grid relies on it), for
    this process and for decode_all's workers; a decoder built with them decodes alike."""
    pytest.importorskip("flashlight.lib.text")
    cfg, lp = _ambiguous(tmp_path)
    beam = decoding.BeamSearchDecoder(cfg)
    for (alpha, beta), want in [*BY_WEIGHTS.items(), ((0.0, 0.0), BY_WEIGHTS[0.0, 0.0])]:  # and back
        beam.set_weights(alpha, beta)
        assert beam.describe()["alpha"] == alpha and beam.describe()["beta"] == beta
        assert beam.decode(lp) == want, (alpha, beta)
        fresh = decoding.BeamSearchDecoder(dataclasses.replace(cfg, alpha=alpha, beta=beta))
        assert fresh.decode(lp) == want, (alpha, beta)
    monkeypatch.setattr(decoding, "MIN_FRAMES_PER_WORKER", 1)
    beam.set_weights(0.0, -5.0)
    assert beam.decode_all([lp, lp], workers=2) == [BY_WEIGHTS[0.0, -5.0]] * 2  # the workers got the new weights


def test_tune_lm_grid_scores_each_setting_with_its_own_weights(tmp_path):
    """tools.tune_lm.grid_search on a split of one ambiguous utterance: each (alpha, beta) row
    is that setting's decoding (not the first setting's, repeated)."""
    pytest.importorskip("flashlight.lib.text")
    from ds2_jax import evaluation
    from ds2_jax.tools import tune_lm

    cfg, lp = _ambiguous(tmp_path)
    outputs = evaluation.SplitOutputs(references=["the cat sat"], greedy=["the kat sat"], log_probs=[lp], loss=0.0)
    rows = tune_lm.grid_search(outputs, decoding.BeamSearchDecoder(cfg), [0.0, 3.0], [0.0, -5.0])
    assert [(r["alpha"], r["beta"]) for r in rows] == [(0.0, 0.0), (0.0, -5.0), (3.0, 0.0), (3.0, -5.0)]
    wer = {(r["alpha"], r["beta"]): r["wer"] for r in rows}
    assert wer[0.0, 0.0] == pytest.approx(1 / 3) and wer[0.0, -5.0] == pytest.approx(2 / 3)
    assert wer[3.0, 0.0] == 0.0
    assert min(rows, key=lambda r: (r["wer"], r["cer"]))["alpha"] == 3.0


def test_token_pruning_keeps_each_frames_argmax_and_every_token_at_the_threshold():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((40, text.VOCAB_SIZE)) * 3
    lp = (logits - np.log(np.exp(logits).sum(-1, keepdims=True))).astype(np.float32)
    threshold = np.float32(-1.0)
    lp[0, :] = np.float32(-10.0)
    lp[0, 3], lp[0, 5] = np.float32(-0.1), threshold  # exactly at the threshold, not the best: kept
    lp[1, :] = np.float32(-2.0) - np.arange(text.VOCAB_SIZE, dtype=np.float32)  # every token below it
    pruned = decoding.prune_tokens(lp, float(threshold))
    best = lp.argmax(-1)
    np.testing.assert_array_equal(pruned[np.arange(len(lp)), best], lp[np.arange(len(lp)), best])
    keep = lp >= threshold
    keep[np.arange(len(lp)), best] = True
    np.testing.assert_array_equal(pruned[keep], lp[keep])
    assert np.all(pruned[~keep] == decoding.PRUNED) and (~keep).any()
    assert pruned[0, 5] == threshold and pruned[1, 0] == lp[1, 0]


def test_beam_search_keeps_each_frames_best_token_however_unsure():
    """Frames whose best token is below token_min_logp still decode to the best path."""
    pytest.importorskip("flashlight.lib.text")
    frames = []
    for c in "the cat":  # each character at 0.3, the rest spread thinly: every token below -1
        p = np.full(text.VOCAB_SIZE, 0.7 / (text.VOCAB_SIZE - 1))
        p[text.encode(c)[0]] = 0.3
        frames += [p, np.eye(text.VOCAB_SIZE)[text.BLANK] * 0.3 + (1 - np.eye(text.VOCAB_SIZE)[text.BLANK]) * 0.7 / 28]
    lp = np.log(np.stack(frames)).astype(np.float32)
    assert lp.max() < -1.0
    greedy = decoding.greedy_texts(lp.argmax(-1)[None], np.array([len(lp)]))[0]
    assert greedy == "the cat"
    beam = decoding.BeamSearchDecoder(settings.Decoding(beam_width=8, token_min_logp=-1.0))
    assert beam.decode(lp) == greedy


def test_decoder_config_errors_name_the_setting(tmp_path):
    with pytest.raises(ValueError, match="decoding.beam_width"):
        settings.Decoding(lm_path="lm.arpa")
    with pytest.raises(ValueError, match="decoding.beam_width"):
        settings.Decoding(beam_width=-1)
    with pytest.raises(ValueError, match="decoding.alpha"):
        settings.Decoding(beam_width=4, alpha=-1.0)
    from configs import default

    assert settings.from_config_dict(default.get_config()).decoding == settings.Decoding()
    with pytest.raises(ValueError, match="unknown config key 'decoding.beam_widht'"):
        settings.override(settings.Settings(), {"decoding.beam_widht": 4})
    pytest.importorskip("flashlight.lib.text")
    with pytest.raises(FileNotFoundError, match="missing.arpa"):
        decoding.BeamSearchDecoder(settings.Decoding(beam_width=4, lm_path=str(tmp_path / "missing.arpa")))


# ----------------------------------------------------------------------------- trained model


@pytest.mark.slow
@pytest.mark.xdist_group("trained")  # one worker trains it (conftest.py)
def test_eval_beam_with_lm_is_no_worse_than_greedy_on_each_split(trained):
    pytest.importorskip("flashlight.lib.text")
    from ds2_jax import evaluation

    # all 8 devices, the same global batch
    config = settings.override(
        trained.config,
        {"num_devices": 0, "per_device_batch_size": 2, "decoding.beam_width": 32, "decoding.lm_path": trained.lm},
    )
    results = evaluation.evaluate_splits(config, trained.workdir, split="test-clean, dev-clean")
    assert list(results) == ["test-clean", "dev-clean"]
    for split, result in results.items():
        (path,) = glob.glob(os.path.join(trained.workdir, f"eval-{split}-{TRAIN_STEPS}-beam32-lm-lm-a0.5-b1-*.json"))
        saved = json.load(open(path))
        transcripts = glob.glob(os.path.join(CORPUS, "LibriSpeech", split, "*", "*", "*.trans.txt"))
        count = sum(1 for path in transcripts for line in open(path) if line.strip())  # every one of them
        assert saved["split"] == split and saved["utterances"] == result["utterances"] == count
        assert saved["beam"]["beam_width"] == 32 and saved["beam"]["lm"] == trained.lm
        assert len(saved["worst"]) == len(saved["beam"]["worst"]) == min(10, saved["utterances"])
        assert saved["cer"] < 0.25, saved["worst"][:3]  # the model learned something
        assert saved["beam"]["cer"] <= saved["cer"] and saved["beam"]["wer"] <= saved["wer"]
    # each split alone, not pooled: test-clean has 3 held-out speakers x 13 utterances
    assert results["test-clean"]["utterances"] == 39


@pytest.mark.slow
@pytest.mark.xdist_group("trained")  # one worker trains it (conftest.py)
def test_tune_lm_grid_picks_a_weight_that_beats_no_lm(trained):
    pytest.importorskip("flashlight.lib.text")
    from ds2_jax.tools import tune_lm

    result = tune_lm.tune(trained.config, trained.workdir, trained.lm, "dev-clean", [0, 1.0], [0, 1.0], beam_width=16)
    assert [(r["alpha"], r["beta"]) for r in result["grid"]] == [(0, 0), (0, 1.0), (1.0, 0), (1.0, 1.0)]
    no_lm = result["grid"][0]
    assert result["best"]["alpha"] > 0 and result["best"]["wer"] < no_lm["wer"]
    assert len(glob.glob(os.path.join(trained.workdir, f"tune_lm-dev-clean-{TRAIN_STEPS}-beam*-lm-lm-*.json"))) == 1
    assert result["best"]["wer"] < result["greedy"]["wer"] and result["utterances"] == 26
