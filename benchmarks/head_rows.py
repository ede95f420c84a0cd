"""What the fp32 LM head costs per row count, as it is and padded to 16 rows, and what the padding the
engine applies (models/frozen.py: padded_rows) does to decoding.

    python benchmarks/head_rows.py [--model NAME_OR_DIR] [--repeats 7] [--rows 12] [--tokens 40]

1. The model's LM head alone on R = 1..20 rows of hidden states, on one and on two threads: the median
   of --repeats products, unpadded and padded with zero rows to 16 (R < 16).
2. The default engine (fp32, one thread) generating --tokens tokens for --rows prompts, with the
   padding and without, twice each in turn: tokens per second. The same seed draws the same tokens.

Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from head_input import median_ms

from streamrl.engine.base import GenRequest
from streamrl.engine.hf import HFEngine
from streamrl.models.frozen import PAD_ROWS, TUNING
from streamrl.models.startup import start_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=40)
    args = ap.parse_args()
    started = start_model(args.model)  # fp32
    model, tok = started.model.eval(), started.tokenizer
    weight = model.get_output_embeddings().weight.detach()
    hi = PAD_ROWS[1]
    print(f"{args.model}: LM head {tuple(weight.shape)} fp32, median of {args.repeats} (ms)")
    print("threads  rows  unpadded  padded-to-16")
    with torch.inference_mode():
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for rows in range(1, 21):
                x = torch.randn(rows, weight.shape[1])
                padded = torch.zeros(max(rows, hi), weight.shape[1])
                padded[:rows] = x
                plain = median_ms(lambda x=x: torch.nn.functional.linear(x, weight), args.repeats)
                pad = median_ms(lambda p=padded: torch.nn.functional.linear(p, weight), args.repeats)
                print(
                    f"{threads:7d}  {rows:4d}  {plain:8.1f}  {pad:12.1f}"
                    if rows < hi
                    else f"{threads:7d}  {rows:4d}  {plain:8.1f}"
                )
    torch.set_num_threads(1)
    prompts = [tok(f"What is {i} + {2 * i}? Think step by step.").input_ids for i in range(args.rows)]
    runs: dict[str, list[float]] = {"padded": [], "unpadded": []}
    try:
        for name in ("unpadded", "padded") * 2:
            TUNING.pad_head = name == "padded"
            engine = HFEngine(model, tok, max_batch=64, seed=1)
            t0 = time.perf_counter()
            out = engine.generate([GenRequest(p, args.tokens, 1.0) for p in prompts])
            runs[name].append(sum(len(r.token_ids) for r in out) / (time.perf_counter() - t0))
    finally:
        TUNING.pad_head = True
    a, b = statistics.mean(runs["unpadded"]), statistics.mean(runs["padded"])
    print(
        f"engine, one thread, {args.rows} prompts x {args.tokens} tokens: unpadded {a:.1f} tok/s, "
        f"padded {b:.1f} tok/s ({b / a:.2f}x)"
    )


if __name__ == "__main__":
    main()
