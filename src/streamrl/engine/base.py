"""What rollout engines implement: `Engine` (submit/wait: one-shot generation, evaluation) and
`Decoder` (continuous decoding driven step by step by a rollout worker, with weight updates between
steps), their request/result types and the weight-update modes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

# how new weights reach sequences being decoded: `inflight` keeps their KV caches (PipelineRL),
# `interrupt` recomputes them under the new weights before the next token (AReaL)
WEIGHT_MODES = ("inflight", "interrupt")
# the default engine's prefix cache (engine/prefix_cache.py) keeps shared prompt openings at least this
# long; shorter ones are prefilled with the rest of the prompt (the pipeline simulator, sim/fit.py, too)
MIN_PREFIX = 16


def generate(
    engine: Any, requests: list[GenRequest], stop: Callable[[], bool] | None = None
) -> list[GenResult]:
    """engine.generate(requests), with `stop` passed only when given: an engine whose generate takes none
    (vLLM's) serves every caller that does not stop it."""
    return engine.generate(requests) if stop is None else engine.generate(requests, stop=stop)


def decoded_rows(engine: Any) -> tuple[int, int]:
    """(sequences, KV-cache rows) an engine's decode steps have forwarded so far: the default engine
    counts them (engine/decode_batch.py: rows with identical tokens so far share one); (0, 0) for an
    engine that does not."""
    return getattr(engine, "decode_rows", 0), getattr(engine, "decode_cache_rows", 0)


@dataclass(frozen=True)
class Draft:
    """An earlier response to the same prompt, offered as a speculative prefix (engine/speculative.py):
    token_ids [D] and the log-probs [D] the policy that generated them gave them (under its sampling
    distribution; for a token the lenient rule decided, the verifying policy's, not the mixture's)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"Draft: {len(self.token_ids)} token ids but {len(self.logprobs)} log-probs: "
                "give one log-prob per token"
            )


@dataclass
class GenRequest:
    """prompt_ids: [P]. temperature 0 means greedy.

    drafts: earlier responses to this prompt; the engine verifies them as one token tree (with the
    drafts of the other requests of the same prompt) under the current weights and decodes on from
    where the response leaves the tree (engine/speculative.py). A greedy request ignores them."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    tag: Any = None  # caller's handle (e.g. the sample id), returned untouched
    drafts: tuple[Draft, ...] = ()
    lenience: float = 0.0  # 0: exact verification; > 0: SPEC-RL's lenient acceptance (biased)

    @property
    def offers_drafts(self) -> bool:
        """A sampled request with a non-empty draft: its tokens are decided against its prompt's draft tree
        (none may be, when the tree is cut before its first token)."""
        return self.temperature > 0 and any(d.token_ids for d in self.drafts)


def model_context(config: Any) -> int | None:
    """The positions a transformers config's model can attend over (max_position_embeddings, which
    GPT-2-style configs map n_positions to); None when it does not say."""
    context = getattr(config, "max_position_embeddings", None)
    return context if isinstance(context, int) and context > 0 else None


def within_context(request: GenRequest, context: int | None) -> GenRequest:
    """The request with max_new_tokens cut so that prompt + completion fit the model's context (a
    prompt that fills it gets 0: it finishes at once with finish reason "length")."""
    if context is None or len(request.prompt_ids) + request.max_new_tokens <= context:
        return request
    return replace(request, max_new_tokens=max(0, context - len(request.prompt_ids)))


@dataclass
class GenResult:
    """token_ids, logprobs, versions: [C] each; logprobs are under the sampling distribution."""

    request: GenRequest
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str = "length"  # "stop" (an end token was sampled) | "length" | "abort"
    draft_tokens: int = 0  # tokens decided against a draft proposal (accepted or drawn from the residual)
    draft_accepted: int = 0  # of which the proposed token was accepted
    tree_tokens: int = 0  # the first tokens that are a path of the drafts' tree: emitted with no decode step
    # lenient verification: the verifying policy's log p of the first len(policy_logprobs) tokens, where
    # the lenient rule decided some of them (their logprobs are the mixture's log b); past it, logprobs
    policy_logprobs: list[float] = field(default_factory=list)


class Engine(Protocol):
    version: int

    def submit(self, request: GenRequest) -> int:
        """Queue a request; returns a handle."""
        ...

    def wait(self, handles: list[int], stop: Callable[[], bool] | None = None) -> list[GenResult]:
        """Generate until the given requests are finished; results in the order of `handles`. `stop` is
        asked before each decode step: once it says True, the requests not finished end with
        finish_reason "abort"."""
        ...

    def abort(self, handle: int) -> None: ...

    def update_weights(self, state: dict[str, Any] | None, version: int) -> None:
        """Load new weights (None: the engine shares the trainer's module) and set the policy version."""
        ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class Decoder(Protocol):
    """Continuous decoding: requests join between steps, each step samples one token for every running
    row and returns the results that finished. Both engines implement it (engine/continuous.py over
    HFEngine, engine/vllm.py); the rollout worker drives it."""

    @property
    def version(self) -> int:
        """The policy version of the weights the next tokens come from."""
        ...

    @property
    def idle(self) -> bool:
        """Nothing waiting and nothing running."""
        ...

    def add(self, requests: list[GenRequest]) -> None: ...

    def step(self) -> list[GenResult]: ...

    def update_weights(self, state: dict[str, Any] | None, version: int) -> None:
        """New weights between steps (None: already copied into the engine's model), per WEIGHT_MODES."""
        ...


def check_weight_mode(mode: str) -> None:
    if mode not in WEIGHT_MODES:
        raise ValueError(f"unknown weight update mode '{mode}'; choose from {', '.join(WEIGHT_MODES)}")
