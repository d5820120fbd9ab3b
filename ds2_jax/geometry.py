"""Frame arithmetic shared by host (input pipeline) and device (model) code. No jax.

The conv stack is Paddle DS2's: conv 1 is 41 (freq) x 11 (time), stride 2 x 3,
padding 20 x 5; every further conv is 21 x 11, stride 2 x 1, padding 10 x 5.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class ConvSpec:
    kernel: tuple[int, int]  # (time, freq)
    strides: tuple[int, int]
    padding: tuple[int, int]


FIRST_CONV = ConvSpec(kernel=(11, 41), strides=(3, 2), padding=(5, 20))
LATER_CONV = ConvSpec(kernel=(11, 21), strides=(1, 2), padding=(5, 10))
MAX_CONV_LAYERS = 3


def conv_specs(num_conv_layers: int) -> list[ConvSpec]:
    if not 1 <= num_conv_layers <= MAX_CONV_LAYERS:
        raise ValueError(f"model.num_conv_layers must be 1..{MAX_CONV_LAYERS}, got {num_conv_layers}")
    return [FIRST_CONV] + [LATER_CONV] * (num_conv_layers - 1)


def _floor_div(a, b: int):
    """a // b; on a jax array jnp.floor_divide, which converts to ONNX with a symbolic batch (the
    `//` operator's integer remainder does not: jax2onnx 0.17); anything else (ints, numpy, torch
    tensors of the PyTorch twin, symbolic dimensions) divides with `//`. jax is imported only for one."""
    if not hasattr(a, "shape") or type(a).__module__.split(".")[0] not in ("jax", "jaxlib"):
        return a // b
    import jax.numpy as jnp

    return jnp.floor_divide(a, b)


def conv_out(length, kernel: int, stride: int, pad: int):
    """Output length of one strided conv (works on ints, numpy and jnp arrays)."""
    return _floor_div(length + 2 * pad - kernel, stride) + 1


def num_frames(num_samples, window: int = 320, hop: int = 160):
    """Whole analysis windows in `num_samples` samples (0 if shorter than a window).

    An int for an int; elementwise on numpy arrays (host) and jax arrays (inside the step).
    """
    frames = _floor_div(num_samples - window, hop) + 1
    if isinstance(frames, np.ndarray):
        return np.maximum(frames, 0)
    if isinstance(frames, (int, np.integer)):
        return max(int(frames), 0)
    if not hasattr(frames, "clip"):  # a symbolic dimension (jax.export): its constraint holds it >= 1
        return frames
    return frames.clip(0)  # a jax array; geometry imports no jax


def output_frames(input_frames, num_conv_layers: int):
    """Frames the conv stack emits for `input_frames` spectrogram frames (CTC time)."""
    for spec in conv_specs(num_conv_layers):
        input_frames = conv_out(input_frames, spec.kernel[0], spec.strides[0], spec.padding[0])
    return input_frames


def output_bins(num_bins: int, num_conv_layers: int) -> int:
    """Frequency bins left after the conv stack (161 -> 81 -> 41 -> 21)."""
    for spec in conv_specs(num_conv_layers):
        num_bins = conv_out(num_bins, spec.kernel[1], spec.strides[1], spec.padding[1])
    return num_bins


def ctc_min_frames(labels, label_lengths=None):
    """Fewest CTC frames that can emit a label sequence: one per label plus one blank per repeat.

    Args:
      labels: <int>[L] one sequence (host), or <int>[B, L] padded rows, numpy or jax (inside the step).
      label_lengths: None for one sequence; <int>[B] valid labels per row.
    Returns:
      an int for one sequence; <int>[B] for rows.
    """
    if label_lengths is None:
        labels = np.asarray(labels)
        return int(len(labels) + np.sum(labels[1:] == labels[:-1]))
    valid = label_lengths[:, None] > np.arange(1, labels.shape[1])[None, :]
    repeats = (labels[:, 1:] == labels[:, :-1]) & valid
    return label_lengths + repeats.sum(axis=1).astype(label_lengths.dtype)
