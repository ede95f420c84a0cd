"""The default engine: batched sampling with a KV cache on plain PyTorch/transformers.

`HFEngine` holds the model, the sampling generator, the policy version and the prefix cache; its rows
are decoded in `DecodeBatch`es (engine/decode_batch.py), whose forwards run one by one or, when a
batch joins a running one, as one packed forward (engine/packed.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from streamrl.config_sections import RolloutConfig
from streamrl.engine.base import GenRequest, GenResult, model_context, within_context
from streamrl.engine.decode_batch import DecodeBatch
from streamrl.engine.packed import packable
from streamrl.engine.prefix_cache import PrefixCache
from streamrl.engine.windows import sliding_window
from streamrl.models.frozen import engine_products, freeze
from streamrl.models.precision import cast_params
from streamrl.models.tied import aliases_to_skip


def load_whole(model: torch.nn.Module, state: dict[str, Any]) -> None:
    """model.load_state_dict(state), refusing (before anything is copied) a state that names a
    parameter the model lacks or leaves one out; a tied weight (the LM head sharing the embedding) may
    be given under either name, or under both with the same values."""
    expected = model.state_dict().keys()
    params = dict(model.named_parameters(remove_duplicate=False))
    given = {id(params[k]) for k in state if k in params}
    unknown = [k for k in state if k not in expected]
    missing = [k for k in expected if k not in state and not (k in params and id(params[k]) in given)]
    if unknown or missing:
        raise ValueError(
            f"new weights do not match the engine's model: {len(missing)} missing ({missing[:3]}), "
            f"{len(unknown)} unknown ({unknown[:3]})"
        )
    skip = aliases_to_skip(model, state)  # tied aliases with different values: refused
    # strict would want a tied weight under both names
    model.load_state_dict({k: v for k, v in state.items() if k not in skip}, strict=False)


class HFEngine:
    """Engine over a transformers causal LM.

    dtype None (or the model's own dtype): the engine decodes with `model` itself (in the colocated
    loop, the trainer's module). Another dtype (bf16: ~2x fp32 decode on CPU): the engine keeps its own
    copy in that dtype, `owns_weights` is True and new weights must be passed to `update_weights`.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_batch: int = 128,
        seed: int = 0,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        share_rows: bool = True,
        prefix_cache: bool = True,
        branch_min: int = RolloutConfig.spec_branch_min,
        pack: bool = True,
    ) -> None:
        self.owns_weights = dtype is not None and dtype != next(model.parameters()).dtype
        if self.owns_weights:
            model = freeze(cast_params(copy.deepcopy(model), dtype))
        else:
            engine_products(model)  # the caller's model (the policy itself when shared)
        self.model = model
        self.device = device
        self.window = sliding_window(model.config)  # sliding-window layers: the engine builds their masks
        self.context = model_context(model.config)  # prompt + completion positions at most (None: unbounded)
        self.max_batch = max_batch
        self.share_rows = share_rows  # rows with identical tokens so far share a KV row (DecodeBatch)
        self.branch_min = branch_min  # draft trees keep nodes this many drafts pass (engine/speculative.py)
        self.pack = pack  # a joining batch's prefill rides the running batch's decode step (packs())
        # the KV of the prefix the prompts share, prefilled once per weights (engine/prefix_cache.py)
        self.prefix_cache = PrefixCache() if prefix_cache else None
        self.version = 0
        self.pad_id = int(tokenizer.pad_token_id)
        self.stop_ids = stop_token_ids(model, tokenizer)
        self.generator = torch.Generator().manual_seed(seed)
        self._pending: dict[int, GenRequest] = {}
        self._done: dict[int, GenResult] = {}
        self._next_handle = 0
        self._paused = False
        # summed over decode steps: the sequences decoded and the KV-cache rows forwarded for them
        # (shared rows: fewer); their ratio is the simulator's row_share (sim/fit.py)
        self.decode_rows = 0
        self.decode_cache_rows = 0

    def packs(self) -> bool:
        """Whether batches' forwards can run as one (engine/packed.py): asked for, no sliding layers, and
        the model passes packable's check (run once per model, then read from the model)."""
        return self.pack and self.window is None and packable(self.model, self.device, self.pad_id)

    def submit(self, request: GenRequest) -> int:
        if not request.prompt_ids:
            raise ValueError("GenRequest.prompt_ids is empty")
        handle = self._next_handle
        self._next_handle += 1
        request = within_context(request, self.context)
        if request.max_new_tokens < 1:  # a prompt that fills the context: nothing to decode
            self._done[handle] = GenResult(request=request, finish_reason="length")
        else:
            self._pending[handle] = request
        return handle

    def abort(self, handle: int) -> None:
        req = self._pending.pop(handle, None)
        if req is not None:
            self._done[handle] = GenResult(request=req, finish_reason="abort")

    def wait(self, handles: list[int], stop: Callable[[], bool] | None = None) -> list[GenResult]:
        if self._paused:
            raise RuntimeError("engine is paused; call resume() before wait()")
        # similar prompt lengths together: less left padding per batch
        todo = sorted(
            (h for h in handles if h in self._pending), key=lambda h: len(self._pending[h].prompt_ids)
        )
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for i in range(0, len(todo), self.max_batch):
                    chunk = todo[i : i + self.max_batch]
                    batch = DecodeBatch(self, [self._pending[h] for h in chunk])
                    while not batch.done and not (stop is not None and stop()):
                        batch.step()
                    if not batch.done:  # stopped: its rows still decoding, and the batches after, abort
                        running = set(batch.active)
                        for j, (h, res) in enumerate(zip(chunk, batch.results)):
                            if j not in running:  # finished before the stop: kept
                                del self._pending[h]
                                self._done[h] = res
                        for h in todo[i:]:
                            self.abort(h)
                        break
                    for h, res in zip(chunk, batch.results):
                        del self._pending[h]
                        self._done[h] = res
        finally:
            self.model.train(was_training)
        return [self._done.pop(h) for h in handles]

    def generate(self, requests: list[GenRequest], stop: Callable[[], bool] | None = None) -> list[GenResult]:
        return self.wait([self.submit(r) for r in requests], stop)

    def update_weights(self, state: dict[str, Any] | None, version: int) -> None:
        """state None: the weights are already in `model` (shared module or copied in by the caller)."""
        if state is not None:
            load_whole(self.model, state)  # casts to the engine's dtype
        elif self.owns_weights and version != self.version:
            raise RuntimeError(
                "this engine keeps its own weights (rollout.precision differs from the trainer's model): "
                "pass the new state to update_weights"
            )
        self.version = version

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False


def stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """EOS of the tokenizer and the generation config, plus ChatML's end-of-turn token if present."""
    ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(int(i) for i in gen_eos)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return ids


def stop_ids_from_dir(model_dir: Any, tokenizer: Any) -> set[int]:
    """stop_token_ids without loading the weights (engines that load the checkpoint themselves)."""
    from types import SimpleNamespace

    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(model_dir)
    except OSError:  # no generation_config.json: the tokenizer's EOS and <|im_end|> only
        gen = None
    return stop_token_ids(SimpleNamespace(generation_config=gen), tokenizer)
