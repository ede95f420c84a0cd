"""Reward shaping terms: pure functions of a response's properties."""

from __future__ import annotations


def overlong_penalty(length: int, max_len: int, buffer: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment: 0 up to max_len - buffer, then linear down to -penalty at
    max_len, and -penalty beyond. buffer <= 0 turns it off.

    length 40, max_len 48, buffer 16 -> -(40 - 32) / 16 = -0.5.
    """
    if buffer <= 0:
        return 0.0
    start = max_len - buffer
    if length <= start:
        return 0.0
    if length > max_len:
        return -penalty
    return -penalty * (length - start) / buffer
