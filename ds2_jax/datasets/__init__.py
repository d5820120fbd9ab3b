"""tfds builders: the LibriSpeech layout, and manifests of your own speech (host side: no jax, no TensorFlow)."""
