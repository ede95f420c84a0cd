"""The default engine with and without its prompt prefix cache, requests arriving as in a rollout worker.

    python benchmarks/prefix_cache.py [--model DIR_OR_NAME] [--prompts 8] [--samples 8] [--rounds 6]
                                      [--max-new-tokens 48] [--groups 48] [--update-every 8]

The prefix cache (engine/prefix_cache.py) keeps the KV of the tokens the prompts share (the chat
template's system prompt and instruction). Each round runs --groups groups of --samples samples of
held-out rg:chain_sum prompts through the continuous decoder the way a rollout worker does: a group
arrives whenever one finishes, --prompts groups in flight, and a new policy version every
--update-every groups (the prefix is then recomputed; the weights stay the same, so both arms draw
from one distribution). Both arms run every round from the same generator seed, the order alternating,
one thread, in the engine's precision. Prints per round and pooled the tokens per second of each,
their ratio and the prompt tokens each forwarded. Not a test: figures, not assertions.
"""

from __future__ import annotations

import time

import torch
from spec_engine import ab_rounds, engine_job

from streamrl.engine.base import GenRequest
from streamrl.engine.continuous import ContinuousDecoder
from streamrl.engine.prefix_cache import PrefixCache


class PrefillTokens:
    """Counts the tokens the engine's model forwards outside decode steps (prefills, prefix computations)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.tokens = 0
        model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] > 1:
            self.tokens += ids.numel()


def main() -> None:
    args, engine, prompts = engine_job(__doc__, {"--groups": 48, "--update-every": 8})
    counter = PrefillTokens(engine.model)

    def run(cached: bool, seed: int) -> tuple[float, int, int]:
        engine.prefix_cache = PrefixCache() if cached else None
        engine.generator.manual_seed(seed)
        dec = ContinuousDecoder(engine, "inflight")
        before = counter.tokens
        sent = done = tokens = 0
        pending: dict[int, int] = {}
        t0 = time.perf_counter()
        while done < args.groups:
            while sent < args.groups and len(pending) < args.prompts:
                ids = prompts[sent % len(prompts)]
                dec.add([GenRequest(ids, args.max_new_tokens, 1.0, 1.0, sent)] * args.samples)
                pending[sent] = args.samples
                sent += 1
            for res in dec.step():
                tokens += len(res.token_ids)
                pending[res.request.tag] -= 1
                if not pending[res.request.tag]:
                    del pending[res.request.tag]
                    done += 1
                    if done % args.update_every == 0:
                        dec.update_weights(None, engine.version + 1)
        return time.perf_counter() - t0, tokens, counter.tokens - before

    run(True, 0)  # warm-up
    run(False, 0)
    total = {True: [0.0, 0, 0], False: [0.0, 0, 0]}
    print(
        f"{args.groups} groups of {args.samples} over {args.prompts} prompts, {args.prompts} "
        f"in flight, a new version every {args.update_every} groups"
    )
    head = ("round", "plain tok/s", "cached tok/s", "ratio", "prompt tokens plain", "cached")
    print("{:>5} {:>12} {:>13} {:>6} {:>20} {:>7}".format(*head))
    for n, res in ab_rounds(args.rounds, run):
        for cached, r in res.items():
            total[cached] = [a + b for a, b in zip(total[cached], r)]
        plain, cached = (res[c][1] / res[c][0] for c in (False, True))
        print(
            f"{n:>5} {plain:>12.1f} {cached:>13.1f} {cached / plain:>5.2f}x "
            f"{res[False][2]:>20} {res[True][2]:>7}"
        )
    plain, cached = (total[c][1] / total[c][0] for c in (False, True))
    print(
        f"pooled: plain {plain:.1f} tok/s, cached {cached:.1f} tok/s ({cached / plain:.2f}x); prompt tokens "
        f"forwarded: {total[True][2]} cached vs {total[False][2]} plain "
        f"({total[True][2] / max(total[False][2], 1):.0%})"
    )


if __name__ == "__main__":
    main()
