"""Word n-gram language model (ARPA) from transcripts, estimated offline in pure Python.

    python -m ds2_jax.tools.build_lm --manual_dir=corpora/tiny_librispeech \\
        --splits=train-clean-100 --order 3 --out lm.arpa
    python -m ds2_jax.tools.build_lm --transcripts corpus.txt more/ --order 3 --out lm.arpa
    python -m ds2_jax.tools.build_lm --manual_dir=corpora/tiny_es/common_voice --splits=train \
        --workdir=runs/es --order 3 --out es.arpa                      # manifests, the run's alphabet

Smoothing is interpolated modified Kneser-Ney (Chen & Goodman 1998), as KenLM's `lmplz`
estimates it (no pip package ships lmplz: not `kenlm`, not flashlight-text, whose KenLM
only reads models): lower orders use continuation counts (n-grams starting with <s> keep
their raw counts), three discounts per order from the count-of-counts (lmplz's
--discount_fallback 0.5/1/1.5 when the corpus is too small for them), and unigrams are
interpolated with the uniform distribution over the vocabulary (</s> and <unk> included,
<s> never predicted). Each stored probability is the interpolated one and each backoff
weight is the interpolation weight of its context, so the ARPA back-off rule reproduces
the interpolated model exactly and every P(. | h) sums to 1. Counts stay in memory: fine
for LibriSpeech's training transcripts (~10 M words); for the 800 M-word LibriSpeech LM
corpus use KenLM's lmplz.

Text is normalized as the acoustic model's labels are (text.normalize: NFC, lower case,
punctuation removed, collapsed spaces; with --workdir its dataset.lower_case and
dataset.strip_punctuation), so LM words and decoded words match. With --workdir, sentences
holding a character outside the run's alphabet (model.alphabet) are left out and counted, as
the dataset build skips them. --manual_dir reads LibriSpeech splits or, where DIR holds
<split>.tsv/.csv/.jsonl/.json, the manifests' transcripts (ds2_jax.datasets.manifest).
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import sys
import tarfile
from collections.abc import Iterable, Iterator

from ds2_jax import files, text

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)  # lmplz --discount_fallback


# ----------------------------------------------------------------------------- input


def read_text_file(path: str) -> Iterator[str]:
    """Sentences of a text file: one per line; a '<id> WORDS' .trans.txt loses its ids."""
    strip_id = path.endswith(".trans.txt")
    for line in text.text_lines(path):  # UTF-8 (or UTF-16 with a BOM); other bytes: an error naming the line
        if strip_id:
            parts = line.split(maxsplit=1)
            line = parts[1] if len(parts) > 1 else ""
        yield line


def read_paths(paths: Iterable[str]) -> Iterator[str]:
    """Sentences from text files, directories (every *.trans.txt below) and .tar.gz archives."""
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs.sort()
                for name in sorted(files):
                    if name.endswith(".trans.txt"):
                        yield from read_text_file(os.path.join(root, name))
        elif path.endswith((".tar.gz", ".tgz")):
            yield from read_archive(path)
        elif os.path.isfile(path):
            yield from read_text_file(path)
        else:
            raise FileNotFoundError(f"--transcripts: {path} is not a file or directory")


def read_archive(path: str) -> Iterator[str]:
    """Sentences of every .trans.txt in a LibriSpeech .tar.gz (streamed, nothing extracted)."""
    with tarfile.open(path, mode="r|gz") as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(".trans.txt"):
                for line in text.decode_file(tar.extractfile(member).read(), f"{path}:{member.name}").splitlines():
                    parts = line.split(maxsplit=1)
                    yield parts[1] if len(parts) > 1 else ""


def split_paths(manual_dir: str, splits: list[str]) -> list[str]:
    """The tree or archive of each LibriSpeech split in a manual dir (the tfds builder's layout)."""
    paths = []
    for split in splits:
        candidates = [os.path.join(manual_dir, "LibriSpeech", split), os.path.join(manual_dir, split)]
        found = [p for p in candidates if os.path.isdir(p)] or [
            p for p in [os.path.join(manual_dir, f"{split}.tar.gz")] if os.path.isfile(p)
        ]
        if not found:
            raise FileNotFoundError(
                f"--splits: no {split} in --manual_dir={manual_dir} (expected LibriSpeech/{split}/, "
                f"{split}/ or {split}.tar.gz)"
            )
        paths.append(found[0])
    return paths


def manifest_transcripts(manual_dir: str, splits: list[str], dataset=None) -> list[str] | None:
    """The transcripts of the manifests of `splits` in `manual_dir` (their columns as `dataset`,
    a settings.Dataset, names them), or None where manual_dir holds no manifest of the first split."""
    from ds2_jax.datasets import manifest

    if not os.path.isdir(manual_dir) or manifest.tfds_split(splits[0]) not in manifest.find_manifests(manual_dir):
        return None
    options = manifest.Options(
        path_column=dataset.path_column if dataset else "",
        text_column=dataset.text_column if dataset else "",
        manifest_splits="+".join(splits),
    )
    found = manifest.find_manifests(manual_dir, options.manifest_splits)
    return [
        e.text
        for path in found.values()
        for e in (manifest.read_manifest(path, options) or manifest.Manifest("", path, [], [])).entries
    ]


def sentences(
    lines: Iterable[str], normalize=text.normalize, alphabet: text.Alphabet | None = None, dropped: list | None = None
) -> Iterator[list[str]]:
    """Normalized, non-empty word lists; with `alphabet`, a sentence holding a character
    outside it is left out (appended to `dropped`)."""
    for line in lines:
        normalized = normalize(line)
        if alphabet is not None and alphabet.unknown_chars(normalized):
            if dropped is not None:
                dropped.append(normalized)
            continue
        words = normalized.split()
        if words:
            yield words


# ----------------------------------------------------------------------------- estimation


def count_ngrams(sents: Iterable[list[str]], order: int) -> list[collections.Counter]:
    """Raw counts of every 1..order-gram of `<s> words </s>`; index k-1 holds the k-grams."""
    counts = [collections.Counter() for _ in range(order)]
    for words in sents:
        toks = [BOS, *words, EOS]
        for i in range(len(toks)):
            for k in range(1, min(order, len(toks) - i) + 1):
                counts[k - 1][tuple(toks[i : i + k])] += 1
    return counts


def adjusted_counts(raw: list[collections.Counter]) -> list[dict]:
    """Kneser-Ney counts: the highest order and n-grams starting with <s> keep raw counts;
    other lower-order n-grams count their distinct left extensions."""
    order = len(raw)
    adjusted: list[dict] = [{} for _ in range(order)]
    adjusted[-1] = dict(raw[-1])
    for k in range(order - 1):
        left = collections.Counter(g[1:] for g in raw[k + 1])
        adjusted[k] = {g: (c if g[0] == BOS else left[g]) for g, c in raw[k].items()}
    # Every occurrence of a k-gram not starting with <s> has a left neighbour: no zero counts.
    return adjusted


def discounts(counts: dict, k: int) -> tuple[float, float, float]:
    """Modified Kneser-Ney D1, D2, D3+ from the count-of-counts of one order."""
    n = collections.Counter(min(c, 4) for g, c in counts.items() if g != (BOS,))
    if min(n[1], n[2], n[3], n[4]) == 0:
        return FALLBACK_DISCOUNTS
    y = n[1] / (n[1] + 2 * n[2])
    d = (1 - 2 * y * n[2] / n[1], 2 - 3 * y * n[3] / n[2], 3 - 4 * y * n[4] / n[3])
    if not all(0 < di < i + 1 for i, di in enumerate(d)):
        return FALLBACK_DISCOUNTS
    return d


def estimate(sents: Iterable[list[str]], order: int) -> tuple[list[dict], list[dict]]:
    """Interpolated modified Kneser-Ney.

    Returns (probs, backoffs): probs[k-1][ngram] = P(w | h) of every seen k-gram
    (natural probabilities, not logs), backoffs[k-1][h] = interpolation weight of every
    seen k-gram h used as a context (orders < `order`).
    """
    if order < 1:
        raise ValueError(f"--order must be >= 1, got {order}")
    raw = count_ngrams(sents, order)
    if not raw[0]:
        raise ValueError("no words in the transcripts")
    adj = adjusted_counts(raw)
    vocab = {g[0] for g in raw[0]} - {BOS} | {UNK}
    probs: list[dict] = [{} for _ in range(order)]
    backoffs: list[dict] = [{} for _ in range(order)]
    for k in range(1, order + 1):
        d = discounts(adj[k - 1], k)
        denom: dict = collections.defaultdict(float)
        mass: dict = collections.defaultdict(float)  # discounted mass per context
        for g, c in adj[k - 1].items():
            if g == (BOS,):
                continue
            denom[g[:-1]] += c
            mass[g[:-1]] += d[min(c, 3) - 1]
        gamma = {h: mass[h] / denom[h] for h in denom}
        for g, c in adj[k - 1].items():
            if g == (BOS,):
                continue
            h = g[:-1]
            lower = 1.0 / len(vocab) if k == 1 else probs[k - 2][g[1:]]
            probs[k - 1][g] = (c - d[min(c, 3) - 1]) / denom[h] + gamma[h] * lower
        if k == 1:
            probs[0][(UNK,)] = gamma[()] / len(vocab)
        else:
            backoffs[k - 2] = {h: gamma[h] for h in gamma}
    return probs, backoffs


def write_arpa(probs: list[dict], backoffs: list[dict], path: str) -> dict[int, int]:
    """Writes an ARPA file; returns {order: number of n-grams}.

    Every line of orders below the highest carries a backoff field (0 where the n-gram is
    never a context), as lmplz writes them and some ARPA readers require.
    """
    order = len(probs)
    unigrams = dict(probs[0])
    sizes = {k + 1: len(probs[k]) + (1 if k == 0 else 0) for k in range(order)}  # + <s>
    with files.replacing(path, "w") as f:  # atomic, under a temporary name of its own
        f.write("\\data\\\n")
        f.writelines(f"ngram {k}={sizes[k]}\n" for k in range(1, order + 1))
        for k in range(1, order + 1):
            f.write(f"\n\\{k}-grams:\n")
            table = probs[k - 1]
            if k == 1:
                table = {(BOS,): None, **unigrams}
            for g in sorted(table, key=lambda g: (g != (BOS,), g)):
                p = table[g]
                logp = -99.0 if p is None else math.log10(p)
                line = f"{logp:.6f}\t{' '.join(g)}"
                if k < order:
                    bo = backoffs[k - 1].get(g)
                    line += f"\t{math.log10(bo) if bo else 0.0:.6f}"
                f.write(line + "\n")
        f.write("\n\\end\\\n")
    return sizes


# ----------------------------------------------------------------------------- CLI

MIN_ORDER = 2  # KenLM's loader: "This ngram implementation assumes at least a bigram model"
MAX_ORDER = 6  # the highest order flashlight-text's KenLM is compiled for (KENLM_MAX_ORDER); order 7 fails to load


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_list(
        "transcripts",
        [],
        "Comma-separated text files (one sentence a line), *.trans.txt files, "
        "directories (every *.trans.txt below) or LibriSpeech .tar.gz archives.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "manual_dir",
        "",
        "A LibriSpeech-layout directory or a folder of manifests (as dataset.manual_dir).",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "splits",
        "",
        "With --manual_dir: comma or '+' separated splits, e.g. train-clean-100+train-clean-360.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "workdir",
        "",
        "A training workdir: its alphabet (model.alphabet) and normalization "
        "(dataset.lower_case, dataset.strip_punctuation).",
        flag_values=fv,
    )
    flags.DEFINE_integer("order", 3, "n-gram order.", flag_values=fv)
    flags.DEFINE_string("out", None, "Output ARPA file.", required=True, flag_values=fv)


def main(argv: list[str] | None = None) -> int:
    from ds2_jax import cli

    args, _ = cli.parse_args(argv, define_flags, __doc__)
    if not MIN_ORDER <= args.order <= MAX_ORDER:  # before reading any text: a model the decoder cannot load is no use
        cli.usage_error(
            f"--order={args.order}: must be {MIN_ORDER}..{MAX_ORDER} (the decoder's KenLM loads models of order "
            f"{MIN_ORDER} to {MAX_ORDER}: a unigram model is refused by its loader)"
        )
    config = None
    if args.workdir:
        from ds2_jax import workdir_config

        config = workdir_config.load_config(args.workdir)
    paths, lines = list(args.transcripts), []
    if args.manual_dir:
        splits = [s.strip() for s in args.splits.replace("+", ",").split(",") if s.strip()]
        if not splits:
            cli.usage_error("--manual_dir needs --splits (e.g. train-clean-100)")
        from_manifests = manifest_transcripts(args.manual_dir, splits, config.dataset if config else None)
        if from_manifests is None:
            paths += split_paths(args.manual_dir, splits)
        else:
            lines = from_manifests
    if not paths and not lines:
        cli.usage_error("give --transcripts and/or --manual_dir with --splits")
    normalize, alphabet, dropped = text.normalize, None, []
    if config is not None:
        d = config.dataset
        normalize = lambda t: text.normalize(t, d.lower_case, d.strip_punctuation)  # noqa: E731
        alphabet = text.Alphabet.of_setting(config.model.alphabet)
    sents = list(sentences(itertools.chain(lines, read_paths(paths)), normalize, alphabet, dropped))
    if dropped:
        bad = collections.Counter(c for t in dropped for c in alphabet.unknown_chars(t))
        print(
            f"left out {len(dropped)} sentences with characters outside the alphabet of {args.workdir}: "
            + ", ".join(f"{c!r} in {n}" for c, n in bad.most_common(10)),
            file=sys.stderr,
        )
    probs, backoffs = estimate(sents, args.order)
    sizes = write_arpa(probs, backoffs, args.out)
    words = sum(len(s) for s in sents)
    print(
        f"{args.out}: order {args.order}, {len(sents)} sentences, {words} words, "
        + ", ".join(f"{k}-grams: {n}" for k, n in sizes.items()),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    from ds2_jax import errors

    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
