"""Paddle DS2's clipped ReLU (BRelu), shared by the conv blocks and every simple-RNN path."""

from __future__ import annotations

import jax.numpy as jnp

CLIP = 20.0


def clipped_relu(x):
    """min(max(x, 0), CLIP), elementwise."""
    return jnp.clip(x, 0.0, CLIP)
