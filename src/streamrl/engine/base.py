"""The Engine protocol every rollout engine implements, and its request/result types."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class GenRequest:
    """prompt_ids: [P]. temperature 0 means greedy."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    tag: Any = None  # caller's handle (e.g. the sample id), returned untouched


@dataclass
class GenResult:
    """token_ids, logprobs, versions: [C] each; logprobs are under the sampling distribution."""

    request: GenRequest
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str = "length"  # "stop" (an end token was sampled) | "length" | "abort"


class Engine(Protocol):
    version: int

    def submit(self, request: GenRequest) -> int:
        """Queue a request; returns a handle."""
        ...

    def wait(self, handles: list[int]) -> list[GenResult]:
        """Generate until the given requests are finished; results in the order of `handles`."""
        ...

    def abort(self, handle: int) -> None: ...

    def update_weights(self, state: dict[str, Any] | None, version: int) -> None:
        """Load new weights (None: the engine shares the trainer's module) and set the policy version."""
        ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...
