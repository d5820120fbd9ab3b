"""CTC decoding on the host: greedy (best path) and beam search with a KenLM n-gram LM.

Greedy decoding needs only the argmax ids the eval step computes on the device. Beam
search needs the per-frame log-probabilities and runs flashlight-text's CTC beam search
(C++, KenLM built in; the decoder under torchaudio's ctc_decoder) with shallow fusion:
a beam's score is

    log P_ctc(chars) + alpha * ln P_lm(words) + beta * len(words)

Without an LM the search is lexicon-free (any character string). With an LM (an ARPA or
KenLM binary file, see ds2_jax.tools.build_lm) it is a lexicon search: words are spelled
from a lexicon (decoding.lexicon_path, by default the ARPA file's unigrams), so every
output word is one the LM knows. flashlight-text comes with `pip install -e '.[lm]'` and
is imported only when a beam decoder is built.

A whole split decodes on a process pool sized from os.cpu_count() (decode_all): the
search holds the GIL, so threads would not help.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import math
import multiprocessing
import os

import numpy as np

from ds2_jax import settings, text

log = logging.getLogger("ds2_jax")

INSTALL_HINT = "pip install -e '.[lm]'"
UNK = "<unk>"
PRUNED = np.float32(-1e9)  # a log-prob that no beam survives
# Frames of log-probs per worker below which a split decodes in this process: starting a
# worker (numpy, flashlight, the LM) costs more than decoding a few thousand frames.
MIN_FRAMES_PER_WORKER = 20_000


def greedy_texts(ids: np.ndarray, lengths: np.ndarray, alphabet: text.Alphabet = text.LIBRISPEECH) -> list[str]:
    """<int32>[B, T] argmax paths and <int32>[B] valid frames -> B texts in `alphabet`, their words
    joined by one space as beam search's are (and references are): a stray space must not count
    as an error of greedy alone."""
    return [
        " ".join(alphabet.decode(text.collapse(path, n)).split())
        for path, n in zip(np.asarray(ids), np.asarray(lengths))
    ]


@dataclasses.dataclass(frozen=True)
class TimedWord:
    """A word of the greedy path and the span of its frames, in seconds from the file's start."""

    word: str
    start: float  # the first frame that emits one of its characters
    end: float  # the end of the last such frame


def word_timings(
    path: np.ndarray, length: int, alphabet: text.Alphabet, frame_seconds: float, delay: float = 0.0
) -> list[TimedWord]:
    """The words of one argmax path (greedy_texts' words, in order) with their times: a word
    spans the frames from its first character's first emission to its last character's last
    (repeats included); output frame t covers [t, t + 1) * frame_seconds (hop x the first conv's
    time stride: ds2_jax.infer.engine.Engine.frame_seconds), moved `delay` seconds earlier (the
    model's emission delay, ds2_jax.timing), never before 0."""
    words: list[TimedWord] = []
    chars: list[str] = []
    first = last = 0
    previous = text.BLANK
    for t, label in enumerate(np.asarray(path)[: int(length)].tolist()):
        char = None if label == text.BLANK else alphabet.symbols[label - 1]
        if char is not None and char != " ":
            if label != previous:
                if not chars:
                    first = t
                chars.append(char)
            last = t
        elif char == " " and chars:
            words.append(_timed("".join(chars), first, last, frame_seconds, delay))
            chars = []
        previous = label
    if chars:
        words.append(_timed("".join(chars), first, last, frame_seconds, delay))
    return words


def _timed(word: str, first: int, last: int, frame_seconds: float, delay: float) -> TimedWord:
    return TimedWord(word, max(first * frame_seconds - delay, 0.0), max((last + 1) * frame_seconds - delay, 0.0))


def silence_id(alphabet: text.Alphabet) -> int:
    """The word boundary token of flashlight's search: the space's label (the blank without one)."""
    return alphabet.symbols.index(" ") + 1 if " " in alphabet.symbols else text.BLANK


def _flashlight():
    try:
        from flashlight.lib.text import decoder, dictionary
    except ImportError as e:
        raise ImportError(f"beam search needs flashlight-text: {INSTALL_HINT}") from e
    return decoder, dictionary


