"""Every ds2_jax setting: frozen, typed dataclasses, one per config section, with their
defaults, their meaning and every check on their values.

The user writes ml_collections config files (configs/*.py start from
`configs/default.py`, whose ConfigDict is `to_config_dict(Settings())`) and overrides
keys with absl flags (`--config.per_device_batch_size=32`). Each entry point
(train.train_and_evaluate, evaluation.evaluate_splits, transcribe, demo, the benchmarks)
turns that ConfigDict into a `Settings` once with `from_config_dict`, which rejects an
unknown key, a wrong type or a bad value with a ValueError naming the key and what is
allowed. Below the entry points functions take the Settings or one of its sections (typed),
never a ConfigDict, and nothing builds settings again (a test holds it): the parts a
narrower argument needs are properties (`Features.spectrogram`, `Features.augment`).
workdir/config.json is `to_dict(settings)`.

To add a setting: add a field (type, default, help, and its Role where its section's ROLE is
not what a resume and an evaluation should do with it) to its section below, and a check
in the section's `__post_init__` if some values are wrong; configs/default.py and
config.json pick it up, and an old config.json without it loads with the default.

This module imports no jax (grain workers unpickle Settings; a test holds it): the names of
the implementations live here, and the modules that implement them check that they agree.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import typing
from typing import Any, ClassVar

from ds2_jax import faults, geometry, text

DATASETS = ("synthetic", "librispeech_local", "librispeech", "manifest")
LIBRISPEECH_DATASETS = ("librispeech_local", "librispeech")  # stored at 16 kHz, LibriSpeech's alphabet
STEREO = ("downmix", "skip")  # dataset.stereo
SAMPLE_RATES = (8_000, 48_000)  # features.sample_rate's range
SCHEDULES = ("constant", "cosine", "exponential")
PARALLELISMS = ("pmap", "jit")
INIT_OUTPUTS = ("auto", "by_symbol", "fresh")  # init_output: the fine-tune's output layer (finetune.merge)
DTYPES = ("float32", "bfloat16")
CONV_IMPLS = ("direct", "space_to_depth")
LM_BEAM_WIDTH = 32  # decoding.beam_width where an LM is given without a width (transcribe, tune_lm)
# The implementations' names (rnn.reference.CELLS, rnn.recurrence.IMPLS and ds2_jax.ctc hold
# them; tests check that they agree) and the cells the kernels and scan_vjp implement.
RNN_CELLS = ("simple", "gru", "lstm")
RNN_IMPLS = ("auto", "scan", "scan_vjp", "pallas", "mosaic")
CTC_IMPLS = ("auto", "optax", "pallas")
KERNEL_CELLS = ("simple",)
MAX_BUCKETS = 8  # each duration bucket is one compiled shape
KILL_POINTS = ("step", "checkpoint", "eval")


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric setting takes: from `low` to `high` (each end included unless
    `open_low` / `open_high`), finite, or one of `also`. NaN is never in a range: each
    comparison is written so that NaN fails it (`not low <= v`, never `v < low`)."""

    low: float = -math.inf
    high: float = math.inf
    open_low: bool = False
    open_high: bool = False
    also: tuple = ()  # values allowed besides the range, e.g. -inf meaning "none"
    why: str = ""  # what a value outside means, for the message

    def holds(self, value) -> bool:
        if any(value == a for a in self.also):
            return True
        if not math.isfinite(value):
            return False
        above = self.low < value if self.open_low else self.low <= value
        below = value < self.high if self.open_high else value <= self.high
        return above and below

    def text(self) -> str:
        if self.low == self.high:
            text = f"{self.low}"
        elif self.low == -math.inf and self.high == math.inf:
            text = "finite"
        elif self.high == math.inf:
            text = f"{'>' if self.open_low else '>='} {self.low}"
        elif self.low == -math.inf:
            text = f"{'<' if self.open_high else '<='} {self.high}"
        elif isinstance(self.low, int) and isinstance(self.high, int) and not (self.open_low or self.open_high):
            text = f"{self.low}..{self.high}"
        else:
            text = f"in {'(' if self.open_low else '['}{self.low}, {self.high}{')' if self.open_high else ']'}"
        return text + "".join(f" or {a}" for a in self.also) + (f" ({self.why})" if self.why else "")


def _above(low, why: str = "") -> Range:
    return Range(low, open_low=True, why=why)


FRACTION = Range(0.0, 1.0)
DECAY = Range(0.0, 1.0, open_high=True)  # an exponential moving average's decay: 1 never moves

