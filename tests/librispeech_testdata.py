"""Small LibriSpeech-layout corpora written into a test's tmp dir (tones, not speech)."""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import soundfile

RATE = 16_000


def tone(num_samples: int, freq: float = 440.0, rate: int = RATE, channels: int = 1) -> np.ndarray:
    t = np.arange(num_samples) / rate
    x = (3000 * np.sin(2 * np.pi * freq * t)).astype(np.int16)
    return np.stack([x] * channels, axis=1) if channels > 1 else x


def flac_bytes(audio: np.ndarray, rate: int = RATE, fmt: str = "FLAC") -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, audio, rate, format=fmt, subtype="PCM_16")
    return buf.getvalue()


def write_chapter(split_dir: str, speaker: int, chapter: int, files: dict[str, bytes], trans: bytes | None):
    """files: {utterance number or file name: bytes}; trans: raw .trans.txt bytes or None."""
    d = os.path.join(split_dir, str(speaker), str(chapter))
    os.makedirs(d, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    if trans is not None:
        with open(os.path.join(d, f"{speaker}-{chapter}.trans.txt"), "wb") as f:
            f.write(trans)


def write_bad_inputs(split_dir: str) -> dict[str, int]:
    """One chapter per kind of bad input next to good ones; returns the expected report.

    Speaker 1 / chapter 10 holds the good utterances and most bad ones; its .trans.txt
    has a byte-order mark, CRLF line ends and mixed case, all of which normalize away.
    """
    good = {f"1-10-{i:04d}.flac": flac_bytes(tone(RATE + 800 * i)) for i in range(4)}
    bad = {
        "1-10-0004.flac": b"this is not a flac file",  # corrupt_audio
        "1-10-0005.flac": b"",  # empty_audio (0 bytes)
        "1-10-0006.flac": flac_bytes(np.zeros(0, np.int16), fmt="WAV"),  # empty_audio (0 frames)
        "1-10-0007.flac": flac_bytes(tone(8000, rate=8000), rate=8000),  # wrong_sample_rate
        "1-10-0008.flac": flac_bytes(tone(RATE, channels=2)),  # not_mono
        "1-10-0009.flac": flac_bytes(tone(RATE)),  # missing_transcript (no line)
        "1-10-0010.flac": flac_bytes(tone(RATE)),  # empty_transcript
        "1-10-0011.flac": flac_bytes(tone(RATE)),  # unknown_chars
        "1-10-0012.flac": flac_bytes(tone(3200)),  # ctc_infeasible: 0.2 s, 40 letters
    }
    lines = [
        "1-10-0000 HELLO WORLD",
        "1-10-0001 it's Mixed Case",
        "1-10-0002 GOOD   MORNING",
        "1-10-0003 A",
        "1-10-0004 CORRUPT",
        "1-10-0005 EMPTY",
        "1-10-0006 EMPTY TOO",
        "1-10-0007 EIGHT KILOHERTZ",
        "1-10-0008 STEREO",
        "1-10-0010",
        "1-10-0011 CAFÉ 42",
        "1-10-0012 " + "ABCDEFGHIJ" * 4,
        "1-10-0099 A LINE WITHOUT AUDIO",
    ]
    trans = ("\ufeff" + "\r\n".join(lines) + "\r\n").encode("utf-8")
    write_chapter(split_dir, 1, 10, {**good, **bad}, trans)
    # A chapter without any .trans.txt: both utterances are missing_transcript.
    write_chapter(split_dir, 2, 20, {f"2-20-{i:04d}.flac": flac_bytes(tone(RATE)) for i in range(2)}, None)
    return {
        "kept": 4,
        "corrupt_audio": 1,
        "empty_audio": 2,
        "wrong_sample_rate": 1,
        "not_mono": 1,
        "missing_transcript": 3,
        "empty_transcript": 1,
        "unknown_chars": 1,
        "ctc_infeasible": 1,
        "duplicate_id": 0,  # test_datasets.py::test_a_duplicate_utterance_id_*
        "transcripts_without_audio": 1,
    }


EXPECTED_GOOD_TEXT = {
    "1-10-0000": "hello world",
    "1-10-0001": "it's mixed case",
    "1-10-0002": "good morning",
    "1-10-0003": "a",
}


def tar_split(split_dir: str, archive: str, flacs_first: bool = True) -> None:
    """Packs split_dir as LibriSpeech/<split>/... into a .tar.gz (flacs before transcripts)."""
    split = os.path.basename(split_dir.rstrip("/"))
    paths = []
    for root, _, files in sorted(os.walk(split_dir)):
        for f in sorted(files, key=lambda f: (f.endswith(".trans.txt") != (not flacs_first), f)):
            paths.append(os.path.join(root, f))
    with tarfile.open(archive, "w:gz") as tar:
        for p in paths:
            tar.add(p, arcname=os.path.join("LibriSpeech", split, os.path.relpath(p, split_dir)))


def write_durations_corpus(manual_dir: str, split: str, seconds: list[float], first_speaker: int = 1) -> list[dict]:
    """One utterance per entry of `seconds` (distinct lengths), 8 per chapter; returns them.

    Transcripts are letters, one per 0.1 s (always CTC-feasible), so labels grow with audio.
    """
    utts = []
    split_dir = os.path.join(manual_dir, "LibriSpeech", split)
    letters = "abcdefghijklmnopqrstuvwxyz"
    for k in range(0, len(seconds), 8):
        speaker, chapter = first_speaker + k // 8, 100 + k // 8
        files, lines = {}, []
        for j, s in enumerate(seconds[k : k + 8]):
            n = int(s * RATE) + k + j  # + index: every utterance has its own length
            words = " ".join(letters[(k + j + i) % 26] * 3 for i in range(max(1, int(s * 10) // 4)))
            utt_id = f"{speaker}-{chapter}-{j:04d}"
            files[utt_id + ".flac"] = flac_bytes(tone(n, freq=200 + 10 * j))
            lines.append(f"{utt_id} {words.upper()}")
            utts.append({"id": utt_id, "num_samples": n, "text": words})
        write_chapter(split_dir, speaker, chapter, files, ("\n".join(lines) + "\n").encode())
    return utts
