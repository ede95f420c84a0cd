"""Pull the final answer out of a response in one of a few fixed formats."""

from __future__ import annotations

import re

EXTRACTORS = ("answer_is", "boxed", "last_number")
_ANSWER_IS = re.compile(r"answer is:?\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?|-?\.\d+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def extract_answer(text: str, style: str) -> str | None:
    """'The answer is 84.' -> '84' (answer_is); '\\boxed{\\frac{1}{2}}' -> '\\frac{1}{2}' (boxed).

    Returns None when the format is not followed; commas inside numbers are dropped.
    """
    if style == "answer_is":
        found = _ANSWER_IS.findall(text)
        return found[-1].replace(",", "") if found else None
    if style == "boxed":
        return _last_boxed(text)
    if style == "last_number":
        found = _NUMBER.findall(text)
        return found[-1].replace(",", "") if found else None
    raise ValueError(f"unknown answer format '{style}'; choose from {', '.join(EXTRACTORS)}")