# Every numeric setting's range, by dotted key: the one table of them (`_check_ranges` runs it
# in every section's __post_init__; a numeric field without a row is an error there, so a new
# setting cannot skip it). Checks that relate two settings stay in the sections.
RANGES: dict[str, Range] = {
    "seed": Range(0),
    "num_train_steps": Range(1),
    "per_device_batch_size": Range(1),
    "num_devices": Range(0),
    "log_every_steps": Range(1),
    "eval_every_steps": Range(0),
    "checkpoint_every_steps": Range(1),
    "keep_checkpoints": Range(1),
    "keep_best_checkpoints": Range(0, why="0 = off"),
    "prefetch_batches": Range(0),
    "input_wait_warn_fraction": FRACTION,
    "step_timeout_s": Range(0.0, why="0 = off"),
    "faults.hang_at_step": Range(-1, why="-1 = off"),
    "faults.kill_input_worker_at_step": Range(-1, why="-1 = off"),
    "dataset.min_duration_s": Range(0.0),
    "dataset.max_duration_s": _above(0.0),
    "dataset.num_buckets": Range(1, MAX_BUCKETS, why="each bucket is a compiled shape"),
    "dataset.feature_stats_utterances": Range(1),
    "dataset.num_workers": Range(-1, why="-1 (auto), 0 (inline) or a count"),
    "dataset.build_workers": Range(-1, why="-1 (the cores), 0 (inline) or a count"),
    "dataset.alphabet_min_count": Range(1, why="1 = every character of the train splits"),
    "dataset.worker_buffer_size": Range(1),
    "dataset.synthetic_min_duration_s": _above(0.0),
    "dataset.synthetic_max_duration_s": _above(0.0),
    "dataset.synthetic_chars_per_second": _above(0.0),
    "dataset.synthetic_num_utterances": Range(1),
    "dataset.synthetic_pool_size": Range(1),
    "features.sample_rate": Range(
        *SAMPLE_RATES, why="manifest data is resampled to it at build; LibriSpeech is 16 kHz"
    ),
    "features.window_ms": _above(0.0),
    "features.hop_ms": _above(0.0),
    "features.eps": _above(0.0, "log(power + eps) of a silent frame"),
    "features.freq_masks": Range(0),
    "features.freq_mask_width": Range(0),
    "features.time_masks": Range(0),
    "features.time_mask_max_fraction": FRACTION,
    "waveform.noise_prob": FRACTION,
    "waveform.noise_snr_db_min": Range(-20.0, 60.0, why="dB: below -20 the speech is gone, above 60 no noise"),
    "waveform.noise_snr_db_max": Range(-20.0, 60.0, why="dB: below -20 the speech is gone, above 60 no noise"),
    "waveform.speed_prob": FRACTION,
    "waveform.speed_min": Range(0.5, 2.0, why="a speed factor: beyond half or twice the speed it is no speech"),
    "waveform.speed_max": Range(0.5, 2.0, why="a speed factor: beyond half or twice the speed it is no speech"),
    "waveform.gain_prob": FRACTION,
    "waveform.gain_db_min": Range(-40.0, 40.0, why="dB: beyond +-40 an utterance is silence or clipped through"),
    "waveform.gain_db_max": Range(-40.0, 40.0, why="dB: beyond +-40 an utterance is silence or clipped through"),
    "waveform.rir_prob": FRACTION,
    "model.num_conv_layers": Range(1, geometry.MAX_CONV_LAYERS),
    "model.conv_channels": Range(1),
    "model.num_rnn_layers": Range(1),
    "model.rnn_size": Range(1),
    "model.row_conv_context": Range(0),
    "model.batch_norm_momentum": DECAY,
    "model.batch_norm_epsilon": _above(0.0, "a channel of zero variance divides by it"),
    "model.scan_unroll": Range(1),
    "optimizer.learning_rate": _above(0.0),
    "optimizer.b1": DECAY,
    "optimizer.b2": Range(0.0, 1.0, open_high=True, why="1 makes Adam's bias correction divide by 0"),
    "optimizer.eps": _above(0.0, "0 divides by 0 where a gradient is 0"),
    "optimizer.clip_global_norm": _above(0.0, "the largest gradient norm; <= 0 reverses or zeroes every step"),
    "optimizer.warmup_steps": Range(0),
    "optimizer.decay_rate": Range(0.0, 1.0, open_low=True, why="'exponential': the factor per decay_steps"),
    "optimizer.decay_steps": Range(0),
    "optimizer.max_consecutive_skips": Range(1),
    "optimizer.accumulate_steps": Range(1, 1024, why="micro-batches per update; 1 = off"),
    "optimizer.ema_decay": Range(0.0, 1.0, open_high=True, why="0 = off; 1 would never move"),
    "eval.max_utterances": Range(0),
    "eval.num_examples_to_print": Range(0),
    "decoding.beam_width": Range(0, why="0 = greedy only"),
    "decoding.alpha": Range(0.0),
    "decoding.beta": Range(),
    "decoding.beam_prune_logp": Range(high=0.0, open_high=True, why="a log-probability"),
    "decoding.token_min_logp": Range(high=0.0, open_high=True, why="a log-probability"),
    "decoding.unk_score_offset": Range(also=(-math.inf,), why="-inf = no out-of-lexicon words"),
}

NUMERIC = ("int", "float")  # the field types RANGES covers (annotations are strings here)


def _check_ranges(obj) -> None:
    """Refuses a numeric field of a section (or Settings) outside its RANGES row: NaN and inf too."""
    prefix = f"{obj.KEY}." if hasattr(obj, "KEY") else ""
    for f in dataclasses.fields(obj):
        if f.type not in NUMERIC:
            continue
        key, value = prefix + f.name, getattr(obj, f.name)
        if key not in RANGES:
            if type(obj).__module__ != __name__:  # a subclass's own field (model.ModelConfig.num_bins)
                continue
            raise TypeError(f"settings.RANGES has no row for the numeric setting {key}: add one")
        if not RANGES[key].holds(value):
            finite = "" if isinstance(value, int) or math.isfinite(value) else "a finite number "
            raise ValueError(f"{key}={value!r}: must be {finite}{RANGES[key].text()}")


def _no_split_twice(key: str, spec: str) -> None:
    """A ValueError naming `key` when its '+'-separated splits name one twice (as the builders spell
    split names: 'dev-clean' and 'dev_clean' are one), which would read that split twice."""
    names = [re.sub(r"[^A-Za-z0-9_]", "_", s.strip()) for s in spec.split("+") if s.strip()]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{key}={spec!r} names split(s) {', '.join(twice)} twice: name each once")


