"""CTC decoding on the host: greedy (best path) and beam search with a KenLM n-gram LM.

Greedy decoding needs only the argmax ids the eval step computes on the device. Beam
search needs the per-frame log-probabilities and runs pyctcdecode's prefix beam search
with shallow fusion: a beam's score is

    log P_ctc(chars) + alpha * ln P_lm(words) + beta * len(words)

with the LM (an ARPA or KenLM binary file, see ds2_jax.tools.build_lm) read by kenlm.
Both packages are imported only when a beam decoder is built.

pyctcdecode 0.5 pins numpy<2, which jax does not allow, so it cannot be a regular
requirement: install it with `pip install --no-deps pyctcdecode==0.5.0` after
`pip install -e .[lm]` (which brings kenlm and pyctcdecode's one real dependency, pygtrie).
It runs unchanged on numpy 2.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from ds2_jax import ctc, text

log = logging.getLogger("ds2_jax")

# pyctcdecode's labels for our 29 outputs: '' is the CTC blank.
LABELS = ["", *text.SYMBOLS]
INSTALL_HINT = "pip install -e '.[lm]' && pip install --no-deps pyctcdecode==0.5.0"


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Beam search settings (config.decoding); beam_width 0 = greedy only."""

    beam_width: int = 0
    lm_path: str = ""
    alpha: float = 0.5
    beta: float = 1.0
    beam_prune_logp: float = -10.0
    token_min_logp: float = -5.0
    unk_score_offset: float = -10.0

    def __post_init__(self):
        if self.beam_width < 0:
            raise ValueError(f"decoding.beam_width must be >= 0 (0 = greedy only), got {self.beam_width}")
        if self.lm_path and self.beam_width == 0:
            raise ValueError(f"decoding.lm_path={self.lm_path!r} is used by beam search only: set decoding.beam_width > 0")
        if self.alpha < 0:
            raise ValueError(f"decoding.alpha must be >= 0, got {self.alpha}")
        if self.beam_prune_logp >= 0 or self.token_min_logp >= 0:
            raise ValueError("decoding.beam_prune_logp and decoding.token_min_logp must be < 0 (log-probabilities)")

    @property
    def beam(self) -> bool:
        return self.beam_width > 0

    @classmethod
    def from_config(cls, decoding) -> DecoderConfig:
        """From config.decoding; None (a workdir config.json older than the section) = greedy."""
        if decoding is None:
            return cls()
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(decoding.keys()) - fields
        if unknown:
            raise ValueError(f"unknown config.decoding keys: {sorted(unknown)}")
        return cls(**{k: decoding[k] for k in fields if k in decoding})


def greedy_texts(ids: np.ndarray, lengths: np.ndarray) -> list[str]:
    """<int32>[B, T] argmax paths and <int32>[B] valid frames -> B texts."""
    return [text.decode(ctc.collapse(path, n)) for path, n in zip(np.asarray(ids), np.asarray(lengths))]


class BeamSearchDecoder:
    """pyctcdecode prefix beam search, with a KenLM LM when cfg.lm_path is set."""

    def __init__(self, cfg: DecoderConfig):
        if not cfg.beam:
            raise ValueError("BeamSearchDecoder needs decoding.beam_width > 0")
        try:
            import pyctcdecode
        except ImportError as e:
            raise ImportError(f"beam search needs pyctcdecode and kenlm: {INSTALL_HINT}") from e
        self.cfg = cfg
        unigrams = None
        if cfg.lm_path:
            try:
                import kenlm  # noqa: F401  (pyctcdecode imports it lazily and only warns)
            except ImportError as e:
                raise ImportError(f"decoding.lm_path needs kenlm: {INSTALL_HINT}") from e
            with open(cfg.lm_path, "rb"):  # a clear FileNotFoundError naming the file
                pass
            if cfg.lm_path.endswith(".arpa"):
                unigrams = arpa_unigrams(cfg.lm_path)
        logging.getLogger("pyctcdecode").setLevel(logging.ERROR)  # "only N unigrams" on small LMs
        self._decoder = pyctcdecode.build_ctcdecoder(
            LABELS,
            kenlm_model_path=cfg.lm_path or None,
            unigrams=unigrams,
            alpha=cfg.alpha,
            beta=cfg.beta,
            unk_score_offset=cfg.unk_score_offset,
        )
        self.alpha, self.beta = cfg.alpha, cfg.beta

    def set_weights(self, alpha: float, beta: float) -> None:
        """New LM weights without reloading the LM (alpha/beta tuning)."""
        self._decoder.reset_params(alpha=alpha, beta=beta)
        self.alpha, self.beta = alpha, beta

    def decode(self, log_probs: np.ndarray) -> str:
        """<float32>[T, 29] log-probabilities of the valid frames -> text."""
        if len(log_probs) == 0:
            return ""
        out = self._decoder.decode(
            np.asarray(log_probs, np.float32),
            beam_width=self.cfg.beam_width,
            beam_prune_logp=self.cfg.beam_prune_logp,
            token_min_logp=self.cfg.token_min_logp,
        )
        return " ".join(out.split())

    def decode_batch(self, log_probs: np.ndarray, lengths: np.ndarray) -> list[str]:
        """<float32>[B, T, 29] and <int32>[B] valid frames -> B texts."""
        return [self.decode(lp[: int(n)]) for lp, n in zip(np.asarray(log_probs), np.asarray(lengths))]

    def describe(self) -> dict:
        return {"beam_width": self.cfg.beam_width, "alpha": self.alpha, "beta": self.beta, "lm": self.cfg.lm_path}


def make_beam_decoder(cfg: DecoderConfig) -> BeamSearchDecoder | None:
    """A beam decoder when cfg.beam_width > 0, else None (greedy only)."""
    return BeamSearchDecoder(cfg) if cfg.beam else None


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
