"""Speaks Spanish sentences with espeak-ng into a Common Voice folder and a NeMo folder.

    python -m ds2_jax.tools.make_own_corpus --out corpora/tiny_es

writes the same utterances twice, as a user of ds2_jax would have them:

    OUT/common_voice/clips/common_voice_es_<n>.mp3     MP3, 48 kHz mono (Common Voice's format)
    OUT/common_voice/{train,dev,test}.tsv              Common Voice's columns; sentences as written
                                                       (capitals, accents, ¿? ¡!)
    OUT/nemo/clips/common_voice_es_<n>.wav             WAV at --nemo_rate (8 kHz G.711 mu-law: telephone
                                                       audio, half the bytes of 16-bit PCM)
    OUT/nemo/{train,dev,test}.json                     NeMo JSON lines: audio_filepath, duration,
                                                       text (lower case, no punctuation, as NeMo
                                                       recipes keep it)

A "speaker" is one espeak-ng Spanish voice + variant at one rate and pitch; dev and test
speakers are held out. The sentences come from `sentence()`, a small grammar over the word
lists below (written for this project). The output is a pure function of the flags (and the
espeak-ng and libsndfile versions). Needs the `espeak-ng` program (apt-get install espeak-ng).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from concurrent import futures

import numpy as np
import soundfile
import soxr

from ds2_jax import text
from ds2_jax.tools.make_corpus import require_espeak

CV_RATE = 48_000
MP3_COMPRESSION = 0.99  # libsndfile's VBR quality knob: ~40 kbit/s, keeps the bundled corpus small
CV_COLUMNS = (
    "client_id",
    "path",
    "sentence_id",
    "sentence",
    "sentence_domain",
    "up_votes",
    "down_votes",
    "age",
    "gender",
    "accents",
    "variant",
    "locale",
    "segment",
)

# --- Text: a small Spanish grammar ---------------------------------------------------
NOUNS = ["gato", "perro", "niño", "caballo", "pájaro", "señor", "campesino", "árbol", "ratón", "león"]
ADJECTIVES = ["rojo", "pequeño", "viejo", "feliz", "marrón", "tranquilo", "grande", "azul"]
VERBS = ["corre", "duerme", "salta", "canta", "camina", "come", "nada", "espera"]
ADVERBS = ["hoy", "otra vez", "despacio", "rápido", "por la noche", "en casa", "también"]
TRANSITIVE = ["ve", "quiere", "encuentra", "toma", "busca"]
OBJECTS = ["la casa", "el río", "el pan", "el agua", "la canción", "el camión", "la montaña"]
NUMBERS = ["dos", "tres", "cuatro", "cinco", "seis", "siete"]
PLURALS = ["gatos", "perros", "niños", "pájaros", "señores", "árboles", "leones"]


def sentence(rng: np.random.Generator) -> str:
    """One short sentence as Common Voice writes them: a capital, accents, ¿? ¡! and a full stop."""
    pick = lambda words: words[rng.integers(len(words))]  # noqa: E731
    form = rng.integers(6)
    if form == 0:
        return f"El {pick(NOUNS)} {pick(ADJECTIVES)} {pick(VERBS)}."
    if form == 1:
        return f"¡El {pick(NOUNS)} {pick(VERBS)} {pick(ADVERBS)}!"
    if form == 2:
        return f"¿El {pick(NOUNS)} {pick(TRANSITIVE)} {pick(OBJECTS)}?"
    if form == 3:
        return f"{pick(NUMBERS).capitalize()} {pick(PLURALS)}, {pick(ADVERBS)}."
    if form == 4:
        return f"¿Dónde está el {pick(NOUNS)}?"
    return f"Señor, el {pick(NOUNS)} {pick(TRANSITIVE)} {pick(OBJECTS)}."


VOICES = ["es", "es-419"]
VARIANTS = ["m1", "m2", "m3", "m4", "m5", "m7", "f1", "f2", "f3", "f4", "f5"]
RATES = (150, 210)
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


def speak(exe: str, words: str, voice: str, rate: int, pitch: int) -> tuple[np.ndarray, int]:
    """espeak-ng -> (<float32>[n] in [-0.5, 0.5], its rate), silence trimmed to 0.05 s each side."""
    wav = subprocess.run(
        [exe, "-v", voice, "-s", str(rate), "-p", str(pitch), "--stdout", words], check=True, capture_output=True
    ).stdout
    audio, rate_in = soundfile.read(io.BytesIO(wav), dtype="float32")
    loud = np.flatnonzero(np.abs(audio) > 0.02 * np.abs(audio).max())
    margin = rate_in // 20
    audio = audio[max(loud[0] - margin, 0) : loud[-1] + margin]
    return 0.5 * audio / np.abs(audio).max(), rate_in


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_string("out", None, "Output dir (common_voice/ and nemo/ go inside).", required=True, flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seeds voices, texts and their order.", flag_values=fv)
    flags.DEFINE_integer("train_speakers", 8, "Speakers of train.", flag_values=fv)
    flags.DEFINE_integer("dev_speakers", 2, "Speakers of dev.", flag_values=fv)
    flags.DEFINE_integer("test_speakers", 2, "Speakers of test (held out).", flag_values=fv)
    flags.DEFINE_integer("utts_per_speaker", 10, "Utterances per speaker.", flag_values=fv)
    flags.DEFINE_integer("nemo_rate", 8_000, "Sample rate of the NeMo folder's WAVs.", flag_values=fv)
    flags.DEFINE_integer("workers", os.cpu_count() or 1, "espeak-ng processes.", flag_values=fv)


def main(argv=None) -> int:
    from ds2_jax import cli

    args, _ = cli.parse_args(argv, define_flags, __doc__)
    exe = require_espeak()
    rng = np.random.default_rng(args.seed)
    counts = {"train": args.train_speakers, "dev": args.dev_speakers, "test": args.test_speakers}
    spk = speakers(rng, sum(counts.values()))
    cv, nemo = os.path.join(args.out, "common_voice"), os.path.join(args.out, "nemo")
    for d in (cv, nemo):
        if os.path.exists(d):
            shutil.rmtree(d)
        os.makedirs(os.path.join(d, "clips"))
    jobs, n = [], 0
    for split, count in counts.items():
        group, spk = spk[:count], spk[count:]
        for voice, rate, pitch in group:
            client = hashlib.sha256(f"{voice}|{rate}|{pitch}".encode()).hexdigest()
            for _ in range(args.utts_per_speaker):
                n += 1
                jobs.append((split, f"common_voice_es_{n}", client, sentence(rng), voice, rate, pitch))

    def run(job):
        return job, speak(exe, job[3], *job[4:])

    cv_rows = {s: [] for s in counts}
    nemo_rows = {s: [] for s in counts}
    with futures.ThreadPoolExecutor(args.workers) as pool:
        for (split, name, client, words, voice, _, _), (audio, rate) in pool.map(run, jobs):
            soundfile.write(
                os.path.join(cv, "clips", name + ".mp3"),
                soxr.resample(audio, rate, CV_RATE),
                CV_RATE,
                format="MP3",
                bitrate_mode="VARIABLE",
                compression_level=MP3_COMPRESSION,
            )
            low = soxr.resample(audio, rate, args.nemo_rate)
            soundfile.write(os.path.join(nemo, "clips", name + ".wav"), low, args.nemo_rate, subtype="ULAW")
            gender = "female_feminine" if "+f" in voice else "male_masculine"
            cv_rows[split].append(
                [
                    client,
                    name + ".mp3",
                    hashlib.sha256(words.encode()).hexdigest(),
                    words,
                    "",
                    "2",
                    "0",
                    "",
                    gender,
                    "",
                    "",
                    "es",
                    "",
                ]
            )
            nemo_rows[split].append(
                {
                    "audio_filepath": f"clips/{name}.wav",
                    "duration": round(len(low) / args.nemo_rate, 3),
                    "text": text.normalize(words),
                }
            )
    for split in counts:
        with open(os.path.join(cv, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("\t".join(CV_COLUMNS) + "\n" + "".join("\t".join(r) + "\n" for r in cv_rows[split]))
        with open(os.path.join(nemo, f"{split}.json"), "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in nemo_rows[split]))
        print(f"{split}: {counts[split]} speakers, {len(cv_rows[split])} utterances")
    for d in (cv, nemo):
        size = sum(os.path.getsize(os.path.join(r, x)) for r, _, fs in os.walk(d) for x in fs)
        print(f"wrote {d} ({size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    from ds2_jax import errors

    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
