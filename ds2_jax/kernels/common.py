"""What the Pallas kernels (kernels.triton_rnn, kernels.mosaic_rnn, kernels.ctc) share: where they run,
their block sizes and the barrier among one program's threads."""

from __future__ import annotations

import jax
from jax.experimental.pallas import triton as plt

MIN_BLOCK = 16  # Triton's smallest MMA tile side
HOPPER = "9.0"  # compute capability of the H100/H200: wgmma, TMA, clusters (kernels.mosaic_rnn)
# Opt-in shared memory per thread block by compute capability (CUDA programming guide).
SHARED_MEMORY_BYTES = {"9.0": 232_448, "8.0": 166_912, "8.7": 166_912, "8.6": 101_376, "8.9": 101_376}
SMALLEST_SHARED_MEMORY = min(SHARED_MEMORY_BYTES.values())  # unknown GPUs: the safe guess


def compute_capability() -> str:
    """The first device's compute capability ('9.0'), or '' off NVIDIA GPUs."""
    return str(getattr(jax.devices()[0], "compute_capability", "")) if jax.default_backend() == "gpu" else ""


def shared_memory_bytes(capability: str) -> int:
    """Shared memory one block may use on a GPU of this compute capability (the smallest known value if unknown)."""
    return SHARED_MEMORY_BYTES.get(capability, SMALLEST_SHARED_MEMORY)


def interpret_mode() -> bool:
    """Triton kernels run natively on GPUs only; elsewhere Pallas interprets them."""
    return jax.default_backend() != "gpu"


def block_size(n: int) -> int:
    """The power of two >= n (and >= MIN_BLOCK) that a Triton block of n elements needs."""
    return max(MIN_BLOCK, 1 << (n - 1).bit_length())


def sync_threads(interpret: bool) -> None:
    """Barrier among one program's threads; interpret mode has one thread per program."""
    if not interpret:
        plt.debug_barrier()
