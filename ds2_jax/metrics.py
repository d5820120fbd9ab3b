"""Error rates (jiwer) and metric writers (stdout, metrics.jsonl, TensorBoard)."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from typing import Mapping

import jiwer
import numpy as np

from ds2_jax import errors, files, layout

log = logging.getLogger("ds2_jax")


def error_rates(references: list[str], hypotheses: list[str]) -> dict[str, float]:
    """Corpus WER and CER (edits / reference length), 0 for an empty corpus."""
    if not references:
        return {"wer": 0.0, "cer": 0.0}
    # jiwer rejects empty reference strings; score them as one-character sentinels.
    refs = [r if r.strip() else "<empty>" for r in references]
    return {"wer": float(jiwer.wer(refs, hypotheses)), "cer": float(jiwer.cer(refs, hypotheses))}


def reduce_sums(step_metrics: list[Mapping[str, np.ndarray]]) -> dict[str, float]:
    """Sums (already psum'd per step, replicated over devices) over steps."""
    out: dict[str, float] = {}
    for m in step_metrics:
        for k, v in m.items():
            v = np.asarray(v)
            out[k] = out.get(k, 0.0) + float(v.reshape(-1)[0])
    return out


def summary_writer(logdir: str):
    """tensorboardX's SummaryWriter, imported without torch: tensorboardX imports torch whenever it
    is installed (to accept torch tensors), seconds of CPU in every training process for scalars
    that are plain floats here. Where torch is already imported it is left as it is."""
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # `import torch` raises ImportError: tensorboardX takes numpy only
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hide:
            del sys.modules["torch"]
    return SummaryWriter(logdir)


class MetricWriter:
    """Writes scalars to `workdir/metrics.jsonl` and TensorBoard event files.

    Only the process that owns the logs (process 0) should create one with enabled=True.
    """

    def __init__(self, workdir: str, enabled: bool = True, filename: str = layout.METRICS, resume_step: int = 0):
        self.enabled = enabled
        self._tb = None
        self._path = os.path.join(workdir, filename)
        if enabled:
            os.makedirs(workdir, exist_ok=True)
            _drop_records_after(self._path, resume_step)
            self._tb = summary_writer(os.path.join(workdir, layout.TENSORBOARD))

    def write(self, step: int, scalars: Mapping[str, float | None], prefix: str = "") -> None:
        """One metrics.jsonl record (and TensorBoard scalars) at `step`. A value that is None or not
        finite is written as JSON null (no value: json.dumps would write a bare NaN, which is not JSON)
        and left out of TensorBoard."""
        if not self.enabled:
            return
        values = {f"{prefix}{k}": json_number(v) for k, v in scalars.items()}
        record = {"step": int(step), **values}
        try:
            with open(self._path, "a") as f:
                f.write(json.dumps(record, allow_nan=False) + "\n")
            for k, v in values.items():
                if v is not None:
                    self._tb.add_scalar(k, v, int(step))
            self._tb.flush()
        except OSError as e:
            if not errors.is_disk_full(e):
                raise
            raise errors.DiskFull(
                f"writing metrics to {os.path.dirname(self._path)} failed (disk full; "
                f"{errors.free_space(self._path)} there); earlier checkpoints are intact. Free disk "
                "space or choose another --workdir, then rerun the same command"
            ) from e

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def json_number(value) -> float | None:
    """`value` as a float for a JSON record; None (null) for None, NaN and infinities."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _drop_records_after(path: str, step: int) -> None:
    """A resumed run repeats the steps after its checkpoint: forget their old records.

    The kept records go to a new file renamed over the old one: a run killed while
    rewriting it leaves the old history whole, never an empty or half file."""
    if not os.path.exists(path):
        return
    kept = [r for r in read_jsonl(path) if r.get("step", 0) <= step]
    with files.replacing(path) as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)


def read_jsonl(path: str) -> list[dict]:
    """The records of a .jsonl file. A torn last line (the writer was killed mid-line) is
    dropped with a warning; a bad line before it is an error naming file and line."""
    with open(path) as f:
        lines = [(i + 1, line) for i, line in enumerate(f) if line.strip()]
    records = []
    for n, (number, line) in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if n == len(lines) - 1:
                log.warning(
                    "%s: dropping its torn last line %d (%r), written by a run that was killed mid-write",
                    path,
                    number,
                    line[:80],
                )
                break
            raise ValueError(
                f"{path} line {number} is not JSON ({e}); fix or delete that line, "
                "or move the file away (its records are then lost)"
            ) from e
    return records
