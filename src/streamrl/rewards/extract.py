"""Pull the final answer out of a response in one of a few fixed formats."""

from __future__ import annotations

import re

EXTRACTORS = ("answer_is", "boxed", "last_number", "gsm8k")
# a signed decimal: 1,234 | 12.5 | .5 | 1e3 | 2.5E-4 (the sign may be U+2212, the typographic minus)
_NUM = r"[-\u2212]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
_ANSWER_IS = re.compile(rf"answer is:?\s*\$?\s*({_NUM})", re.IGNORECASE)
_NUMBER = re.compile(_NUM)
_GSM8K = re.compile(rf"####\s*\$?\s*({_NUM})")  # GSM8K's reference solutions end with "#### 72"


def _clean(number: str) -> str:
    """Thousands separators dropped, the typographic minus made ASCII."""
    return number.replace(",", "").replace("\u2212", "-")


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip() or None  # an empty box is no answer
    return None


def extract_answer(text: str, style: str) -> str | None:
    """'The answer is 84.' -> '84' (answer_is); '\\boxed{\\frac{1}{2}}' -> '\\frac{1}{2}' (boxed);
    '... #### 1,234' -> '1234' (gsm8k: the number after '####').

    Returns None when the format is not followed (an empty box included). The last occurrence wins;
    commas inside numbers are dropped and the typographic minus becomes '-'.
    """
    if style == "answer_is":
        found = _ANSWER_IS.findall(text)
        return _clean(found[-1]) if found else None
    if style == "boxed":
        return _last_boxed(text)
    if style == "last_number":
        found = _NUMBER.findall(text)
        return _clean(found[-1]) if found else None
    if style == "gsm8k":
        found = _GSM8K.findall(text)
        return _clean(found[-1]) if found else None
    raise ValueError(f"unknown answer format '{style}'; choose from {', '.join(EXTRACTORS)}")


def reference_answer(answer: str) -> str:
    """A dataset's reference answer: a GSM8K-style solution ('...\\n#### 1,234') becomes what follows its
    last '####' ('1234'; a number loses its thousands commas); any other answer is returned unchanged."""
    if "####" not in answer:
        return answer
    tail = answer.rsplit("####", 1)[1]
    return extract_answer("####" + tail, "gsm8k") or tail.strip()
