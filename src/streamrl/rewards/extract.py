"""Pull the final answer out of a response in one of a few fixed formats."""

from __future__ import annotations

import re

from streamrl.rewards.number_grammar import NUMBER, canonical
from streamrl.rewards.numerals import ascii_digits, ascii_numerals

EXTRACTORS = ("answer_is", "boxed", "last_number", "gsm8k")
# a number's grammar (how it may be signed, grouped, scaled, priced) is rewards/number_grammar.py's, the
# one math_equal values: an answer read here is the number compared there
# what may open the answer after "answer is": markdown emphasis, math delimiters, a box
_OPENER = r"(?:[*_$\s]|\\\(|\\\[|\\boxed\{)*"
_ANSWER_IS = re.compile(rf"answer is:?{_OPENER}({NUMBER})", re.IGNORECASE)
_NUMBER = re.compile(NUMBER)
_GSM8K = re.compile(rf"####\s*\$?\s*({NUMBER})")  # GSM8K's reference solutions end with "#### 72"
# what may follow the answer statement at the end of a response: closing punctuation, markdown emphasis,
# math delimiters (a unit or a sentence may not)
_TRAILER = re.compile(r"[\s.!*_$)\]}]*(?:\\[\])][\s.!*_$)\]}]*)*")


def _box(text: str, start: int) -> tuple[str | None, int]:
    """(the content of the box opening at start, None when empty; the index after its closing brace);
    (None, -1) when it is not closed."""
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return ascii_numerals(text[i:j].strip()) or None, j + 1  # an empty box is no answer
    return None, -1


def _last_boxed(text: str) -> tuple[str | None, int]:
    """(the last box's content, the index after its closing brace); (None, -1) without a closed box with
    content.

    An empty box ('\\boxed{}', '\\boxed{ }') states no answer and is passed over for the box before it;
    a last box left open is where the response was cut inside its answer, so there is none."""
    end = len(text)
    while (start := text.rfind("\\boxed{", 0, end)) >= 0:
        content, after = _box(text, start)
        if content is not None or after < 0:
            return content, after
        end = start
    return None, -1


def extract_answer(text: str, style: str) -> str | None:
    """'The answer is 84.' -> '84' (answer_is); '\\boxed{\\frac{1}{2}}' -> '\\frac{1}{2}' (boxed);
    '... #### 1,234' -> '1234' (gsm8k: the number after '####').

    Returns None when the format is not followed (boxed: no box with content). The last occurrence wins
    (boxed: the last box with content, so '\\boxed{72} \\boxed{}' -> '72'). Commas that group digits by
    three are dropped ('1,234' -> '1234'; '2,3' stays; a comma after the number is not part of it), and
    so are spaces that do ('1 000 000' -> '1000000'). A currency sign before the number is dropped
    ('\\$18', '€18' -> '18'; '-\\$5' -> '-5'); scientific notation comes back as e-notation
    ('2.5×10^3' -> '2.5e3'), a plus sign too ('+5' -> '5', '10^+3' -> '10^3'); a hyphen right after a
    digit is no minus ('2022-2023' -> '2023'): the grammar of rewards/number_grammar.py, which math_equal
    values numbers by. Numbers may be written in any script's digits, full-width or with vulgar fractions
    (rewards/numerals.py): the answer comes back in ASCII ('٣' -> '3', '１½' -> '3/2').
    """
    text = ascii_digits(text)
    if style == "answer_is":
        found = _ANSWER_IS.findall(text)
        return canonical(found[-1]) if found else None
    if style == "boxed":
        return _last_boxed(text)[0]
    if style == "last_number":
        found = _NUMBER.findall(text)
        return canonical(found[-1]) if found else None
    if style == "gsm8k":
        found = _GSM8K.findall(text)
        return canonical(found[-1]) if found else None
    raise ValueError(f"unknown answer format '{style}'; choose from {', '.join(EXTRACTORS)}")


def reference_answer(answer: str) -> str:
    """A dataset's reference answer: a GSM8K-style solution ('...\\n#### 1,234') becomes what follows its
    last '####' ('1234'; a number loses its thousands commas); any other answer is returned unchanged."""
    if "####" not in answer:
        return answer
    tail = answer.rsplit("####", 1)[1]
    return extract_answer("####" + tail, "gsm8k") or tail.strip()


def ends_with_answer(text: str, style: str) -> bool:
    """Whether the response ends with its answer statement, as the format asks ('Reply in the form
    The answer is <number>.'): after the last 'The answer is N', '#### N' or \\boxed{...} with content
    come only whitespace, closing punctuation and math delimiters (an empty box after the answer is text
    after it). last_number: any number counts.

    'Sums: 3 + 4 = 7. The answer is 7.' -> True; 'The answer is 7.\\n\\nIn this example, ...' -> False.
    A response that rambles on after its answer earns the answer's correctness but not the format
    bonus (reward.format_weight): without that, text after the answer costs nothing, and its length
    drifts up to rollout.max_new_tokens.
    """
    text = ascii_digits(text)
    if style == "last_number":
        return _NUMBER.search(text) is not None
    if style == "boxed":
        end = _last_boxed(text)[1]
    else:
        pattern = {"answer_is": _ANSWER_IS, "gsm8k": _GSM8K}.get(style)
        if pattern is None:
            raise ValueError(f"unknown answer format '{style}'; choose from {', '.join(EXTRACTORS)}")
        found = list(pattern.finditer(text))
        end = found[-1].end() if found else -1
    return end >= 0 and _TRAILER.fullmatch(text[end:]) is not None
