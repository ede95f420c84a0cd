"""Chat prompts: optional system prompt, few-shot turns, the question, and an answer-format instruction.

    [system] + [user: q_1 + instr, assistant: r_1] + ... + [user: q_k + instr, assistant: r_k]
             + [user: q + instr]

A row that brings its own chat (`chat`) keeps its turns in order (a system turn only as its first:
data/columns.py refuses a chat with one elsewhere); the instruction is appended to its last user turn,
few-shot turns go after its system turn, and the configured system prompt is used only when the chat
has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamrl.brief import brief, brief_error

# how a few-shot example's reference answer is written as an assistant turn, by reward.extract
SHOT_TEMPLATES = {
    "answer_is": "The answer is {answer}.",
    "boxed": "\\boxed{{{answer}}}",
    "last_number": "{answer}",
    "gsm8k": "#### {answer}",
}


def _with_instruction(text: str, instruction: str) -> str:
    return f"{text}\n{instruction}" if instruction else text


def build_messages(
    question: str,
    system_prompt: str = "",
    instruction: str = "",
    shots: Sequence[tuple[str, str]] = (),
    chat: list[dict[str, str]] | None = None,
) -> list[dict[str, str]]:
    """The chat for one problem; `shots` are (question, assistant response) pairs shown first."""
    turns = [dict(m) for m in chat] if chat else [{"role": "user", "content": question}]
    system = turns[:1] if turns[0]["role"] == "system" else []  # a chat's own, its first turn
    turns = turns[len(system) :]
    if not system and system_prompt:
        system = [{"role": "system", "content": system_prompt}]
    last_user = max(i for i, m in enumerate(turns) if m["role"] == "user")
    turns[last_user]["content"] = _with_instruction(turns[last_user]["content"], instruction)
    examples: list[dict[str, str]] = []
    for q, r in shots:
        examples += [
            {"role": "user", "content": _with_instruction(q, instruction)},
            {"role": "assistant", "content": r},
        ]
    return system + examples + turns


def shot_response(shot: dict[str, Any], extract: str, where: str) -> tuple[str, str]:
    """A configured example {question, response} (verbatim) or {question, answer} (templated)."""
    if not isinstance(shot, dict) or not isinstance(shot.get("question"), str):
        raise ValueError(
            f"{where} must be {{question: str, answer: str}} or {{question, response}}, got {shot!r}"
        )
    if "response" in shot:
        return shot["question"], str(shot["response"])
    if "answer" not in shot:
        raise ValueError(f"{where} needs an 'answer' (templated) or a 'response' (verbatim)")
    return shot["question"], SHOT_TEMPLATES.get(extract, "{answer}").format(answer=shot["answer"])


def render_prompt_ids(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """Token ids of the chat-templated prompt, ending with the assistant header; `tools` (OpenAI
    function schemas) are rendered by the template the way the model was trained to see them."""
    extra = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def template_syntax_error(e: Any, chat_template: str, model: str) -> str:
    """The one line for a chat template that does not parse (jinja2's TemplateSyntaxError `e`):
    the file (task_config.chat_template) or the model's own template, its line and the fix."""
    said = brief(str(e.message or "")) or type(e).__name__
    if chat_template:
        return f"{chat_template} line {e.lineno}: template syntax error ({said}): fix the template"
    return (
        f"model={model}: its chat template line {e.lineno}: template syntax error ({said}): give a "
        "template that parses: task_config.chat_template=FILE"
    )


def check_template(tokenizer: Any, problem: Any, chat_template: str, model: str, task: str) -> None:
    """Render `problem`'s prompt once: a chat template that refuses it (Jinja's TemplateError, such as
    Gemma-2's 'System role not supported') is a ValueError of one line naming the template's message and
    the fix: task_config.system_prompt="" when the system turn is the configured one, else a template
    that renders the chat (task_config.chat_template=FILE). `chat_template`: that key's value ("" = the
    model's own template); `task`: the task spec (an env: task brings a system prompt of its own)."""
    from jinja2 import TemplateError, TemplateSyntaxError

    try:
        render_prompt_ids(tokenizer, problem.messages)
    except TemplateSyntaxError as e:  # not a refusal: the template does not parse
        raise ValueError(template_syntax_error(e, chat_template, model)) from None
    except TemplateError as e:
        if chat_template:
            template = f"the chat template {chat_template} (task_config.chat_template)"
        else:  # the model named as the model-file refusals name it (models/model_files.py)
            template = f"model={model}: its chat template"
        said = brief_error(e)
        own = any(m["role"] == "system" for m in problem.meta.get("chat") or [])
        configured = any(m["role"] == "system" for m in problem.messages) and not own
        give = "task_config.chat_template=FILE"
        if configured and not task.startswith("env:"):
            fix = 'drop the system turn with task_config.system_prompt="", or give a template that takes '
            fix += f"one: {give}"
        elif own:
            fix = f"its row brings a system turn of its own: give a template that takes one: {give}"
        else:
            fix = f"give a template that renders it: {give}"
        raise ValueError(f"{template} refused the prompt of problem {problem.id} ({said}): {fix}") from None
