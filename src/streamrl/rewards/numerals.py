"""Numbers written with other characters than ASCII digits, made ASCII before answers are read or compared.

- decimal digits of any script (Unicode category Nd: full-width ``３``, Arabic-Indic ``٣``, Devanagari
  ``३``, ...) become their ASCII digit (``unicodedata.decimal``);
- full-width forms of ASCII (``．`` ``，`` ``－`` ``／`` ...) become the ASCII character (their NFKC form);
  the typographic minus U+2212 becomes ``-``; the Arabic decimal and thousands separators ``٫`` ``٬``
  become ``.`` and ``,``; the fraction slash U+2044 becomes ``/``;
- vulgar fractions (``¼ ½ ¾ ⅐ ... ⅞``, NFKC ``1⁄2``) become ``n/d``; a whole number right before one
  (``1½``, ``2 ¾``: at most one space between) makes a mixed number, written as one fraction in lowest
  terms (``1½`` -> ``3/2``, ``-2¾`` -> ``-11/4``, ``5+1½`` -> ``5+3/2``).

Superscripts, subscripts and circled digits (category No: ``x²``) are left alone: ``x²`` is not ``x2``.
"""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction


def _vulgar_fractions() -> dict[str, Fraction]:
    """Every single-character vulgar fraction (NFKC 'n⁄d' with both parts), by its value."""
    out = {}
    for cp in (*range(0x00BC, 0x00BF), *range(0x2150, 0x2160), 0x2189):
        num, slash, den = unicodedata.normalize("NFKC", chr(cp)).partition("\u2044")
        if slash and num.isdigit() and den.isdigit():
            out[chr(cp)] = Fraction(int(num), int(den))
    return out


VULGAR = _vulgar_fractions()
VULGAR_CLASS = "[" + "".join(VULGAR) + "]"  # a regex class matching one vulgar fraction
SPACE = r"[ \u00a0\u2009\u202f]"  # a space, no-break space, thin space or narrow no-break space
_SEPARATORS = {"\u2212": "-", "\u066b": ".", "\u066c": ",", "\u2044": "/"}
# a whole number right before a vulgar fraction, optionally signed and with one space between
_MIXED = re.compile(rf"(?:([-+]?)(\d+){SPACE}?)?({VULGAR_CLASS})")


def _ascii_char(ch: str) -> str:
    if ch.isascii():
        return ch
    if unicodedata.category(ch) == "Nd":
        return str(unicodedata.decimal(ch))
    if "\uff01" <= ch <= "\uff5e":  # full-width ASCII: NFKC is the ASCII character
        return unicodedata.normalize("NFKC", ch)
    return _SEPARATORS.get(ch, ch)


def ascii_digits(text: str) -> str:
    """Digits of every script, full-width ASCII and the minus/separators above as ASCII; vulgar
    fractions are kept (see ascii_numerals)."""
    return text if text.isascii() else "".join(_ascii_char(ch) for ch in text)


def _fraction(m: re.Match[str]) -> str:
    sign, whole, vulgar = m.group(1) or "", m.group(2), m.group(3)
    value = int(whole or 0) + VULGAR[vulgar]
    text = str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    return sign + text  # '-1½' is -(1 + 1/2): the sign applies to the whole mixed number


def vulgar_to_ascii(text: str) -> str:
    """'½' -> '1/2', '1½' -> '3/2', '-2 ¾' -> '-11/4' (text already through ascii_digits)."""
    return _MIXED.sub(_fraction, text) if any(ch in VULGAR for ch in text) else text


def ascii_numerals(text: str) -> str:
    """Both steps: '٣' -> '3', '３．５' -> '3.5', '1½' -> '3/2', '\\frac{１}{２}' -> '\\frac{1}{2}'."""
    return vulgar_to_ascii(ascii_digits(text))
