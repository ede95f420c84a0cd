"""The default engine with and without speculative drafts, the same weights, one thread.

    python benchmarks/spec_engine.py [--model DIR_OR_NAME] [--prompts 8] [--samples 8] [--rounds 6]

Every round generates --prompts held-out rg:chain_sum prompts x --samples samples plainly, then again
with that round's plain responses as each prompt's drafts (exact verification): the best case for the
drafts of a multi-epoch job, whose policy has not moved since. Prints per round and pooled the tokens
per second of each, the acceptance rate and the share of response tokens that came from drafts. A
trained checkpoint (a run directory's `checkpoint/`) answers in a few confident tokens, as the second
epoch of the default job does; the base model's answers are longer and less certain.
Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator

import torch

from streamrl.data.prompts import render_prompt_ids
from streamrl.data.task import default_task_args
from streamrl.engine.base import Draft, GenRequest, GenResult
from streamrl.engine.hf import HFEngine
from streamrl.models.precision import dtype_name, precision_dtype
from streamrl.models.startup import start_model
from streamrl.tasks import make_task

TASK = "rg:chain_sum"


def timed(engine: HFEngine, requests: list[GenRequest]) -> tuple[float, list[GenResult]]:
    t0 = time.perf_counter()
    out = engine.generate(requests)
    return time.perf_counter() - t0, out


def ab_rounds(rounds: int, run: Callable[[bool, int], tuple]) -> Iterator[tuple[int, dict[bool, tuple]]]:
    """An A/B benchmark's rounds: round n runs both arms (False, True) from generator seed 1000 + n, the
    order alternating between rounds; yields (n, {arm: what run(arm, seed) returned})."""
    for n in range(rounds):
        yield n, {arm: run(arm, 1000 + n) for arm in ((True, False) if n % 2 else (False, True))}


def engine_job(
    doc: str | None, more: dict[str, int] | None = None
) -> tuple[argparse.Namespace, HFEngine, list[list[int]]]:
    """The command line of the engine benchmarks (this one, shared_rows.py, prefix_cache.py) and what it
    sets up: the model in the engine's precision (bf16 where the CPU multiplies it natively, else fp32)
    at one thread, the default engine, and --prompts held-out rg:chain_sum
    prompts; prints the model and its dtype. `more`: a benchmark's own integer options and their defaults."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (more or {}).items():
        ap.add_argument(name, type=int, default=default)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a model name or a checkpoint dir")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()
    torch.set_num_threads(1)
    started = start_model(args.model, dtype=precision_dtype("auto", "cpu"))  # the engine's, as in a run
    engine = HFEngine(started.model, started.tokenizer, max_batch=128, seed=0)
    print(f"{args.model} in {dtype_name(engine.model.dtype)}, one thread")
    task = make_task(TASK, default_task_args(TASK), "", "", "answer_is")
    prompts = [render_prompt_ids(started.tokenizer, p.messages) for p in task.heldout(args.prompts)]
    return args, engine, prompts


def main() -> None:
    args, engine, prompts = engine_job(__doc__)

    def requests(drafts: list[tuple[Draft, ...]] | None = None) -> list[GenRequest]:
        return [
            GenRequest(ids, args.max_new_tokens, 1.0, 1.0, i, drafts[i] if drafts else ())
            for i, ids in enumerate(prompts)
            for _ in range(args.samples)
        ]

    timed(engine, requests())  # warm-up
    total = {"plain_s": 0.0, "plain_tok": 0, "spec_s": 0.0, "spec_tok": 0}
    for n in range(args.rounds):
        plain_s, plain = timed(engine, requests())
        drafts = [
            tuple(Draft(tuple(r.token_ids), tuple(r.logprobs)) for r in plain if r.request.tag == i)
            for i in range(len(prompts))
        ]
        spec_s, spec = timed(engine, requests(drafts))
        plain_tok, spec_tok = (sum(len(r.token_ids) for r in x) for x in (plain, spec))
        verified, accepted = sum(r.draft_tokens for r in spec), sum(r.draft_accepted for r in spec)
        print(
            f"round {n}: plain {plain_tok / plain_s:6.1f} tok/s ({plain_tok} tokens)  spec "
            f"{spec_tok / spec_s:6.1f} tok/s ({spec_tok} tokens)  acceptance "
            f"{accepted / max(verified, 1):.2f}  from drafts {accepted / max(spec_tok, 1):.2f}",
            flush=True,
        )
        for k, v in zip(total, (plain_s, plain_tok, spec_s, spec_tok)):
            total[k] += v
    plain_rate, spec_rate = total["plain_tok"] / total["plain_s"], total["spec_tok"] / total["spec_s"]
    print(f"pooled: plain {plain_rate:.1f} tok/s, spec {spec_rate:.1f} tok/s = {spec_rate / plain_rate:.2f}x")


if __name__ == "__main__":
    main()
