"""Render an environment observation as the next chat turn, as token ids appended to the history.

The history (prompt + turns so far) is never re-tokenised: only the new suffix is. The suffix is
derived from the tokenizer's own chat template with a fixed dummy conversation:

    header = render([S, U], add_generation_prompt=True)       # ... '<|im_start|>assistant\\n'
    turn   = render([S, U, assistant MARK])                    # header + MARK + close
    full   = render([S, U, assistant MARK, obs], add_generation_prompt=True)
    close  = turn[len(header) + len(MARK):]                    # '<|im_end|>\\n' in ChatML
    open   = full[len(turn):]                                  # '<|im_start|>user\\nOBS<|im_end|>\\n
                                                               #  <|im_start|>assistant\\n'

suffix = close + open, where the end-of-turn token the model already sampled (e.g. `<|im_end|>`) is
dropped from the front of `close`. A turn cut by the token cap has no end-of-turn token, so the whole
`close` is appended (not trained on): every turn in the context is well formed. Templates for which
these prefixes do not line up (ones that rewrite earlier turns) are refused with a clear error.
"""

from __future__ import annotations

from typing import Any

_MARK = "MODELTURN7f3a"
_BASE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]


class TurnRenderer:
    def __init__(self, tokenizer: Any, role: str = "user") -> None:
        self.tokenizer = tokenizer
        self.role = role
        self._turn_msgs = [*_BASE, {"role": "assistant", "content": _MARK}]
        header = self._render(_BASE, True)
        self._turn = self._render(self._turn_msgs, False)
        if not self._turn.startswith(header + _MARK):
            raise ValueError(
                "tokenizer chat template: an assistant turn does not extend the generation prompt, so "
                "observations cannot be appended without re-tokenising; use a ChatML-style template"
            )
        self.close = self._turn[len(header) + len(_MARK) :]

    def _render(self, messages: list[dict[str, str]], gen: bool) -> str:
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen))

    def bridge_text(self, observation: str, last_token_text: str | None) -> str:
        """Text that closes the model's turn, holds `observation` as a `role` turn and opens the next
        assistant turn. last_token_text: the model's end-of-turn token text if it sampled one."""
        full = self._render([*self._turn_msgs, {"role": self.role, "content": observation}], True)
        if not full.startswith(self._turn):
            raise ValueError(
                "tokenizer chat template rewrites earlier turns when a message is added; observations "
                "cannot be appended token-in-token-out with it"
            )
        close = self.close
        if last_token_text and close.startswith(last_token_text):
            close = close[len(last_token_text) :]
        return close + full[len(self._turn) :]

    def bridge_ids(self, observation: str, last_token: int | None) -> list[int]:
        """Token ids of `bridge_text`; last_token: the end-of-turn id the model sampled, else None."""
        eot = None if last_token is None else self.tokenizer.decode([last_token])
        text = self.bridge_text(observation, eot)
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))
