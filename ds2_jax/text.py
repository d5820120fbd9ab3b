"""Alphabets, the one text normalization, and label encoding.

An `Alphabet` is a string of distinct characters (Unicode code points after NFC); label
0 is the CTC blank and character i of the alphabet is label i + 1, so a model over it
has len(alphabet) + 1 outputs. LibriSpeech's is `LIBRISPEECH` (the apostrophe, the
space, a..z: 29 outputs); a model's is config.model.alphabet ('' = LibriSpeech's), set
by training from the prepared data (ds2_jax.datasets.manifest derives or reads it).

`normalize` is the one normalization of transcripts, used by the dataset builds, the
LM build (tools.build_lm) and the lexicon check: NFC, lower case, punctuation removed
(apostrophes kept: they are part of words), whitespace collapsed. Case folding and
punctuation removal can be turned off (dataset.lower_case, dataset.strip_punctuation).

Text files (manifests, vocabularies, transcripts, LM text) are read by `text_lines` or
`decode_file`: UTF-8 (a byte-order mark dropped), or UTF-16/32 with its byte-order mark; any other
byte is a ValueError naming the file, the line and how to convert it, never a replaced
character (a Latin-1 "señor" read with errors='replace' trains on "se or").
"""

from __future__ import annotations

import codecs
import dataclasses
import io
import string
import unicodedata
from typing import Iterator

import numpy as np

BLANK = 0
# Byte-order marks of the encodings read besides UTF-8 (UTF-32's first: it starts with UTF-16 LE's).
WIDE_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
APOSTROPHES = {"\u2019": "'", "\u02bc": "'"}  # typographic apostrophes -> "'"


class _PunctuationTable(dict):
    """str.translate's table for strip_punctuation, filled per character on first sight: an
    apostrophe -> "'", punctuation (Unicode category P*) and symbols (S*) -> ' ', the rest kept."""

    def __missing__(self, code: int):
        c = chr(code)
        out = "'" if c == "'" or c in APOSTROPHES else (" " if unicodedata.category(c)[0] in "PS" else c)
        self[code] = out
        return out


_PUNCTUATION = _PunctuationTable()


def normalize(text: str, lower_case: bool = True, strip_punctuation: bool = True) -> str:
    """NFC; lower case (str.lower: keeps 'ß' and a final 'ς'); punctuation (Unicode
    category P*, and symbols S*) replaced by spaces, apostrophes kept; a byte-order mark
    dropped; whitespace collapsed to single spaces."""
    text = unicodedata.normalize("NFC", text.replace("\ufeff", ""))
    if lower_case:
        text = unicodedata.normalize("NFC", text.lower())
    if strip_punctuation:
        text = text.translate(_PUNCTUATION)
    return " ".join(text.split())


@dataclasses.dataclass(frozen=True)
class Alphabet:
    """The characters a model emits; character i is label i + 1 (0 is the blank)."""

    symbols: str

    def __post_init__(self):
        if not self.symbols:
            raise ValueError("an alphabet needs at least one symbol")
        dup = sorted({c for c in self.symbols if self.symbols.count(c) > 1})
        if dup:
            raise ValueError(f"alphabet {self.symbols!r} repeats {dup!r}")
        ws = [c for c in self.symbols if c.isspace() and c != " "]
        if ws:
            raise ValueError(f"alphabet {self.symbols!r} holds whitespace other than the space: {ws!r}")
        object.__setattr__(self, "_ids", {c: i + 1 for i, c in enumerate(self.symbols)})

    @classmethod
    def of_setting(cls, value: str) -> "Alphabet":
        """config.model.alphabet -> its Alphabet ('' = LibriSpeech's)."""
        return cls(value) if value else LIBRISPEECH

    @property
    def setting(self) -> str:
        """The config.model.alphabet value of this alphabet ('' for LibriSpeech's, so workdirs
        trained before the setting existed compare equal)."""
        return "" if self == LIBRISPEECH else self.symbols

    @property
    def vocab_size(self) -> int:
        return len(self.symbols) + 1  # + blank

    def unknown_chars(self, text: str) -> set[str]:
        """Characters of an already normalized text that are outside the alphabet."""
        return {c for c in text if c not in self._ids}

    def encode(self, text: str) -> np.ndarray:
        """Normalized text -> <int32> label ids in 1..len(symbols); raises on unknown characters."""
        bad = self.unknown_chars(text)
        if bad:
            raise ValueError(f"characters outside the alphabet: {sorted(bad)!r} in {text!r}")
        return np.array([self._ids[c] for c in text], dtype=np.int32)

    def decode(self, ids) -> str:
        """Label ids (no blanks expected; 0 is skipped) -> text."""
        return "".join(self.symbols[i - 1] for i in np.asarray(ids).tolist() if i != BLANK)

    def describe(self) -> str:
        """'33 symbols: ' abc...' (the space shown as '␣'), for logs and errors."""
        shown = self.symbols.replace(" ", "\u2423")
        return f"{len(self.symbols)} symbols {shown!r}"

    def to_lines(self) -> str:
        """The vocabulary file format (read_vocabulary): one symbol a line, the space as a line '<space>'."""
        return "".join(("<space>" if c == " " else c) + "\n" for c in self.symbols)


