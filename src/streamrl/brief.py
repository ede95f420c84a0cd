"""Words from elsewhere (an exception, a server's reply) inside one of our one-line messages: their
whitespace collapsed, so the message stays one line, and cut to a length a terminal line can show."""

from __future__ import annotations


def brief(text: str, limit: int = 300) -> str:
    """`text` on one line, its runs of whitespace one space each, at most `limit` characters (a cut
    one ends in "...")."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def brief_error(e: BaseException, limit: int = 300, typed: bool = False, first_line: bool = False) -> str:
    """An exception's message as `brief` gives it, or its type's name when the message is empty;
    typed: "Type: message" (for an exception from user code, whose type is half of what went wrong);
    first_line: its first non-blank line only (a library's message whose later lines are a trace)."""
    text = str(e)
    if first_line:
        text = next((line for line in text.splitlines() if line.strip()), "")
    text = brief(text, limit)
    if not text:
        return type(e).__name__
    return f"{type(e).__name__}: {text}" if typed else text
