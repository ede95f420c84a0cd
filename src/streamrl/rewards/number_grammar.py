"""How a number is written in an answer, and its exact value: one grammar for the number extraction reads
(rewards/extract.py) and the one comparison values (rewards/math.py), so the two never disagree.

A number is signed (-5, +5); a currency sign may come before it, with its minus before or after the
sign (\\$18, -\\$5, \\$-5, €18: a dollar as LaTeX escapes it, euro, pound or yen); its digits may be
grouped by three with commas (1,234; LaTeX's 1{,}234) or spaces (1 000 000: a space, no-break, thin or
narrow no-break space); it may have a decimal part (12.5, .5), an exponent (1e3, 2.5E-4, 1e+3), be in
scientific notation (2.5×10^3, 2.5·10^3, 2.5 \\times 10^{-3}, 3*10^+8, 6 x 10^23), a vulgar fraction or
a mixed number (½, 1½, 2 ¾), a fraction (3/4) or a power (10^6, 2^{-3}, 10^+3). Text is read after
numerals.ascii_digits: digits of any script and the typographic minus are ASCII by then.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

from streamrl.rewards.numerals import SPACE, VULGAR_CLASS, vulgar_to_ascii

SIGN = r"[-+]"
# scientific notation's multiplication sign; a middle dot or a dot operator (2.5·10^3, 2.5⋅10^3) is one
# only between a number and a power of ten: 2·5 (a decimal point in some hands) and 2·10 are no number
TIMES = r"(?:×|\u00b7|\u22c5|\\times|\\cdot|\*|x)"
CURRENCY = r"(?:\\?\$|[€£¥])"  # a dollar (LaTeX escapes it: \$), euro, pound or yen sign
EXPONENT = rf"{SIGN}?\d+"
POWER = rf"\^(?:{EXPONENT}|\{{{EXPONENT}\}})"
MANTISSA = r"(?:\d+(?:\.\d*)?|\.\d+)"  # scientific notation's number before its power of ten

# a number as a response writes it (see the module's docstring)
NUMBER = (
    r"(?<!\d)"  # a hyphen right after a digit is not a minus sign: 2022-2023 is a range, ending with 2023
    # a currency sign before the number, with the minus before it (-\$5) or after it (\$-5)
    rf"(?:{SIGN}{CURRENCY}\s*(?=[\d.]|{VULGAR_CLASS})|{CURRENCY}\s*)?"
    rf"(?:{SIGN}?{MANTISSA}\s*{TIMES}\s*10{POWER}"  # scientific notation: 2.5×10^3 is 2500, not 2.5
    rf"|{SIGN}?\d{{1,3}}(?:{SPACE}\d{{3}})+(?!\d)(?:\.\d+)?"  # digits grouped by three with spaces: 1 000 000
    "|(?:"
    rf"{SIGN}?(?:\d(?:,?\d|\{{,\}}\d)*(?:\.\d+)?(?:{SPACE}?{VULGAR_CLASS})?|{VULGAR_CLASS}|\.\d+)"
    rf"(?:[eE]{EXPONENT})?"
    r"(?:\s*/\s*\d+)?"  # a fraction: 3/4 is three quarters, not 3
    rf"(?:{POWER})?"  # a power: 10^6 is a million, not 10
    "))"
)
_NUMBER = re.compile(NUMBER)

# a currency sign at the start, after the number's sign if any: '-\$5', '- €5', '\$18'
_CURRENCY_SIGN = re.compile(rf"^({SIGN}?)\s*{CURRENCY}\s*")
# a plus sign of the number or of a power: +5 is 5, 10^+3 is 10^3, 10^{+3} is 10^{3}
_PLUS = re.compile(r"^\+|(?<=\^)\+|(?<=\^\{)\+")
# from the start of a number only (not again inside a run of digits: linear in its length)
_SCIENTIFIC = re.compile(rf"(?<![\d.])({MANTISSA})\s*{TIMES}\s*10\^(?:({EXPONENT})|\{{({EXPONENT})\}})")
# a comma or a space that groups digits by three: 1,234 and 1 234 (not 2,3 nor 1,2345)
_THOUSANDS = re.compile(rf"(?<=\d)(?:,|{SPACE})(?=\d{{3}}(?!\d))")

# the canonical forms: a decimal (1234, -.5, 2.5e3) or a fraction of integers (3/4, -\frac{3}{4})
_DECIMAL = re.compile(rf"{SIGN}?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE]{EXPONENT})?")
_FRACTION = re.compile(r"([-+]?)(?:(\d+)\s*/\s*(\d+)|\\[dt]?frac\{([-+]?\d+)\}\{(\d+)\})")


def is_number(text: str) -> bool:
    """Whether text, spaces around it aside, is one number as the grammar reads it."""
    return _NUMBER.fullmatch(text.strip()) is not None


def canonical(number: str) -> str:
    """A number as written made plain: a currency sign dropped ('-\\$5' -> '-5', '€18' -> '18'); a plus
    sign dropped ('+5' -> '5', '10^+3' -> '10^3'); scientific notation as e-notation ('2.5×10^3' ->
    '2.5e3'); thousands separators dropped ('1,234', LaTeX's '1{,}234' and '1 234' -> '1234'; '2,3' is
    kept: a pair, or a decimal comma, for math-verify to read); a vulgar fraction written n/d
    ('1½' -> '3/2')."""
    t = _PLUS.sub("", _CURRENCY_SIGN.sub(r"\1", number.strip()))
    t = _SCIENTIFIC.sub(lambda m: f"{m[1]}e{m[2] or m[3]}", t)
    return vulgar_to_ascii(_THOUSANDS.sub("", t.replace("{,}", ",")))


def value(text: str) -> Decimal | Fraction | None:
    """The exact value of a plain number: a decimal ('1,000', '1 000', '1e3', '.5', '2.5×10^3', '\\$18',
    '$5$' in math delimiters) as a Decimal, a fraction of integers ('3/4', '\\frac{3}{4}') as a
    Fraction; anything else (LaTeX, roots, sets, powers, '2,3') -> None."""
    t = canonical(text.strip().strip("$"))
    if _DECIMAL.fullmatch(t):
        return Decimal(t)
    if (m := _FRACTION.fullmatch(t)) and len(t) < 4000:  # int() refuses more than 4300 digits
        numerator, denominator = int(m[2] or m[4]), int(m[3] or m[5])
        if denominator:
            return -Fraction(numerator, denominator) if m[1] == "-" else Fraction(numerator, denominator)
    return None
