"""Pull the final answer out of a response in one of a few fixed formats."""

from __future__ import annotations

import re

from streamrl.rewards.numerals import VULGAR_CLASS, ascii_digits, ascii_numerals, vulgar_to_ascii

EXTRACTORS = ("answer_is", "boxed", "last_number", "gsm8k")
# a signed number: 1,234 | 1{,}234 | 1 000 000 | 12.5 | .5 | 1e3 | 2.5E-4 | 2.5×10^3 | ½ | 1½ | 2 ¾ | 3/4 |
# 10^6 | 2^{-3} | \$18 | -€5 (read after ascii_digits, so digits of any script and the typographic minus
# are ASCII by then)
_SPACE = r"[ \u00a0\u2009\u202f]"  # a space, no-break space, thin space or narrow no-break space
_POWER = r"\^(?:-?\d+|\{-?\d+\})"
_TIMES = r"(?:×|\\times|\\cdot|\*|x)"  # scientific notation's multiplication sign
_CURRENCY = r"(?:\\?\$|[€£¥])"  # a dollar (LaTeX escapes it: \$), euro, pound or yen sign
_NUM = (
    r"(?<!\d)"  # a hyphen right after a digit is not a minus sign: 2022-2023 is a range, ending with 2023
    # a currency sign before the number, with the minus before it (-\$5) or after it (\$-5)
    rf"(?:-{_CURRENCY}\s*(?=[\d.]|{VULGAR_CLASS})|{_CURRENCY}\s*)?"
    rf"(?:-?\d+(?:\.\d+)?\s*{_TIMES}\s*10{_POWER}"  # scientific notation: 2.5×10^3 is 2500, not 2.5
    rf"|-?\d{{1,3}}(?:{_SPACE}\d{{3}})+(?!\d)(?:\.\d+)?"  # digits grouped by three with spaces: 1 000 000
    "|(?:"
    rf"-?(?:\d(?:,?\d|\{{,\}}\d)*(?:\.\d+)?(?:[ \u00a0\u2009\u202f]?{VULGAR_CLASS})?|{VULGAR_CLASS}|\.\d+)"
    r"(?:[eE][-+]?\d+)?"
    r"(?:\s*/\s*\d+)?"  # a fraction: 3/4 is three quarters, not 3
    r"(?:\^(?:-?\d+|\{-?\d+\}))?"  # a power: 10^6 is a million, not 10
    "))"
)
# what may open the answer after "answer is": markdown emphasis, math delimiters, a box
_OPENER = r"(?:[*_$\s]|\\\(|\\\[|\\boxed\{)*"
_ANSWER_IS = re.compile(rf"answer is:?{_OPENER}({_NUM})", re.IGNORECASE)
# a comma or a space that groups digits by three: 1,234 and 1 234 (not 2,3)
_THOUSANDS = re.compile(rf",(?=\d{{3}}(?!\d))|(?<=\d){_SPACE}(?=\d{{3}}(?!\d))")
_CURRENCY_SIGN = re.compile(rf"{_CURRENCY}\s*")
# from the start of a number only (not again inside a run of digits: linear in its length)
_SCIENTIFIC = re.compile(rf"(?<![\d.])(\d+(?:\.\d+)?)\s*{_TIMES}\s*10\^\{{?(-?\d+)\}}?")
_NUMBER = re.compile(_NUM)
_GSM8K = re.compile(rf"####\s*\$?\s*({_NUM})")  # GSM8K's reference solutions end with "#### 72"
# what may follow the answer statement at the end of a response: closing punctuation, markdown emphasis,
# math delimiters (a unit or a sentence may not)
_TRAILER = re.compile(r"[\s.!*_$)\]}]*(?:\\[\])][\s.!*_$)\]}]*)*")


def _clean(number: str) -> str:
    """A currency sign dropped ('-\\$5' -> '-5', '€18' -> '18'); scientific notation as e-notation
    ('2.5×10^3' -> '2.5e3'); thousands separators dropped ('1,234', LaTeX's '1{,}234' and '1 234' ->
    '1234'; '2,3' is kept: a pair, or a decimal comma, for math-verify to read); a vulgar fraction
    written n/d ('1½' -> '3/2')."""
    number = _SCIENTIFIC.sub(r"\1e\2", _CURRENCY_SIGN.sub("", number))
    return vulgar_to_ascii(_THOUSANDS.sub("", number.replace("{,}", ",")))


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
    ('2.5×10^3' -> '2.5e3'); a hyphen right after a digit is no minus ('2022-2023' -> '2023'). Numbers
    may be written in any script's digits, full-width or with vulgar fractions (rewards/numerals.py):
    the answer comes back in ASCII ('٣' -> '3', '１½' -> '3/2').
    """
    text = ascii_digits(text)
    if style == "answer_is":
        found = _ANSWER_IS.findall(text)
        return _clean(found[-1]) if found else None
    if style == "boxed":
        return _last_boxed(text)[0]
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