class BeamSearchDecoder:
    """flashlight-text CTC beam search over the labels of `alphabet` (the model's); with
    cfg.lm_path a lexicon search with KenLM fusion."""

    def __init__(self, cfg: settings.Decoding, alphabet: text.Alphabet = text.LIBRISPEECH):
        if not cfg.beam:
            raise ValueError("BeamSearchDecoder needs decoding.beam_width > 0")
        self._fl, dictionary = _flashlight()
        self.cfg = cfg
        self.alphabet = alphabet
        self.num_tokens, self.silence = alphabet.vocab_size, silence_id(alphabet)
        self.alpha, self.beta = cfg.alpha, cfg.beta
        if cfg.lm_path:
            with open(cfg.lm_path, "rb"):  # a clear FileNotFoundError naming the file
                pass
            if not _is_arpa(cfg.lm_path) and not _is_kenlm_binary(cfg.lm_path):
                raise ValueError(
                    f"decoding.lm_path={cfg.lm_path!r} is not a word LM: neither an ARPA file (it "
                    "starts with \\data\\) nor a KenLM binary (build one with python -m "
                    "ds2_jax.tools.build_lm)"
                )
            if not cfg.lexicon_path and not _is_arpa(cfg.lm_path):
                raise ValueError(
                    f"decoding.lm_path={cfg.lm_path!r} is a KenLM binary: set decoding.lexicon_path "
                    "to its word list (one word per line), or use the ARPA file"
                )
            self.words = lexicon_words(cfg.lexicon_path or cfg.lm_path, alphabet)
            self._word_dict = dictionary.Dictionary([*self.words, UNK])
            from flashlight.lib.text.decoder.kenlm import KenLM

            with _kenlm_banner_dropped():
                self._lm = KenLM(cfg.lm_path, self._word_dict)
            self._trie = self._lexicon_trie()
        else:
            self.words, self._lm = [], self._fl.ZeroLM()
        self._decoder = self._build()

    def _lexicon_trie(self):
        """Spellings of the lexicon's words, each node scored by its best unigram (lookahead).

        A spelling ends with the word boundary '|' (the space): a word is complete only once
        the search leaves its last letter, so that letter's repeated frames stay inside the
        word (decode appends one boundary frame for the utterance's last word)."""
        trie = self._fl.Trie(self.num_tokens, self.silence)
        start = self._lm.start(False)
        for i, word in enumerate(self.words):
            _, score = self._lm.score(start, i)
            trie.insert(self.alphabet.encode(word).tolist() + [self.silence], i, score)
        trie.smear(self._fl.SmearingMode.MAX)
        return trie

    def _build(self):
        fl, cfg = self._fl, self.cfg
        threshold = -cfg.beam_prune_logp
        if not cfg.lm_path:
            opts = fl.LexiconFreeDecoderOptions(
                beam_size=cfg.beam_width,
                beam_size_token=self.num_tokens,
                beam_threshold=threshold,
                lm_weight=0.0,
                sil_score=0.0,
                log_add=False,
                criterion_type=fl.CriterionType.CTC,
            )
            return fl.LexiconFreeDecoder(opts, self._lm, self.silence, text.BLANK, [])
        opts = fl.LexiconDecoderOptions(
            beam_size=cfg.beam_width,
            beam_size_token=self.num_tokens,
            beam_threshold=threshold,
            lm_weight=self.alpha * math.log(10),
            word_score=self.beta,  # KenLM scores are log10
            unk_score=cfg.unk_score_offset,
            sil_score=0.0,
            log_add=False,
            criterion_type=fl.CriterionType.CTC,
        )
        return fl.LexiconDecoder(
            opts, self._trie, self._lm, self.silence, text.BLANK, self._word_dict.get_index(UNK), [], False
        )

    def set_weights(self, alpha: float, beta: float) -> None:
        """New LM weights without reloading the LM (alpha/beta tuning)."""
        self.alpha, self.beta = alpha, beta
        self._decoder = self._build()

    def decode(self, log_probs: np.ndarray) -> str:
        """<float32>[T, vocab] log-probabilities of the valid frames -> text."""
        if len(log_probs) == 0:
            return ""
        lp = prune_tokens(np.asarray(log_probs, np.float32), self.cfg.token_min_logp)
        if self.cfg.lm_path:
            lp = np.concatenate([lp, boundary_frame(lp.shape[1], self.silence)])
        lp = np.ascontiguousarray(lp)
        results = self._decoder.decode(lp.ctypes.data, lp.shape[0], lp.shape[1])
        if not results:  # every path pruned
            return ""
        best = results[0]
        if self.cfg.lm_path:
            return " ".join(self._word_dict.get_entry(w) for w in best.words if w >= 0)
        ids = [t for i, t in enumerate(best.tokens) if t != text.BLANK and (i == 0 or t != best.tokens[i - 1])]
        return " ".join(self.alphabet.decode(np.asarray(ids, np.int32)).split())

    def decode_batch(self, log_probs: np.ndarray, lengths: np.ndarray) -> list[str]:
        """<float32>[B, T, vocab] and <int32>[B] valid frames -> B texts."""
        return [self.decode(lp[: int(n)]) for lp, n in zip(np.asarray(log_probs), np.asarray(lengths))]

    def decode_all(self, log_probs: list[np.ndarray], workers: int | None = None) -> list[str]:
        """Per-utterance <float32>[T_i, vocab] -> texts, on `workers` processes (default: the
        host's cores), each with its own decoder and LM; in this process for a short split
        (under MIN_FRAMES_PER_WORKER frames per worker)."""
        frames = sum(len(lp) for lp in log_probs)
        workers = min(workers or os.cpu_count() or 1, frames // MIN_FRAMES_PER_WORKER, len(log_probs))
        if workers <= 1:
            return [self.decode(lp) for lp in log_probs]
        # spawn, not fork: the parent runs jax's threads. Workers import numpy and flashlight only.
        ctx = multiprocessing.get_context("spawn")
        tuned = dataclasses.replace(self.cfg, alpha=self.alpha, beta=self.beta)
        with concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_worker, initargs=(tuned, self.alphabet)
        ) as pool:
            chunk = max(1, len(log_probs) // (4 * workers))
            return list(pool.map(_decode_in_worker, log_probs, chunksize=chunk))

    def describe(self) -> dict:
        return {"beam_width": self.cfg.beam_width, "alpha": self.alpha, "beta": self.beta, "lm": self.cfg.lm_path}


_WORKER: BeamSearchDecoder | None = None


def _init_worker(cfg: settings.Decoding, alphabet: text.Alphabet) -> None:
    global _WORKER
    _WORKER = BeamSearchDecoder(cfg, alphabet)


def _decode_in_worker(log_probs: np.ndarray) -> str:
    return _WORKER.decode(log_probs)


def make_beam_decoder(cfg: settings.Decoding, alphabet: text.Alphabet = text.LIBRISPEECH) -> BeamSearchDecoder | None:
    """A beam decoder over `alphabet` (the model's) when cfg.beam_width > 0, else None (greedy only)."""
    return BeamSearchDecoder(cfg, alphabet) if cfg.beam else None


def prune_tokens(log_probs: np.ndarray, min_logp: float) -> np.ndarray:
    """<float32>[T, V] with tokens below `min_logp` (other than each frame's best) pushed
    far below the beam threshold, so the search never expands them."""
    keep = (log_probs >= min_logp) | (log_probs == log_probs.max(-1, keepdims=True))
    return np.where(keep, log_probs, PRUNED)


def boundary_frame(vocab: int, silence: int) -> np.ndarray:
    """<float32>[1, vocab]: a frame that is surely the word boundary `silence` (the space)."""
    frame = np.full((1, vocab), PRUNED, np.float32)
    frame[0, silence] = 0.0
    return frame


def lexicon_words(path: str, alphabet: text.Alphabet = text.LIBRISPEECH) -> list[str]:
    """The words beam search may output: an ARPA file's unigrams, or a lexicon file's first
    field per line; <s>, </s> and <unk> excluded, each word checked against `alphabet`."""
    if _is_arpa(path):
        words = arpa_unigrams(path)
    else:
        with open(path, encoding="utf-8") as f:
            words = [line.split()[0] for line in f if line.strip()]
    words = [w for w in dict.fromkeys(words) if w not in ("<s>", "</s>", UNK)]
    bad = [w for w in words if alphabet.unknown_chars(w) or " " in w]
    if bad:
        raise ValueError(
            f"{path}: words outside the model's alphabet ({alphabet.describe()}): {bad[:5]} (build the "
            "LM with python -m ds2_jax.tools.build_lm --workdir=<the run> to keep only its words)"
        )
    if not words:
        raise ValueError(f"{path}: no words for the lexicon")
    return words


def _is_kenlm_binary(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"mmap lm "  # KenLM's binary header


# What KenLM prints to stderr while it reads an ARPA file: advice and a progress bar of stars.
_KENLM_BANNER = ("Loading the LM will be faster if you build a binary file.", "Reading ", "----5---10", "*")


@contextlib.contextmanager
def _kenlm_banner_dropped():
    """KenLM's C++ writes its banner to fd 2: catch it there and pass on any other line."""
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            for line in caught.read().decode(errors="replace").splitlines():
                if line.strip() and not line.startswith(_KENLM_BANNER):
                    print(line, file=sys.stderr)


def _is_arpa(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(64)
    return head.lstrip().startswith(b"\\data\\")


def arpa_unigrams(path: str) -> list[str]:
    """The words of an ARPA file's unigram section (lines with or without a backoff field)."""
    words, inside = [], False
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line == "\\1-grams:":
                inside = True
            elif inside and line.startswith("\\"):
                break
            elif inside and line:
                words.append(line.split("\t")[1])
    if not words:
        raise ValueError(f"{path}: no \\1-grams: section (is it an ARPA file?)")
    return words
