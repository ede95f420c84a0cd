"""The default engine with and without shared rows, the same weights and seeds, one thread.

    python benchmarks/shared_rows.py [--model DIR_OR_NAME] [--prompts 8] [--samples 8] [--rounds 6]

Shared rows (engine/hf.py): samples whose tokens so far are identical share one KV-cache row and one
forward. Each round generates --prompts held-out rg:chain_sum prompts x --samples samples twice, with
sharing and without, from the same generator seed (the order alternates between rounds). Prints per
round and pooled the tokens per second of each, their ratio and the rows forwarded per decode step with
sharing (of the samples still decoding). A trained checkpoint (a run directory's `checkpoint/`) answers
in a few confident tokens, so its samples share more than the base model's.
Not a test: figures, not assertions.
"""

from __future__ import annotations

import time

import torch
from spec_engine import ab_rounds, engine_job

from streamrl.engine.base import GenRequest


class ForwardRows:
    """Counts the rows the model forwards per call (a forward hook on the engine's model)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = self.rows = 0
        model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] == 1:  # a decode step (prefills have wider inputs)
            self.calls += 1
            self.rows += ids.shape[0]


def main() -> None:
    args, engine, prompts = engine_job(__doc__)
    counter = ForwardRows(engine.model)
    requests = [
        GenRequest(ids, args.max_new_tokens, 1.0, 1.0, i)
        for i, ids in enumerate(prompts)
        for _ in range(args.samples)
    ]

    def run(share: bool, seed: int) -> tuple[float, int, int, int]:
        engine.share_rows = share
        engine.generator.manual_seed(seed)
        calls, rows = counter.calls, counter.rows
        t0 = time.perf_counter()
        out = engine.generate(requests)
        dt = time.perf_counter() - t0
        return dt, sum(len(r.token_ids) for r in out), counter.calls - calls, counter.rows - rows

    run(True, 0)  # warm-up
    run(False, 0)
    total = {True: [0.0, 0], False: [0.0, 0]}
    shared_calls = shared_rows = plain_rows = 0
    print(f"{args.prompts} prompts x {args.samples} samples")
    head = ("round", "plain tok/s", "shared tok/s", "ratio", "rows/step plain", "shared")
    print("{:>5} {:>12} {:>13} {:>6} {:>16} {:>7}".format(*head))
    for n, res in ab_rounds(args.rounds, run):
        for share, r in res.items():
            total[share][0] += r[0]
            total[share][1] += r[1]
        shared_calls += res[True][2]
        shared_rows += res[True][3]
        plain_rows += res[False][3]
        plain, shared = (res[s][1] / res[s][0] for s in (False, True))
        print(
            f"{n:>5} {plain:>12.1f} {shared:>13.1f} {shared / plain:>5.2f}x "
            f"{res[False][3] / max(res[False][2], 1):>16.1f} {res[True][3] / max(res[True][2], 1):>7.1f}"
        )
    plain, shared = (total[s][1] / total[s][0] for s in (False, True))
    print(
        f"pooled: plain {plain:.1f} tok/s, shared {shared:.1f} tok/s ({shared / plain:.2f}x); "
        f"rows forwarded in decode steps: {shared_rows} shared vs {plain_rows} plain "
        f"({shared_rows / max(plain_rows, 1):.0%})"
    )


if __name__ == "__main__":
    main()
