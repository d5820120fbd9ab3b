"""An ARPA reader and back-off scorer: the oracle the tests hold ds2_jax.tools.build_lm's
files (and flashlight-text's KenLM) against."""

from __future__ import annotations

import collections

from ds2_jax.tools.build_lm import BOS, EOS, UNK


class ArpaModel:
    """Reads an ARPA file and scores with the standard back-off rule (log10).

    The tests' reference scorer (the decoder itself loads the file with flashlight-text's KenLM).
    """

    def __init__(self, path: str):
        self.header: dict[int, int] = {}
        self.logp: dict[tuple, float] = {}
        self.backoff: dict[tuple, float] = {}
        section = 0
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line or line == "\\data\\" or line == "\\end\\":
                    continue
                if line.startswith("ngram "):
                    k, n = line[len("ngram ") :].split("=")
                    self.header[int(k)] = int(n)
                elif line.startswith("\\") and line.endswith("-grams:"):
                    section = int(line[1 : -len("-grams:")])
                else:
                    parts = line.split("\t")
                    g = tuple(parts[1].split())
                    if len(g) != section:
                        raise ValueError(f"{path}: {parts[1]!r} listed under \\{section}-grams")
                    self.logp[g] = float(parts[0])
                    if len(parts) > 2:
                        self.backoff[g] = float(parts[2])
        self.order = max(self.header)
        self.vocab = sorted(g[0] for g in self.logp if len(g) == 1)

    def counts(self) -> dict[int, int]:
        """Listed n-grams per order (compare with the header)."""
        return dict(collections.Counter(len(g) for g in self.logp))

    def log10_prob(self, word: str, history: tuple[str, ...]) -> float:
        """log10 P(word | history), backing off as ARPA defines."""
        word = word if (word,) in self.logp else UNK
        history = tuple(history)[-(self.order - 1) :] if self.order > 1 else ()
        penalty = 0.0
        while True:
            g = (*history, word)
            if g in self.logp:
                return penalty + self.logp[g]
            penalty += self.backoff.get(history, 0.0)
            history = history[1:]

    def sentence_log10_prob(self, words: list[str]) -> float:
        """log10 P(words </s> | <s>)."""
        history, total = (BOS,), 0.0
        for w in [*words, EOS]:
            total += self.log10_prob(w, history)
            history = (*history, w)
        return total
