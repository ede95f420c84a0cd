"""What the model's Linear layers other than the LM head cost per row count, as rows @ weight^T (the usual
product) and as weight @ rows^T (models/frozen.py: few_rows_linear), and what the engine gains from it.

    python benchmarks/body_rows.py [--model NAME_OR_DIR] [--repeats 11] [--rows 12] [--tokens 40]

1. For each weight shape of the model's body, R rows through every layer of that shape (SmolLM2-135M:
   60 or 30 layers), on one and on two threads: the usual product's median of --repeats in ms, and the
   transposed one's time as a ratio of it (below 1: faster). The engine transposes 8-15 rows
   (FEW_ROWS) for weights of FEW_ROWS_WEIGHT values or more.
2. The default engine (fp32, one thread) generating --tokens tokens for --rows prompts with the
   transposed products and without, twice each in turn: tokens per second. The same seed draws the same
   tokens.

Not a test: figures, not assertions.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from head_input import median_ms
from tuning_ab import engine_ab, rows_job

from streamrl.models.frozen import FEW_ROWS, FEW_ROWS_WEIGHT

ROWS = (1, 4, 6, 7, 8, 10, 12, 14, 15, 16, 20, 24, 32, 48, 64)


def main() -> None:
    args, model, tok = rows_job(__doc__, repeats=11)
    head = model.get_output_embeddings()
    by_shape: defaultdict[tuple[int, int], list[torch.nn.Linear]] = defaultdict(list)
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and m is not head:
            by_shape[tuple(m.weight.shape)].append(m)
    print(
        f"{args.model}: body Linear layers by weight shape, median of {args.repeats}, all layers of a shape"
    )
    lo, hi = FEW_ROWS
    print(f"the engine transposes {lo}-{hi} rows for weights of {FEW_ROWS_WEIGHT} values or more")
    print("threads  shape      layers  " + "  ".join(f"{r:>10d}" for r in ROWS))
    print(" " * 27 + "  ".join(f"{'ms  trans':>10s}" for _ in ROWS))
    with torch.inference_mode():
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for shape, layers in by_shape.items():
                cells = []
                for rows in ROWS:
                    x = torch.randn(rows, shape[1])

                    def usual(x=x, layers=layers) -> None:
                        for m in layers:
                            torch.nn.functional.linear(x, m.weight, m.bias)

                    def transposed(x=x, layers=layers) -> None:
                        for m in layers:
                            out_t(m, x)

                    a, b = median_ms(usual, args.repeats), median_ms(transposed, args.repeats)
                    cells.append(f"{a:5.1f} {b / a:4.2f}")
                name = f"{shape[0]}x{shape[1]}"
                print(f"{threads:7d}  {name:>9s}  {len(layers):6d}  " + "  ".join(f"{c:>10s}" for c in cells))
    a, b = engine_ab(model, tok, args.rows, args.tokens, "transpose_body")
    print(
        f"engine, one thread, {args.rows} prompts x {args.tokens} tokens: usual {a:.1f} tok/s, "
        f"transposed {b:.1f} tok/s ({b / a:.2f}x)"
    )


def out_t(m: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """weight @ x^T as few_rows_linear computes it, at any row count (to show where it pays)."""
    out = torch.mm(m.weight, x.t()) if m.bias is None else torch.addmm(m.bias.unsqueeze(1), m.weight, x.t())
    return out.t().contiguous()


if __name__ == "__main__":
    main()
