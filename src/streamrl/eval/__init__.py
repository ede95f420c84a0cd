"""Held-out evaluation and its statistics."""
