"""The column mapping of tabular sources: one record -> one problem row, or a ValueError saying why not.

`task_config.columns` maps problem fields to a source's columns (defaults in brackets):

    prompt [prompt]      the question text (a string), or a chat (TRL's conversational prompts), or
    messages [-]         a chat: a list of {role, content}; the last user turn is the question, and a
                         system turn may only come first
    answer [answer]      the reference answer (scored with math-verify), or a list of accepted ones
                         (data/answers.py); a GSM8K-style solution ("...\\n#### 72") is reduced to
                         what follows its last "####"
    id [-]               a stable row id (default: a hash of the prompt)
    task [-]             the row's scorer: "math" or "code" (default: "code" when it has tests)
    tests [-]            stdin/stdout tests [{input, output}, ...] run in the sandbox

A column name may be a dotted path into nested objects (`answer: meta.final`).
"""

from __future__ import annotations

import json
from typing import Any

from streamrl.data.answers import accepted_answers, code_answer

DEFAULT_COLUMNS = {"prompt": "prompt", "answer": "answer"}
COLUMN_KEYS = ("prompt", "messages", "answer", "id", "task", "tests")


def resolve_columns(columns: dict[str, Any] | None) -> dict[str, str]:
    """The column mapping with defaults; an unknown key is a one-line error naming the valid ones."""
    out = dict(DEFAULT_COLUMNS)
    for k, v in (columns or {}).items():
        if k not in COLUMN_KEYS:
            raise ValueError(f"task_config.columns: unknown key '{k}'; valid keys: {', '.join(COLUMN_KEYS)}")
        if k == "answer" and v is None:  # rows without a reference: your own reward functions score them
            del out["answer"]
            continue
        if not isinstance(v, str) or not v:
            raise ValueError(f"task_config.columns.{k} must be a column name, got {v!r}")
        out[k] = v
    if "messages" in out and "prompt" in (columns or {}):
        raise ValueError(
            "task_config.columns: set prompt or messages, not both (messages: a chat whose last user turn "
            "is the question)"
        )
    if "messages" in out:
        del out["prompt"]  # a chat column replaces the default prompt column
    return out


def check_question_column(label: str, columns: dict[str, str], names: list[str] | None) -> None:
    """One line when the source has no column for the question at all (names: its columns, if known)."""
    column = columns.get("messages") or columns["prompt"]
    if names is not None and column.split(".")[0] not in names:
        key = "messages" if "messages" in columns else "prompt"
        raise ValueError(
            f"{label}: no column '{column}' for the {key} (its columns: {', '.join(names)}); map it with "
            f"task_config.columns={{{key}: <column>}}"
        )


class MissingColumn(ValueError):
    """A record without a mapped column (`missing column 'X'`); `column`: its name."""

    def __init__(self, column: str) -> None:
        super().__init__(f"missing column '{column}'")
        self.column = column


def _get(rec: dict[str, Any], column: str) -> Any:
    """rec[column], following dots into nested objects; MissingColumn names the missing column."""
    cur: Any = rec
    for part in column.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise MissingColumn(column)
        cur = cur[part]
    return cur


def _optional(rec: dict[str, Any], column: str) -> Any:
    """rec[column], or None where the row does not have it: a file that mixes math and code rows leaves
    the tests out of its math rows and the answer out of its code rows (a table fills them with null)."""
    try:
        value = _get(rec, column)
    except MissingColumn:
        return None
    return None if value == "" else value


def _text(value: str, column: str) -> str:
    """`value`, refused when it is not valid Unicode (a lone surrogate: no tokenizer or file takes it)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"column '{column}' is not valid Unicode text (a lone surrogate)") from None
    return value


def _question(rec: dict[str, Any], columns: dict[str, str]) -> tuple[str, list[dict[str, str]] | None]:
    """(the question, the chat or None). A prompt column holding a list of messages (TRL's
    conversational format) is read as a chat, as a messages column is."""
    column = columns.get("messages") or columns["prompt"]
    value = _get(rec, column)
    if isinstance(value, list) or "messages" in columns:
        return _chat(value, column)
    if isinstance(value, str) and value.strip():
        return _text(value, column), None
    if value is None or isinstance(value, str):
        raise ValueError(f"column '{column}' must be a non-empty string")
    raise ValueError(
        f"column '{column}' must be a non-empty string or a chat (a list of {{role, content}}), got "
        f"{type(value).__name__}"
    )


def _chat(messages: Any, column: str) -> tuple[str, list[dict[str, str]]]:
    """(the last user turn, the turns) of a chat column; ValueError says what is wrong. A system turn
    is the chat's first or none: chat templates differ on others (ChatML ones render one in place,
    Gemma's refuses the chat: its roles must alternate), so a chat with one elsewhere is refused."""
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in messages
    ):
        raise ValueError(f"column '{column}' must be a list of {{role, content}}")
    users = [m["content"] for m in messages if m["role"] == "user"]
    if not users:
        raise ValueError(f"column '{column}' has no user turn")
    if not users[-1].strip():
        raise ValueError(f"column '{column}' has an empty last user turn")
    if messages[-1]["role"] == "assistant":  # an SFT-style chat: the reply would sit in the prompt
        raise ValueError(
            f"column '{column}' ends with an assistant turn: a prompt ends with the user's "
            "turn (drop the reply from the column; map a reference with task_config.columns.answer)"
        )
    late = next((i for i, m in enumerate(messages) if i and m["role"] == "system"), None)
    if late is not None:
        raise ValueError(
            f"column '{column}' has a system turn at turn {late + 1}: only a chat's first turn may be one "
            "(chat templates differ on others); merge it into the first, or drop it"
        )
    turns = [{"role": str(m["role"]), "content": _text(m["content"], column)} for m in messages]
    return users[-1], turns


