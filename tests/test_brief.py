"""streamrl/brief.py: another program's words inside one of our one-line messages."""

from __future__ import annotations

from streamrl.brief import brief, brief_error


def test_whitespace_collapses_to_one_line_and_a_long_text_is_cut_with_a_mark():
    assert brief("  a\n  b\t\tc \r\n") == "a b c"
    assert brief("x" * 8, 8) == "x" * 8
    assert brief("x" * 9, 8) == "xxxxx..."
    assert brief("line one\n" * 100) == ("line one " * 100)[:297] + "..."


def test_an_exception_reads_as_its_message_or_its_type_and_typed_as_both():
    assert brief_error(ValueError("bad\n value")) == "bad value"
    assert brief_error(ValueError("bad\n value"), typed=True) == "ValueError: bad value"
    assert brief_error(KeyError()) == "KeyError"
    assert brief_error(RuntimeError(" \n "), typed=True) == "RuntimeError"
    assert brief_error(RuntimeError(" \n ")) == "RuntimeError"
    assert brief_error(OSError("y" * 50), 10, typed=True) == "OSError: yyyyyyy..."
