"""The 28-symbol alphabet, transcript normalization and label encoding.

Index 0 is the CTC blank; 1 is the apostrophe, 2 the space and 3..28 are a..z,
so the model has 29 outputs.
"""

from __future__ import annotations

import string

import numpy as np

BLANK = 0
SYMBOLS = "' " + string.ascii_lowercase
VOCAB_SIZE = len(SYMBOLS) + 1  # + blank
_CHAR_TO_ID = {c: i + 1 for i, c in enumerate(SYMBOLS)}


def normalize(text: str) -> str:
    """Lower-cases, strips a byte-order mark and line ends, collapses whitespace."""
    text = text.replace("\ufeff", "").replace("\r", " ").replace("\n", " ")
    return " ".join(text.lower().split())


def unknown_chars(text: str) -> set[str]:
    """Characters of an already normalized text that are outside the alphabet."""
    return {c for c in text if c not in _CHAR_TO_ID}


def encode(text: str) -> np.ndarray:
    """Normalized text -> int32 label ids in 1..28; raises on unknown characters."""
    bad = unknown_chars(text)
    if bad:
        raise ValueError(f"characters outside the alphabet: {sorted(bad)!r} in {text!r}")
    return np.array([_CHAR_TO_ID[c] for c in text], dtype=np.int32)


def decode(ids) -> str:
    """Label ids (no blanks expected; 0 is skipped) -> text."""
    return "".join(SYMBOLS[i - 1] for i in np.asarray(ids).tolist() if i != BLANK)