def _one_of(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: expected one of {list(allowed)}")


@dataclasses.dataclass(frozen=True)
class Role:
    """What a setting is to the runs of one workdir (workdir_config reads it):

    resume: 'fixed' (the checkpoints' parameter shapes or the meaning of their inputs: a resume
      that changes it is refused), 'recorded' (what is trained: a resume's change is logged and
      kept in config_changes.jsonl) or 'ignored' (how a run is driven or watched: never a change);
    eval: 'trained' (an evaluation takes the workdir's config.json value: the model is the one
      trained) or 'given' (an evaluation sets it itself, from its --config);
    set_by_training: training derives it from its data (model.alphabet), so a --config that leaves
      it unset ('') differs in nothing.

    A section's ROLE is its fields' role, unless a field names its own (`setting(..., role=)`)."""

    resume: str
    eval: str
    set_by_training: bool = False

    def __post_init__(self):
        _one_of("Role.resume", self.resume, ("fixed", "recorded", "ignored"))
        _one_of("Role.eval", self.eval, ("trained", "given"))


TRAINS = Role("recorded", "trained")  # what the model learns from and how
FIXED = Role("fixed", "trained")  # the checkpoints' shapes and the meaning of their inputs
DRIVES = Role("ignored", "trained")  # how a training run is driven or watched
EVAL_DRIVES = Role("ignored", "given")  # how any run is driven; an evaluation sets its own
EVAL_READS = Role("recorded", "given")  # the data a run reads and its batches; an evaluation sets its own
SET_BY_TRAINING = Role("fixed", "trained", set_by_training=True)  # from the data (model.alphabet)


def setting(default, help: str, role: Role | None = None):  # noqa: A002 - `help` is the metadata key here
    """A field of a settings section: its default, its help text (--print_config's meaning) and
    its Role (None: its section's ROLE)."""
    return dataclasses.field(default=default, metadata={"help": help, **({"role": role} if role else {})})


# ----------------------------------------------------------------------------- sections


@dataclasses.dataclass(frozen=True)
class Faults:
    """Fault injection (tests and drills; all off by default)."""

    KEY: ClassVar[str] = "faults"
    ROLE: ClassVar[Role] = DRIVES

    nan_at_steps: str = setting("", 'e.g. "5,7-9": these steps get a NaN loss and gradient.')
    kill_at: str = setting("", '"step:N", "checkpoint:N" or "eval:N": SIGKILL there.')
    hang_at_step: int = setting(-1, "Block forever before this step (watchdog drill).")
    kill_input_worker_at_step: int = setting(-1, "The input worker making this step's batch dies.")

    def __post_init__(self):
        _check_ranges(self)
        try:
            faults.parse_steps(self.nan_at_steps)
        except ValueError:
            raise ValueError(f"faults.nan_at_steps={self.nan_at_steps!r}: expected steps like '5,7-9'") from None
        if self.kill_at:
            point, _, step = self.kill_at.partition(":")
            if point not in KILL_POINTS or not step.isdigit():
                raise ValueError(
                    f"faults.kill_at={self.kill_at!r}: expected '' or <point>:<step> with point one of "
                    f"{list(KILL_POINTS)}, e.g. 'step:5'"
                )


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Where utterances come from and which of them are used."""

    KEY: ClassVar[str] = "dataset"
    ROLE: ClassVar[Role] = EVAL_READS

    name: str = setting(
        "synthetic",
        "'synthetic' (random audio and text, compute only), 'librispeech_local' (the project's tfds "
        "builder over a LibriSpeech-layout manual_dir), 'librispeech' (tfds's official, already prepared "
        "build) or 'manifest' (your own data: every <split>.tsv/.csv/.jsonl/.json of manual_dir is a "
        "split; ds2_jax/datasets/manifest.py).",
    )
    manual_dir: str = setting(
        "",
        "librispeech_local: LibriSpeech tree or *.tar.gz archives; manifest: the manifests' folder.",
    )
    data_dir: str = setting("", "tfds data_dir; '' = tfds default (~/tensorflow_datasets).")
    train_splits: str = setting("train-clean-100+train-clean-360+train-other-500", "Training splits, '+'-separated.")
    eval_split: str = setting("dev-clean", "Split evaluated during training.")
    min_duration_s: float = setting(0.0, "Utterances shorter than this are skipped.")
    max_duration_s: float = setting(27.0, "Utterances longer than this are skipped.")
    num_buckets: int = setting(4, "Duration buckets = compiled shapes (<= 8).")
    sortagrad: bool = setting(True, "First epoch in ascending duration (DS2 SortaGrad).")
    feature_stats_utterances: int = setting(2000, "Sample size for per-bin mean/std.")
    num_workers: int = setting(
        -1,
        "Worker processes (grain) that read, decode and pad training batches off the step's critical "
        "path; 0 = inline in the training process; -1 = from the cores present "
        "(ds2_jax.pipeline.loader.resolve_num_workers: cores - 2, at most 16; 0 for synthetic data).",
        role=EVAL_DRIVES,
    )
    worker_buffer_size: int = setting(2, "Batches each worker keeps ready.", role=EVAL_DRIVES)
    # Synthetic source: utterances uniform in [min_duration_s, max_duration_s] of the
    # synthetic_* bounds, random int16 noise, random transcripts of chars_per_second.
    synthetic_min_duration_s: float = setting(
        6.0,
        "Synthetic source: utterances uniform in [min_duration_s, max_duration_s] of the synthetic_* "
        "bounds, random int16 noise, random transcripts of chars_per_second.",
    )
    synthetic_max_duration_s: float = setting(
        8.0,
        "Synthetic source: utterances uniform in [min_duration_s, max_duration_s] of the synthetic_* "
        "bounds, random int16 noise, random transcripts of chars_per_second.",
    )
    synthetic_chars_per_second: float = setting(
        14.0,
        "Synthetic source: utterances uniform in [min_duration_s, max_duration_s] of the synthetic_* "
        "bounds, random int16 noise, random transcripts of chars_per_second.",
    )
    synthetic_num_utterances: int = setting(15_552, 'One "epoch" (the seed\'s 972 x 16).')
    synthetic_pool_size: int = setting(512, "Distinct utterances; index i repeats i % this.")
    vocabulary: str = setting(
        "",
        "Manifest datasets (name='manifest'), read at build time; the prepared data records them. The "
        "alphabet: a vocabulary file (one symbol a line, the space as '<space>'); '' = derived from the "
        "transcripts of the train_splits at build time.",
    )
    alphabet_min_count: int = setting(
        2,
        "A derived alphabet keeps the characters seen at least this often in the train splits; a rarer "
        "one (a typo, a stray foreign letter: a label too rare to learn) is left out and its utterances "
        "skipped, both counted in the build report. 1 keeps every character.",
    )
    lower_case: bool = setting(True, "Transcripts lower-cased (text.normalize).")
    strip_punctuation: bool = setting(True, "Punctuation and symbols removed, apostrophes kept (text.normalize).")
    path_column: str = setting(
        "",
        "CSV/TSV/JSON column of the audio path; '' = a known name (path, audio_filepath, ...).",
    )
    text_column: str = setting("", "Column of the transcript; '' = a known name (sentence, text, transcript, ...).")
    stereo: str = setting("downmix", "Audio of several channels: 'downmix' (their mean) or 'skip' (counted).")
    manifest_splits: str = setting(
        "",
        "Manifests built, '+'-separated; '' = every manifest of manual_dir but Common Voice's supersets "
        "and side files (validated, invalidated, other, reported, ...).",
    )
    build_workers: int = setting(-1, "Processes decoding audio at build; -1 = the cores present, 0 = inline.")

    def __post_init__(self):
        _check_ranges(self)
        _one_of("dataset.name", self.name, DATASETS)
        _one_of("dataset.stereo", self.stereo, STEREO)
        for key in ("train_splits", "manifest_splits"):
            _no_split_twice(f"dataset.{key}", getattr(self, key))
        if self.build_workers < -1:
            raise ValueError(
                f"dataset.build_workers={self.build_workers}: must be -1 (the cores), 0 (inline) or a count"
            )
        if self.name == "manifest" and not (self.manual_dir or self.data_dir):
            raise ValueError(
                "dataset.name='manifest' needs dataset.manual_dir (the folder of <split>.tsv/.csv/"
                ".jsonl/.json manifests)"
            )
        if self.vocabulary and self.name != "manifest":
            raise ValueError(
                f"dataset.vocabulary={self.vocabulary!r} is read by dataset.name='manifest' builds only "
                f"(dataset.name={self.name!r} has its own alphabet)"
            )
        if not 0 <= self.min_duration_s < self.max_duration_s:
            raise ValueError(
                f"dataset.min_duration_s={self.min_duration_s} must be >= 0 and < "
                f"dataset.max_duration_s={self.max_duration_s}"
            )
        if self.synthetic_min_duration_s > self.synthetic_max_duration_s:
            raise ValueError(
                f"dataset.synthetic_min_duration_s={self.synthetic_min_duration_s} must be <= "
                f"dataset.synthetic_max_duration_s={self.synthetic_max_duration_s}"
            )
        if self.name == "librispeech_local" and not (self.manual_dir or self.data_dir):
            raise ValueError(
                "dataset.name='librispeech_local' needs dataset.manual_dir (the LibriSpeech tree or archives)"
            )


@dataclasses.dataclass(frozen=True)
class Spectrogram:
    """The log linear spectrogram (ds2_jax.features): Hann windows of window_ms every hop_ms."""

    KEY: ClassVar[str] = "features"

    # FIXED: the checkpoints' feature statistics are per bin of this spectrogram.
    sample_rate: int = setting(
        16_000, "Hz; manifest data is resampled to it at build; LibriSpeech is 16 kHz.", role=FIXED
    )
    window_ms: float = setting(20.0, "Hann window -> 161 linear bins at 16 kHz.", role=FIXED)
    hop_ms: float = setting(10.0, "One frame every hop_ms.", role=FIXED)
    eps: float = setting(1e-14, "log(power + eps).", role=FIXED)

    @property
    def window(self) -> int:
        return int(round(self.sample_rate * self.window_ms / 1000))

    @property
    def hop(self) -> int:
        return int(round(self.sample_rate * self.hop_ms / 1000))

    @property
    def num_bins(self) -> int:
        return self.window // 2 + 1


@dataclasses.dataclass(frozen=True)
class SpecAugment:
    """SpecAugment masks (ds2_jax.features.spec_augment); 0 masks = off."""

    # SpecAugment masks, applied to training batches only (0 masks = off, as in the seed).
    freq_masks: int = setting(
        0, "SpecAugment masks, applied to training batches only (0 masks = off, as in the seed).", role=TRAINS
    )
    freq_mask_width: int = setting(
        27,
        "SpecAugment masks, applied to training batches only (0 masks = off, as in the seed).",
        role=TRAINS,
    )
    time_masks: int = setting(
        0, "SpecAugment masks, applied to training batches only (0 masks = off, as in the seed).", role=TRAINS
    )
    time_mask_max_fraction: float = setting(
        0.05,
        "SpecAugment masks, applied to training batches only (0 masks = off, as in the seed).",
        role=TRAINS,
    )

    @property
    def enabled(self) -> bool:
        return bool(self.freq_masks or self.time_masks)


def _part(cls, section):
    """The `cls` (a base class of `section`'s) holding `section`'s values of its fields."""
    return cls(**{f.name: getattr(section, f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class Features(SpecAugment, Spectrogram):
    """Features, computed on device inside the step: the spectrogram, then SpecAugment
    (config.features holds both sets of fields, the spectrogram's first)."""

    def __post_init__(self):
        _check_ranges(self)
        if self.hop < 1 or self.window < 1:
            raise ValueError(
                f"features.window_ms={self.window_ms} and hop_ms={self.hop_ms} must each be at least one "
                f"sample ({1000 / self.sample_rate} ms)"
            )
        if self.window % self.hop:  # features._frames frames the audio in hops: refused there at the first step
            raise ValueError(
                f"features.window_ms={self.window_ms} must be a multiple of features.hop_ms={self.hop_ms} "
                f"(a window of {self.window} samples in hops of {self.hop})"
            )

    @property
    def spectrogram(self) -> Spectrogram:
        """The spectrogram's fields alone (the step's and the data side's static argument)."""
        return _part(Spectrogram, self)

    @property
    def augment(self) -> SpecAugment:
        """The SpecAugment fields alone (the train step's static argument)."""
        return _part(SpecAugment, self)


@dataclasses.dataclass(frozen=True)
class Waveform:
    """Waveform augmentation of training utterances (ds2_jax.pipeline.augment: in the input workers,
    before padding; a pure function of (seed, step, row)); every part off by default."""

    KEY: ClassVar[str] = "waveform"
    ROLE: ClassVar[Role] = TRAINS

    noise_dir: str = setting(
        "",
        "Additive noise at a random SNR: a folder of noise recordings (searched recursively; any format "
        "and rate libsndfile reads) or a text file listing them, one path a line.",
    )
    noise_prob: float = setting(0.0, "Share of utterances that get noise.")
    noise_snr_db_min: float = setting(0.0, "SNR drawn uniform in [min, max] dB.")
    noise_snr_db_max: float = setting(15.0, "Highest SNR (dB) of added noise.")
    speed_prob: float = setting(
        0.0,
        "Speed perturbation (tempo and pitch, as Kaldi/icefall's 0.9/1.0/1.1): resampled by a factor "
        "uniform in [speed_min, speed_max]; buckets are padded for speed_min.",
    )
    speed_min: float = setting(0.9, "Slowest speed factor (0.5..2).")
    speed_max: float = setting(1.1, "Fastest speed factor.")
    gain_prob: float = setting(0.0, "Share of utterances scaled by a gain uniform in [gain_db_min, gain_db_max].")
    gain_db_min: float = setting(-6.0, "Lowest gain (dB).")
    gain_db_max: float = setting(6.0, "Highest gain (dB).")
    rir_dir: str = setting("", "Reverberation: convolution with a room impulse response from this folder or list.")
    rir_prob: float = setting(0.0, "Share of utterances reverberated.")

    def __post_init__(self):
        _check_ranges(self)  # shares in [0, 1], speeds > 0, all finite
        if not 0 < self.speed_min <= self.speed_max:
            raise ValueError(
                f"waveform.speed_min={self.speed_min}, speed_max={self.speed_max}: the speed range must "
                "be positive, min <= max (e.g. 0.9 and 1.1)"
            )
        for low, high in (("noise_snr_db_min", "noise_snr_db_max"), ("gain_db_min", "gain_db_max")):
            if getattr(self, low) > getattr(self, high):
                raise ValueError(
                    f"waveform.{low}={getattr(self, low)} must be <= waveform.{high}={getattr(self, high)}"
                )
        for prob, folder in (("noise_prob", "noise_dir"), ("rir_prob", "rir_dir")):
            if getattr(self, prob) > 0 and not getattr(self, folder):
                raise ValueError(f"waveform.{prob}={getattr(self, prob)} needs waveform.{folder} (recordings to use)")

    @property
    def enabled(self) -> bool:
        return any((self.noise_prob, self.speed_prob, self.gain_prob, self.rir_prob))

    @property
    def stretch(self) -> float:
        """The most an utterance's length grows (1 / speed_min with speed perturbation on)."""
        return 1.0 / self.speed_min if self.speed_prob > 0 else 1.0


@dataclasses.dataclass(frozen=True)
class Model:
    """The architecture (ds2_jax.model.ModelConfig adds the input and output widths)."""

    KEY: ClassVar[str] = "model"
    ROLE: ClassVar[Role] = TRAINS

    num_conv_layers: int = setting(2, "Conv layers before the RNNs: 1..3 (the seed: 2).", role=FIXED)
    conv_channels: int = setting(32, "Output channels of each conv layer.", role=FIXED)
    num_rnn_layers: int = setting(3, "Recurrent layers after the convs.", role=FIXED)
    rnn_size: int = setting(2048, "Hidden units per direction.", role=FIXED)
    rnn_cell: str = setting("simple", "'simple' (clipped ReLU), 'gru' or 'lstm'.", role=FIXED)
    share_rnn_weights: bool = setting(True, "One input projection + BN for both directions.", role=FIXED)
    bidirectional: bool = setting(True, "False: forward RNN + lookahead row convolution.", role=FIXED)
    row_conv_context: int = setting(20, "Future frames seen by the row convolution.", role=FIXED)
    dtype: str = setting("float32", "Compute dtype: 'float32' or 'bfloat16' (params stay f32).")
    sync_batch_norm: bool = setting(True, "Batch-norm statistics over all devices.")
    batch_norm_momentum: float = setting(0.99, "Decay of the batch-norm running statistics.")
    batch_norm_epsilon: float = setting(1e-5, "Added to the batch-norm variance.")
    conv_impl: str = setting(
        "space_to_depth",
        "Strided convs: 'direct' (lax.conv_general_dilated with strides, the reference) or "
        "'space_to_depth' (each stride patch folded into channels, then a stride-1 conv: the same sums, "
        "and tensor-core kernels for conv 1's single input channel; figures in BUILD_NOTES.md).",
    )
    rnn_impl: str = setting(
        "auto",
        "Recurrence: 'scan' (lax.scan + autodiff, the reference), 'scan_vjp' (simple cell: hand-written "
        "backward, weight gradient as one GEMM), 'pallas' (simple cell: one persistent Pallas kernel per "
        "layer and direction pair, GPU; interpreted elsewhere), 'mosaic' (simple cell, bfloat16, Hopper "
        "GPUs: Mosaic GPU kernels on cluster pairs, up to 64 rows a call at width 2048) or 'auto' (on "
        "Hopper, bfloat16, <= 64 rows per device: mosaic; other GPUs, <= 16 rows: pallas when it fits "
        "shared memory; otherwise scan_vjp; scan for GRU/LSTM).",
    )
    scan_unroll: int = setting(1, "lax.scan unroll factor.")
    alphabet: str = setting(
        "",
        "The characters the model emits (its output layer: one more, the blank); '' = LibriSpeech's 28 "
        "(text.LIBRISPEECH). Training sets it from the prepared data; a resume or eval on data of another"
        " alphabet is refused.",
        role=SET_BY_TRAINING,
    )

    def __post_init__(self):
        _check_ranges(self)
        geometry.conv_specs(self.num_conv_layers)  # validates the range
        if self.alphabet:
            try:
                text.Alphabet(self.alphabet)
            except ValueError as e:
                raise ValueError(f"model.alphabet: {e}") from None
        _one_of("model.rnn_cell", self.rnn_cell, sorted(RNN_CELLS))
        _one_of("model.dtype", self.dtype, DTYPES)
        _one_of("model.conv_impl", self.conv_impl, CONV_IMPLS)
        _one_of("model.rnn_impl", self.rnn_impl, sorted(RNN_IMPLS))
        # ('auto' picks a kernel that fits the cell and dtype where the recurrence runs.)
        if self.rnn_impl in ("scan_vjp", "pallas", "mosaic") and self.rnn_cell not in KERNEL_CELLS:
            raise ValueError(f"model.rnn_impl={self.rnn_impl!r} supports rnn_cell='simple' only; use 'auto' or 'scan'")
        if self.rnn_impl == "mosaic" and self.dtype != "bfloat16":
            raise ValueError(
                f"model.rnn_impl='mosaic' computes in bfloat16; set model.dtype='bfloat16' (got "
                f"{self.dtype!r}) or use 'auto'"
            )


@dataclasses.dataclass(frozen=True)
class Loss:
    KEY: ClassVar[str] = "loss"
    ROLE: ClassVar[Role] = TRAINS

    norm_by_times: bool = setting(False, "Divide each utterance's CTC loss by its frames.")
    ctc_impl: str = setting(
        "auto",
        "CTC: 'optax' (lax.scan), 'pallas' (forward-backward kernels, GPU; interpreted elsewhere) or "
        "'auto' (pallas on GPUs, optax elsewhere; with either parallelism).",
    )

    def __post_init__(self):
        _one_of("loss.ctc_impl", self.ctc_impl, CTC_IMPLS)


@dataclasses.dataclass(frozen=True)
class Optimizer:
    KEY: ClassVar[str] = "optimizer"
    ROLE: ClassVar[Role] = TRAINS

    learning_rate: float = setting(5e-4, "Paddle DS2's default Adam rate.")
    b1: float = setting(0.9, "Adam's first-moment decay.")
    b2: float = setting(0.999, "Adam's second-moment decay.")
    eps: float = setting(1e-8, "Adam's denominator epsilon.")
    clip_global_norm: float = setting(400.0, "Paddle's gradient_clipping_threshold.")
    warmup_steps: int = setting(0, "Linear warm-up from 0.")
    schedule: str = setting("constant", "After warm-up: 'constant', 'cosine' or 'exponential'.")
    decay_rate: float = setting(0.83, "'exponential': factor per decay_steps.")
    decay_steps: int = setting(
        10_000,
        "'cosine': steps after warm-up to reach 0 (0: to num_train_steps); 'exponential': steps per decay_rate.",
    )
    max_consecutive_skips: int = setting(20, "Non-finite steps in a row before stopping.")
    accumulate_steps: int = setting(
        1,
        "Gradient accumulation: each update sums the gradients of this many micro-batches of "
        "per_device_batch_size rows per device, inside the one compiled step (lax.scan), so a global batch "
        "of K x per_device_batch_size x devices costs the memory of one micro-batch. Steps, the schedule "
        "and checkpoints count updates; batch norm normalizes each micro-batch alone.",
    )
    ema_decay: float = setting(
        0.0,
        "Weight EMA: the train state also keeps an exponential moving average of the parameters, "
        "ema = d ema + (1 - d) params after each update with d = min(ema_decay, (1 + updates) / (10 + "
        "updates)), checkpointed with them; eval, transcribe and export use it (eval.ema_weights). "
        "0 = off; 0.999 is NeMo's. On or off is fixed for a workdir.",
    )

    def __post_init__(self):
        _check_ranges(self)
        _one_of("optimizer.schedule", self.schedule, SCHEDULES)
        if self.decay_steps == 0 and self.schedule == "exponential":
            raise ValueError(
                "optimizer.decay_steps=0 with optimizer.schedule='exponential': 0 (decay to the last "
                "step) is for 'cosine'; give the steps per optimizer.decay_rate"
            )


@dataclasses.dataclass(frozen=True)
class Eval:
    KEY: ClassVar[str] = "eval"
    ROLE: ClassVar[Role] = EVAL_DRIVES

    split: str = setting("", "--mode=eval split; '' = dataset.eval_split.")
    max_utterances: int = setting(0, "Utterances scored per split; 0 = the whole split.")
    num_examples_to_print: int = setting(3, "Reference/hypothesis pairs logged.")
    ema_weights: bool = setting(
        True,
        "Where the run kept a weight EMA (optimizer.ema_decay > 0): evaluate (in training too), transcribe, "
        "export and fine-tune from the EMA weights; False: the trained weights.",
    )

    def __post_init__(self):
        _check_ranges(self)
        _no_split_twice("eval.split", self.split)


@dataclasses.dataclass(frozen=True)
class Decoding:
    """Beam search (--mode=eval, tools.tune_lm; ds2_jax.decoding); beam_width 0 = greedy only."""

    KEY: ClassVar[str] = "decoding"
    ROLE: ClassVar[Role] = EVAL_DRIVES

    beam_width: int = setting(0, "> 0: also beam search (flashlight-text); 0 = greedy only. With an LM, 32 is tuned.")
    lm_path: str = setting("", "KenLM ARPA/binary word LM (tools.build_lm); '' = no LM.")
    lexicon_path: str = setting("", "Words the LM search may output, one a line; '' = the ARPA's unigrams.")
    alpha: float = setting(0.5, "LM weight (on the natural-log LM score).")
    beta: float = setting(1.0, "Bonus per decoded word (offsets the LM's short-output bias).")
    beam_prune_logp: float = setting(-10.0, "Drop beams this far below the best (log).")
    token_min_logp: float = setting(-5.0, "Skip tokens below this log-prob (unless a frame's argmax).")
    unk_score_offset: float = setting(float("-inf"), "Score of an out-of-lexicon word (output as <unk>); -inf = none.")

    def __post_init__(self):
        _check_ranges(self)
        if self.lm_path and self.beam_width == 0:
            raise ValueError(
                f"decoding.lm_path={self.lm_path!r} is used by beam search only: set decoding.beam_width > 0"
            )
        if self.lexicon_path and not self.lm_path:
            raise ValueError(
                f"decoding.lexicon_path={self.lexicon_path!r} is used with an LM only: set decoding.lm_path"
            )

    @property
    def beam(self) -> bool:
        return self.beam_width > 0


# ----------------------------------------------------------------------------- the whole


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every setting of a run: the run's own fields, then one field per section."""

    seed: int = setting(0, "Seeds parameters, data order and dropout-free rng streams.", role=TRAINS)
    # DRIVES, unless a cosine schedule decays over it (decay_steps=0): workdir_config records it then.
    num_train_steps: int = setting(100_000, "Total optimizer steps (resume continues to this).", role=DRIVES)
    per_device_batch_size: int = setting(16, "Utterances per device; global = this x devices.", role=EVAL_READS)
    num_devices: int = setting(0, "Local devices to use; 0 = all local devices.", role=EVAL_READS)
    compile: bool = setting(True, "False runs the same step op by op on one device (eager).", role=EVAL_READS)
    parallelism: str = setting("pmap", "'pmap' or 'jit' (jit + NamedSharding over a device mesh).", role=EVAL_READS)
    log_every_steps: int = setting(50, "stdout / metrics.jsonl / TensorBoard cadence.", role=DRIVES)
    eval_every_steps: int = setting(2_000, "Greedy WER/CER on dataset.eval_split; 0 = never.", role=DRIVES)
    checkpoint_every_steps: int = setting(1_000, "Orbax checkpoint cadence (and one at the end).", role=DRIVES)
    keep_checkpoints: int = setting(3, "Checkpoints kept on disk.", role=EVAL_DRIVES)
    keep_best_checkpoints: int = setting(
        0,
        "Also keep the N checkpoints with the lowest in-training eval WER (a checkpoint is written at "
        "each eval; 0 = only the newest keep_checkpoints). --mode=eval --eval_step=best takes the best.",
        role=EVAL_DRIVES,
    )
    prefetch_batches: int = setting(2, "Batches staged on the devices ahead of the step.", role=EVAL_DRIVES)
    input_wait_warn_fraction: float = setting(
        0.05,
        "Warn once when the devices sit idle waiting for input more than this fraction of two log "
        "intervals in a row (metrics: input_wait_s).",
        role=DRIVES,
    )
    step_timeout_s: float = setting(
        1800.0,
        "Watchdog: exit 3 if no step/eval batch ends for this long (compiles, saves exempt); 0 = off.",
        role=DRIVES,
    )
    compilation_cache_dir: str = setting(
        "~/.cache/ds2_jax/xla",
        "JAX's persistent compilation cache: a restart with the same shapes loads its compiled steps "
        "instead of compiling them again. '' = off; JAX_COMPILATION_CACHE_DIR wins.",
        role=DRIVES,
    )
    deterministic: bool = setting(False, "GPU: --xla_gpu_deterministic_ops (slower, bitwise repeatable).", role=TRAINS)
    # init_from: where step 0 came from (config.json resolves it); rerunning resumes the fine-tune.
    init_from: str = setting(
        "",
        "Fine-tuning: WORKDIR or WORKDIR:STEP (default its newest checkpoint) whose parameters, batch-"
        "norm statistics and feature normalization start this run (at step 0, fresh optimizer); an output"
        " layer of another size (another alphabet) starts afresh. Used only while this workdir has no "
        "checkpoint: a rerun resumes its own.",
        role=EVAL_DRIVES,
    )
    init_output: str = setting(
        "auto",
        "Fine-tuning (init_from): the output layer. 'auto' = the source's whole layer where both "
        "alphabets are the same, initialized afresh where they differ; 'by_symbol' = the units of the "
        "symbols both alphabets share kept, the rest afresh; 'fresh' = initialized afresh always.",
        role=EVAL_DRIVES,
    )
    # Parameters not trained, comma-separated: top-level modules ('ConvBlock' = every conv
    # block, 'RNNLayer_0', 'output') or paths ('RNNLayer_1/recurrent_kernel'); '' = train all.
    # FIXED: the optimizer state holds no moments for frozen parameters.
    freeze: str = setting(
        "",
        "Parameters not trained, comma-separated: top-level modules ('ConvBlock' = every conv block, "
        "'RNNLayer_0', 'output') or paths ('RNNLayer_1/recurrent_kernel'); '' = train all.",
        role=FIXED,
    )

    faults: Faults = dataclasses.field(default_factory=Faults)
    dataset: Dataset = dataclasses.field(default_factory=Dataset)
    features: Features = dataclasses.field(default_factory=Features)
    waveform: Waveform = dataclasses.field(default_factory=Waveform)
    model: Model = dataclasses.field(default_factory=Model)
    loss: Loss = dataclasses.field(default_factory=Loss)
    optimizer: Optimizer = dataclasses.field(default_factory=Optimizer)
    eval: Eval = dataclasses.field(default_factory=Eval)
    decoding: Decoding = dataclasses.field(default_factory=Decoding)

    def __post_init__(self):
        _check_ranges(self)  # num_devices: the devices present are checked by parallel.make
        _one_of("parallelism", self.parallelism, PARALLELISMS)
        _one_of("init_output", self.init_output, INIT_OUTPUTS)
        if self.dataset.name in LIBRISPEECH_DATASETS and self.features.sample_rate != 16_000:
            raise ValueError(
                f"features.sample_rate={self.features.sample_rate} with dataset.name="
                f"{self.dataset.name!r}: LibriSpeech is stored at 16000 Hz; other rates need "
                "dataset.name='manifest' (resampled at build)"
            )
        if self.keep_best_checkpoints and not self.eval_every_steps:
            raise ValueError(
                f"keep_best_checkpoints={self.keep_best_checkpoints} ranks checkpoints by the in-training "
                "eval's WER: set eval_every_steps > 0"
            )
        if self.parallelism == "jit" and not self.model.sync_batch_norm:
            raise ValueError(
                "model.sync_batch_norm=False with parallelism='jit': under jit batch norm always sees "
                "the global batch; set model.sync_batch_norm=True, or parallelism='pmap' for "
                "per-device statistics"
            )


# ----------------------------------------------------------------------------- building


def _type_error(key: str, value, want: type) -> ValueError:
    return ValueError(f"{key}={value!r}: expected {want.__name__}, got {type(value).__name__}")


def _coerce(key: str, value, want: type):
    """`value` as a `want` (int, float, bool or str); an int is a float too."""
    if want is bool:
        if not isinstance(value, bool):
            raise _type_error(key, value, want)
        return value
    if isinstance(value, bool):
        raise _type_error(key, value, want)
    if want is float and isinstance(value, int):
        return float(value)
    if not isinstance(value, want):
        raise _type_error(key, value, want)
    return value


def _items(mapping, key: str) -> dict:
    if dataclasses.is_dataclass(mapping):
        return {f.name: getattr(mapping, f.name) for f in dataclasses.fields(mapping)}
    if not hasattr(mapping, "items"):
        raise ValueError(f"{key or 'config'}: expected a section of settings, got {type(mapping).__name__} {mapping!r}")
    return dict(mapping.items())


def build(cls, mapping, prefix: str = ""):
    """`cls` (a section or Settings) from a ConfigDict, dict or dataclass: unknown keys and
    wrong types are a ValueError naming the key; keys it lacks keep their default (an
    older config.json); the values are then checked by `cls.__post_init__`."""
    if type(mapping) is cls:
        return mapping
    given = _items(mapping, prefix.rstrip("."))
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(given) - set(fields))
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, list(fields), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(prefix + c for c in close)}?" if close else f"the keys are {sorted(fields)}"
        raise ValueError(f"unknown config key {prefix + key!r}: {hint} (ds2_jax/settings.py lists and explains them)")
    values = {}
    for name, value in given.items():
        want = hints[name]
        if dataclasses.is_dataclass(want):
            values[name] = value if isinstance(value, want) else build(want, value, f"{prefix}{name}.")
        else:
            values[name] = _coerce(prefix + name, value, want)
    return cls(**values)


def from_config_dict(config) -> Settings:
    """The checked Settings of a ConfigDict (or dict, or config.json's contents); a
    Settings is returned as it is, so entry points can be handed either."""
    if isinstance(config, Settings):
        return config
    return build(Settings, config)


def to_dict(config) -> dict:
    """Nested plain dict of a Settings (or a ConfigDict): what config.json holds."""
    if isinstance(config, Settings):
        return dataclasses.asdict(config)
    return config.to_dict()


def defaults(cls=None) -> dict:
    """Every field's default as a nested dict, read off the dataclasses without building
    (so without checks, imports or devices): what configs/default.py serves."""
    cls = cls or Settings
    hints = typing.get_type_hints(cls)
    return {
        f.name: defaults(hints[f.name]) if f.default is dataclasses.MISSING else f.default
        for f in dataclasses.fields(cls)
    }


def to_config_dict(config: Settings | None = None):
    """The ml_collections.ConfigDict of a Settings; of the defaults without one."""
    import ml_collections

    return ml_collections.ConfigDict(defaults() if config is None else to_dict(config))


@functools.cache
def roles(cls=None, prefix: str = "") -> dict[str, Role]:
    """{dotted key: its Role} of every setting: the field's own role, else its section's ROLE. A field
    with neither is a TypeError: a new setting says what a resume and an evaluation do with it."""
    cls = cls or Settings
    out = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory):  # a section
            out.update(roles(f.default_factory, f"{prefix}{f.name}."))
            continue
        role = f.metadata.get("role") or getattr(cls, "ROLE", None)
        if not isinstance(role, Role):
            raise TypeError(
                f"the setting {prefix}{f.name} has no role: give it setting(..., role=) or its section a ROLE"
            )
        out[prefix + f.name] = role
    return out


