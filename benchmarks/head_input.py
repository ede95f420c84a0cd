"""What a one-row prefill and the prefix computation cost, with the LM head's input handled two ways.

    python benchmarks/head_input.py [--model DIR_OR_NAME] [--repeats 9]

A prefill runs the LM head on its last position only: a view [R, 1, H] of the hidden states [R, T, H].
For a bf16 head that does not require grad (the engine's copy, the rollout worker's model) torch's
linear does not fold such a view into one matrix product; it copies the whole [V, H] weight once per
row for a batched product. A one-row view [1, 1, H] is "contiguous" to torch (the strides of size-1
dimensions are ignored), so making the input `.contiguous()` leaves it as it is. Two forwards the
rollout worker runs are timed on the model frozen as the worker freezes it (`models/frozen.py:
freeze`, no parameter requires grad), one thread, in the engine's precision (bf16 where the CPU
multiplies it natively, else fp32), the median of --repeats after a warm-up:

    one-row prefill   one group (one distinct prompt) started alone (DecodeBatch), as when a group
                      arrives at an idle engine; the head hook `.contiguous()` against the dense copy
                      `models/frozen.py` makes (`dense`)
    prefix            the prompt prefix's KV, recomputed at every new policy version: the model's
                      forward with the head on the last position and `.contiguous()` against the
                      decoder alone (engine/prefix_cache.py)

Not a test: figures, not assertions.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from spec_engine import engine_job

from streamrl.engine.base import GenRequest
from streamrl.engine.decode_batch import DecodeBatch
from streamrl.engine.kv_cache import growing_cache
from streamrl.engine.prefix_cache import PrefixCache, shared_length
from streamrl.models.cache_kwarg import cache_kwargs
from streamrl.models.frozen import _contiguous_input, freeze


def _old_rule(_m: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    return (args[0].contiguous(), *args[1:]), kwargs


def _head_hook(head: torch.nn.Module, hook: Callable) -> None:
    head._forward_pre_hooks.clear()
    head.register_forward_pre_hook(hook, with_kwargs=True)


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _prefix_through_the_model(model: Any, tokens: list[int]) -> None:
    cache = growing_cache(len(tokens), len(tokens))
    ids = torch.tensor([tokens])
    model(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        position_ids=torch.arange(len(tokens))[None],
        **cache_kwargs(model, cache),
        use_cache=True,
        logits_to_keep=1,
    )


def main() -> None:
    args, engine, prompts = engine_job(__doc__, {"--repeats": 9})
    freeze(engine.model)  # as the rollout worker's model: no parameter requires grad
    engine.prefix_cache = None  # the whole prompt in the prefill, the same work in both arms
    head = engine.model.get_output_embeddings()
    prefix = prompts[0][: shared_length(prompts[0], prompts[1:])]
    group = [GenRequest(prompts[0], args.max_new_tokens, 1.0, 1.0, 0)] * args.samples
    rows = []
    with torch.inference_mode():
        for name, hook in ((".contiguous()", _old_rule), ("dense copy", _contiguous_input)):
            _head_hook(head, hook)
            rows.append((name, median_ms(lambda: DecodeBatch(engine, group), args.repeats)))
        _head_hook(head, _old_rule)
        old = median_ms(lambda: _prefix_through_the_model(engine.model, prefix), args.repeats)
        _head_hook(head, _contiguous_input)
        cache = PrefixCache()
        new = median_ms(lambda: cache._compute(engine.model, prefix, (0, 0, 0), "cpu"), args.repeats)
    print(f"median of {args.repeats}; prompt {len(prompts[0])} tokens")
    (a_name, a), (b_name, b) = rows
    print(f"one-row prefill: head input {a_name} {a:.1f} ms, {b_name} {b:.1f} ms ({a / b:.2f}x)")
    print(
        f"prefix of {len(prefix)} tokens: through the model and its head {old:.1f} ms, "
        f"the decoder alone {new:.1f} ms ({old / new:.2f}x)"
    )


if __name__ == "__main__":
    main()
