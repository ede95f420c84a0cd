"""Chat prompts: optional system prompt, the question, and an instruction about the answer format."""

from __future__ import annotations

from typing import Any


def build_messages(question: str, system_prompt: str = "", instruction: str = "") -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    content = f"{question}\n{instruction}" if instruction else question
    messages.append({"role": "user", "content": content})
    return messages


def render_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the chat-templated prompt, ending with the assistant header."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False).input_ids)
