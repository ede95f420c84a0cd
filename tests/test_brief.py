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


def test_first_line_takes_a_messages_first_non_blank_line_before_the_rest():
    trace = RuntimeError("\n  Timed out  waiting\nException raised from wait at store.cpp:42\nframe #0")
    assert brief_error(trace, first_line=True) == "Timed out waiting"
    assert brief_error(trace, typed=True, first_line=True) == "RuntimeError: Timed out waiting"
    assert brief_error(RuntimeError(" \n "), typed=True, first_line=True) == "RuntimeError"
    assert brief_error(OSError("z" * 50 + "\nmore"), 10, first_line=True) == "zzzzzzz..."