def field_help(cls=None) -> dict[str, str]:
    """{field: its help text} of a section (Settings: the run's own fields), from each field's metadata."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls or Settings)}


def describe(config) -> list[dict]:
    """Every key of a config (a ConfigDict, dict or Settings) in schema order: {'key', 'value',
    'type', 'default', 'help'}; keys the schema lacks come last with type '?' (build names them)."""
    rows: list[dict] = []

    def walk(cls, mapping, prefix: str) -> None:
        given = _items(mapping, prefix.rstrip(".")) if mapping is not None else {}
        hints, helps = typing.get_type_hints(cls), field_help(cls)
        for f in dataclasses.fields(cls):
            want = hints[f.name]
            if dataclasses.is_dataclass(want):
                walk(want, given.get(f.name), f"{prefix}{f.name}.")
                continue
            default = f.default
            rows.append(
                {
                    "key": prefix + f.name,
                    "value": given.get(f.name, default),
                    "type": want.__name__,
                    "default": default,
                    "help": helps.get(f.name, ""),
                }
            )
        for name in sorted(set(given) - {f.name for f in dataclasses.fields(cls)}):
            rows.append(
                {
                    "key": prefix + name,
                    "value": given[name],
                    "type": "?",
                    "default": None,
                    "help": "not a setting (ds2_jax/settings.py)",
                }
            )

    walk(Settings, config, "")
    return rows


EMA_FLAG_HELP = (
    "Where the run kept a weight EMA (optimizer.ema_decay > 0), use the EMA weights (default); "
    "--noema_weights: the trained weights."
)


def choosing_weights(config: Settings, ema: bool) -> Settings:
    """`config` with eval.ema_weights=`ema` (the --ema_weights flag of transcribe and export)."""
    return dataclasses.replace(config, eval=dataclasses.replace(config.eval, ema_weights=ema))


def override(config: Settings, changes: dict[str, Any]) -> Settings:
    """A Settings with dotted-key changes, e.g. override(s, {"model.dtype": "bfloat16"}), checked again."""
    nested: dict = to_dict(config)
    for key, value in changes.items():
        node = nested
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})  # an unknown section: build names it
            if not isinstance(node, dict):
                raise ValueError(f"{key!r}: {p!r} is a setting, not a section of settings")
        node[leaf] = value  # an unknown key: build names it and the close ones
    return build(Settings, nested)