SPACE_NAMES = ("<space>", "|")


def read_vocabulary(path: str) -> Alphabet:
    """A vocabulary file: one symbol a line; the space as a line holding one space, '<space>'
    or '|'; blank lines and lines starting with '#' ignored ('\\#' is the '#' symbol: Mozilla
    DeepSpeech's alphabet.txt reads as it is). Symbols are NFC-normalized. A ValueError names
    the file and line of a bad entry."""
    symbols = []
    for number, line in enumerate(text_lines(path), 1):
        entry = line.rstrip("\r\n")
        if entry == " ":
            symbols.append(" ")
            continue
        entry = entry.strip()
        if not entry or entry.startswith("#"):
            continue
        entry = " " if entry in SPACE_NAMES else ("#" if entry == "\\#" else unicodedata.normalize("NFC", entry))
        if len(entry) != 1:
            raise ValueError(
                f"{path}:{number}: {entry!r} is not one character (a vocabulary file holds one "
                "symbol a line; the space as '<space>')"
            )
        if entry in symbols:
            raise ValueError(f"{path}:{number}: {entry!r} is listed twice")
        symbols.append(entry)
    if not symbols:
        raise ValueError(f"{path}: no symbols (a vocabulary file holds one symbol a line)")
    return Alphabet("".join(symbols))


def derive(texts) -> Alphabet:
    """The alphabet of normalized texts: their characters, the space first, then in code-point order."""
    chars = set()
    for t in texts:
        chars.update(t)
    ordered = sorted(chars - {" "})
    return Alphabet((" " if " " in chars else "") + "".join(ordered))


LIBRISPEECH = Alphabet("' " + string.ascii_lowercase)
SYMBOLS = LIBRISPEECH.symbols
VOCAB_SIZE = LIBRISPEECH.vocab_size


def unknown_chars(text: str) -> set[str]:
    """LIBRISPEECH.unknown_chars."""
    return LIBRISPEECH.unknown_chars(text)


def encode(text: str) -> np.ndarray:
    """LIBRISPEECH.encode."""
    return LIBRISPEECH.encode(text)


def decode(ids) -> str:
    """LIBRISPEECH.decode."""
    return LIBRISPEECH.decode(ids)


def collapse(best_path: np.ndarray, length: int) -> np.ndarray:
    """One CTC argmax path -> label ids (merge repeats, drop blanks)."""
    path = np.asarray(best_path)[: int(length)]
    keep = np.ones_like(path, bool)
    keep[1:] = path[1:] != path[:-1]
    return path[keep & (path != BLANK)]


# ----------------------------------------------------------------------------- reading text files


def _not_utf8(where: str, line: int, raw: bytes, e: UnicodeDecodeError) -> ValueError:
    return ValueError(
        f"{where}:{line}: byte 0x{raw[e.start]:02x} (column {e.start + 1}) is not UTF-8: the file is in another "
        f"encoding (Latin-1 or Windows-1252, most likely), and its text is not guessed. Convert it to UTF-8 in "
        f"place, e.g. `iconv -f LATIN1 -t UTF-8 {where} > {where}.utf8 && mv {where}.utf8 {where}`"
    )


def _wide(data: bytes, where: str) -> str | None:
    """The text of UTF-16/32 `data` that starts with its byte-order mark; None for any other."""
    for bom, encoding in WIDE_BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{where}: starts with a {encoding.upper()} byte-order mark but byte {e.start} does not decode "
                    f"as {encoding.upper()} ({e.reason}): save it as UTF-8 and use that file"
                ) from e
    return None


def decode_file(data: bytes, where: str) -> str:
    """The text of a file's bytes (UTF-8, a BOM dropped; UTF-16/32 with a BOM); a ValueError names
    `where`, the line and the fix of a byte that is no UTF-8."""
    wide = _wide(data, where)
    if wide is not None:
        return wide.lstrip("\ufeff")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        start = data.rfind(b"\n", 0, e.start) + 1
        end = data.find(b"\n", e.start)
        line = data[start : len(data) if end < 0 else end]
        at = UnicodeDecodeError(e.encoding, line, e.start - start, e.end - start, e.reason)
        raise _not_utf8(where, data.count(b"\n", 0, e.start) + 1, line, at) from e


def text_lines(path: str) -> Iterator[str]:
    """The lines of a text file with their ends (as `open(path, newline='')` gives them), decoded as
    `decode_file` does, a line at a time (an LM's text may be larger than memory)."""
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(0)
        if any(head.startswith(bom) for bom, _ in WIDE_BOMS):
            yield from io.StringIO(decode_file(f.read(), path), newline="")
            return
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise _not_utf8(path, number, raw, e) from e
            yield line
