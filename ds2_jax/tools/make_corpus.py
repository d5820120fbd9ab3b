"""Speaks generated sentences with espeak-ng into a corpus in the exact LibriSpeech layout.

    python -m ds2_jax.tools.make_corpus --out corpora/tiny_librispeech

writes OUT/LibriSpeech/<split>/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac (16 kHz
mono int16 FLAC), one <speaker>-<chapter>.trans.txt per chapter (upper-case transcripts,
as in LibriSpeech) and SPEAKERS.TXT. A "speaker" is one espeak-ng voice + variant at one
rate and pitch; dev and test speakers are held out (disjoint from training speakers).

Text comes from `sentence()`, a tiny grammar over the word lists below, written for this
project (common English words chosen to sound distinct; no external source). The
output is a pure function of the flags (and the espeak-ng version). Needs the
`espeak-ng` program (Debian/Ubuntu: apt-get install espeak-ng).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from concurrent import futures

import numpy as np
import soundfile

SAMPLE_RATE = 16_000

# --- Text: a small grammar over a small vocabulary -----------------------------------
ADJECTIVES = ["red", "green", "blue", "big", "small", "old", "happy", "quiet", "brown", "white"]
NOUNS = ["cat", "dog", "bird", "fish", "horse", "man", "woman", "child", "king", "farmer"]
VERBS = ["runs", "sleeps", "jumps", "sings", "walks", "eats", "swims", "waits"]
OBJECTS = ["the house", "the river", "the tree", "the bread", "the water", "the road"]
ADVERBS = ["today", "again", "slowly", "quickly", "at night", "at home"]
TRANSITIVE = ["sees", "likes", "finds", "takes", "wants"]
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven"]
PLURALS = ["cats", "dogs", "birds", "fish", "horses", "men", "kings", "farmers"]


def sentence(rng: np.random.Generator) -> str:
    """One short lower-case sentence of 2-5 words."""
    pick = lambda words: words[rng.integers(len(words))]  # noqa: E731
    form = rng.integers(5)
    if form == 0:
        return f"the {pick(ADJECTIVES)} {pick(NOUNS)} {pick(VERBS)}"
    if form == 1:
        return f"the {pick(NOUNS)} {pick(VERBS)} {pick(ADVERBS)}"
    if form == 2:
        return f"the {pick(NOUNS)} {pick(TRANSITIVE)} {pick(OBJECTS)}"
    if form == 3:
        return f"{pick(NUMBERS)} {pick(ADJECTIVES)} {pick(PLURALS)}"
    return f"a {pick(ADJECTIVES)} {pick(NOUNS)}"


# --- Voices: espeak-ng voice + variant at a rate (words/min) and pitch (0-99) ---------
VOICES = ["en-us", "en-gb", "en-gb-x-rp", "en-gb-scotland", "en-029", "en-us-nyc"]
VARIANTS = ["m1", "m2", "m3", "m4", "m5", "m7", "f1", "f2", "f3", "f4", "f5"]
RATES = (140, 200)
PITCHES = (25, 75)


def speakers(rng: np.random.Generator, count: int) -> list[tuple[str, int, int]]:
    """`count` distinct (voice+variant, rate, pitch) speakers."""
    out, seen = [], set()
    while len(out) < count:
        voice = f"{VOICES[rng.integers(len(VOICES))]}+{VARIANTS[rng.integers(len(VARIANTS))]}"
        if voice in seen and len(seen) < len(VOICES) * len(VARIANTS):
            continue
        seen.add(voice)
        out.append((voice, int(rng.integers(*RATES)), int(rng.integers(*PITCHES))))
    return out


def require_espeak() -> str:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise FileNotFoundError(
            "make_corpus needs the espeak-ng program: apt-get install -y espeak-ng (or brew install espeak-ng)"
        )
    return exe


def speak(exe: str, words: str, voice: str, rate: int, pitch: int, peak: float) -> np.ndarray:
    """espeak-ng -> <int16>[n] at 16 kHz, silence trimmed to 0.1 s each side."""
    from scipy.signal import resample_poly

    wav = subprocess.run(
        [exe, "-v", voice, "-s", str(rate), "-p", str(pitch), "--stdout", words],
        check=True,
        capture_output=True,
    ).stdout
    audio, rate_in = soundfile.read(io.BytesIO(wav), dtype="float32")
    audio = resample_poly(audio, SAMPLE_RATE, rate_in) if rate_in != SAMPLE_RATE else audio
    loud = np.flatnonzero(np.abs(audio) > 0.02 * np.abs(audio).max())
    margin = SAMPLE_RATE // 10
    audio = audio[max(loud[0] - margin, 0) : loud[-1] + margin]
    # A quiet peak keeps the FLACs small (the bundled corpus must stay a few MB).
    return np.round(audio / np.abs(audio).max() * peak).astype(np.int16)


def make_split(
    out: str, split: str, spk: list, first_id: int, utts: int, rng, exe: str, max_seconds: float, workers: int
) -> list[tuple[int, str, float]]:
    """Writes one split; returns a (speaker id, seconds) row per utterance."""
    jobs = []
    for k, (voice, rate, pitch) in enumerate(spk):
        speaker, chapter = first_id + k, 10 * (first_id + k)
        for u in range(utts):
            jobs.append((speaker, chapter, u, sentence(rng), voice, rate, pitch, float(rng.uniform(2000, 4000))))

    def run(job):
        speaker, chapter, u, words, voice, rate, pitch, peak = job
        audio = speak(exe, words, voice, rate, pitch, peak)
        return job, audio

    rows, lines = [], {}
    with futures.ThreadPoolExecutor(workers) as pool:
        for (speaker, chapter, u, words, voice, _, _, _), audio in pool.map(run, jobs):
            # Sentences are <= 5 words; at >= 140 words/min that is under 3 s.
            if len(audio) > max_seconds * SAMPLE_RATE:
                raise ValueError(f"{words!r} by {voice} is longer than --max_seconds={max_seconds}")
            d = os.path.join(out, "LibriSpeech", split, str(speaker), str(chapter))
            os.makedirs(d, exist_ok=True)
            utt_id = f"{speaker}-{chapter}-{u:04d}"
            soundfile.write(
                os.path.join(d, utt_id + ".flac"), audio, SAMPLE_RATE, subtype="PCM_16", compression_level=1.0
            )
            lines.setdefault((speaker, chapter, d), []).append(f"{utt_id} {words.upper()}")
            rows.append((speaker, len(audio) / SAMPLE_RATE))
    for (speaker, chapter, d), text in lines.items():
        with open(os.path.join(d, f"{speaker}-{chapter}.trans.txt"), "w") as f:
            f.write("\n".join(text) + "\n")
    return rows


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_string("out", None, "Output dir (LibriSpeech/ goes inside).", required=True, flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seeds voices, texts and their order.", flag_values=fv)
    flags.DEFINE_integer("train_speakers", 16, "Speakers of train-clean-100.", flag_values=fv)
    flags.DEFINE_integer("dev_speakers", 2, "Speakers of dev-clean.", flag_values=fv)
    flags.DEFINE_integer("test_speakers", 3, "Speakers of test-clean (held out).", flag_values=fv)
    flags.DEFINE_integer("utts_per_speaker", 13, "Utterances per speaker.", flag_values=fv)
    flags.DEFINE_float("max_seconds", 4.0, "Longest utterance.", flag_values=fv)
    flags.DEFINE_integer("workers", os.cpu_count() or 1, "espeak-ng processes.", flag_values=fv)


def main(argv=None) -> int:
    from ds2_jax import cli

    args, _ = cli.parse_args(argv, define_flags, __doc__)
    exe = require_espeak()
    rng = np.random.default_rng(args.seed)
    counts = {"train-clean-100": args.train_speakers, "dev-clean": args.dev_speakers, "test-clean": args.test_speakers}
    spk = speakers(rng, sum(counts.values()))
    root = os.path.join(args.out, "LibriSpeech")
    if os.path.exists(root):
        shutil.rmtree(root)
    table, first = [], 100
    for split, n in counts.items():
        if n == 0:
            continue
        group, spk = spk[:n], spk[n:]
        rows = make_split(
            args.out, split, group, first, args.utts_per_speaker, rng, exe, args.max_seconds, args.workers
        )
        secs = {}
        for speaker, s in rows:
            secs[speaker] = secs.get(speaker, 0.0) + s
        for k, (voice, rate, pitch) in enumerate(group):
            table.append(
                f"{first + k:<5}| {'F' if '+f' in voice else 'M'} | {split:<16}| "
                f"{secs[first + k] / 60:6.2f} | espeak-ng -v {voice} -s {rate} -p {pitch}"
            )
        total = sum(s for _, s in rows)
        print(f"{split}: {n} speakers, {len(rows)} utterances, {total / 60:.1f} min")
        first += n
    with open(os.path.join(root, "SPEAKERS.TXT"), "w") as f:
        f.write(";ID  |SEX| SUBSET          |MINUTES| NAME\n" + "\n".join(table) + "\n")
    size = sum(os.path.getsize(os.path.join(r, x)) for r, _, fs in os.walk(root) for x in fs)
    print(f"wrote {root} ({size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    from ds2_jax import errors

    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