def row_key(question: str, messages: list[dict[str, str]] | None) -> str:
    """What makes two rows the same prompt: the question text, or a chat's every turn (two chats that
    end with the same user turn are different prompts)."""
    if not messages:
        return question
    return json.dumps([[m["role"], m["content"]] for m in messages], ensure_ascii=False)


def held_key(row: dict[str, Any]) -> str:
    """The key a parsed row is held out by, as data/task.py prompt_key keys its problem: a chat of one
    user turn by its question, any other row by row_key."""
    messages = row["messages"]
    if messages and len(messages) == 1 and messages[0]["role"] == "user":
        return row["question"]
    return row["key"]


def excluded(row: dict[str, Any], exclude: set[str]) -> bool:
    """Is a parsed row one never to train on? `exclude` holds prompt keys (held-out rows, drawn
    few-shot examples; a chat of one user turn is keyed by its question, data/task.py prompt_key) and
    question texts (given few-shot examples): a row whose question (a chat's last user turn) is held
    out as a plain question or a one-turn chat is excluded; a chat that only shares the last turn of a
    held-out chat of several turns is not."""
    return row["key"] in exclude or row["question"] in exclude


def parse_row(rec: Any, columns: dict[str, str]) -> dict[str, Any]:
    """One record -> {question, messages, key, answer, answers, id, kind, tests, columns}; ValueError says
    what is wrong. `key`: the prompt's identity (row_key); `answer`: the reference (the first accepted
    answer); `answers`: every accepted answer when the cell was a list (data/answers.py), else None;
    `columns`: the record's own fields, which reward functions receive (rewards/user_fns.py)."""
    from streamrl.rewards.code import validate_tests

    if not isinstance(rec, dict):
        raise ValueError(f"expected an object, got {type(rec).__name__}")
    question, messages = _question(rec, columns)
    tests = None
    raw = _optional(rec, columns["tests"]) if "tests" in columns else None
    if raw in ([], "[]") and _optional(rec, columns.get("answer") or "") is not None:
        raw = None  # a math row of a mixed file may write its tests as an empty list
    if raw is not None:
        try:
            parsed = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError as e:
            raise ValueError(f"column '{columns['tests']}' is not valid JSON ({e})") from None
        tests = validate_tests(parsed, "tests")
    kind = str(_get(rec, columns["task"])) if "task" in columns else ("code" if tests else "math")
    if kind not in ("math", "code"):
        raise ValueError(f"column '{columns['task']}' must be 'math' or 'code', got {kind!r}")
    if kind == "code" and not tests:
        raise ValueError("a code row needs tests (map them with task_config.columns.tests)")
    answer, answers = "", None  # task_config.columns.answer=null: no reference answers
    if "answer" in columns:
        if kind == "code":  # the tests score a code row: it may leave the answer out
            answer = code_answer(_optional(rec, columns["answer"]), columns["answer"])
        else:
            accepted, listed = accepted_answers(_get(rec, columns["answer"]), columns["answer"])
            answer, answers = accepted[0], (accepted if listed else None)
    rid = None
    if "id" in columns:
        rid = _get(rec, columns["id"])
        if rid is None or str(rid).strip() == "":
            raise ValueError(f"column '{columns['id']}' (the row id) is empty")
        rid = str(rid)
    return {
        "question": question,
        "messages": messages,
        "key": row_key(question, messages),
        "answer": answer,
        "answers": answers,
        "id": rid,
        "kind": kind,
        "tests": tests,
        "columns": rec,
    }
