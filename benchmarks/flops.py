"""Model FLOPs of one DS2 train step, counted from the architecture on the padded batch, and
model FLOP utilisation (MFU) against a GPU's dense peak.

Counted, not read from XLA's cost analysis: the Mosaic and Pallas recurrence kernels are custom
calls that the cost analysis sees as zero FLOPs, and a counted figure is the same for the JAX
step and its PyTorch twin. Only the products count (2 FLOPs a multiply-add): the convolutions,
the input projections, the recurrences and the output layer. The backward pass is twice the
forward (the gradient of each product's input and of its weights), so a step is 3x the forward;
the first conv's input gradient, which no step needs, is counted all the same (1-2% of a step).

For the seed model an 8 s utterance (801 frames) is ~89 GFLOP a step.
"""

from __future__ import annotations

from ds2_jax import geometry
from ds2_jax.model import CELL_GATES, ModelConfig

# Dense (no sparsity) tensor-core peak, FLOP/s, by device kind and compute dtype. NVIDIA's data
# sheets: H100 SXM and H200 989.4 TFLOPS bf16 (float32 matmuls run as TF32 at half that when
# allowed; full float32 is 67 TFLOPS); the PCIe H100 756.
PEAK_FLOPS = {
    ("H100 PCIe", "bfloat16"): 756e12,
    ("H100", "bfloat16"): 989.4e12,
    ("H200", "bfloat16"): 989.4e12,
}


def forward_macs(model: ModelConfig, batch: int, input_frames: int, num_bins: int) -> int:
    """Multiply-adds of one forward pass over `batch` utterances of `input_frames` frames."""
    macs, frames, bins, channels = 0, input_frames, num_bins, 1
    for spec in geometry.conv_specs(model.num_conv_layers):
        frames = geometry.conv_out(frames, spec.kernel[0], spec.strides[0], spec.padding[0])
        bins = geometry.conv_out(bins, spec.kernel[1], spec.strides[1], spec.padding[1])
        macs += frames * bins * model.conv_channels * spec.kernel[0] * spec.kernel[1] * channels
        channels = model.conv_channels
    directions = 2 if model.bidirectional else 1
    width = CELL_GATES[model.rnn_cell] * model.rnn_size
    projections = 1 if (model.share_rnn_weights or directions == 1) else directions
    features = bins * channels
    for _ in range(model.num_rnn_layers):
        macs += frames * features * width * projections  # input projection(s)
        macs += frames * directions * model.rnn_size * width  # the recurrence, step by step
        features = directions * model.rnn_size
    if directions == 1 and model.row_conv_context > 0:
        macs += frames * features * (model.row_conv_context + 1)  # depthwise lookahead
    macs += frames * features * model.vocab_size
    return batch * macs


def train_step_flops(model: ModelConfig, batch: int, input_frames: int, num_bins: int) -> int:
    """FLOPs of one train step (forward + backward) over the padded batch."""
    return 3 * 2 * forward_macs(model, batch, input_frames, num_bins)


def peak_flops(device_kind: str, dtype: str) -> float | None:
    """The dense tensor-core peak of a device kind ('NVIDIA H100 80GB HBM3') in `dtype`; None if unknown."""
    matches = [(name, peak) for (name, d), peak in PEAK_FLOPS.items() if d == dtype and name in device_kind]
    return max(matches, key=lambda m: len(m[0]))[1] if matches else None
