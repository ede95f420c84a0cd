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

import torch
from head_input import median_ms
from tuning_ab import engine_ab, rows_job

from streamrl.models.frozen import PAD_ROWS


def main() -> None:
    args, model, tok = rows_job(__doc__, repeats=7)
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
    a, b = engine_ab(model, tok, args.rows, args.tokens, "pad_head")
    print(
        f"engine, one thread, {args.rows} prompts x {args.tokens} tokens: unpadded {a:.1f} tok/s, "
        f"padded {b:.1f} tok/s ({b / a:.2f}x)"
    )


if __name__ == "__main__":
    main()
