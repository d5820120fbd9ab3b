"""Command-line tools that are not part of training (corpus generation)."""
