"""tfds builders for the LibriSpeech layout (host side: no jax, no TensorFlow)."""
