"""What head_rows.py and body_rows.py share: their command line and the engine's tokens/s with one of
the engine's products for few rows (models/frozen.py: TUNING) off and on."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from streamrl.engine.base import GenRequest
from streamrl.engine.hf import HFEngine
from streamrl.models.frozen import TUNING
from streamrl.models.startup import start_model


def rows_job(doc: str | None, repeats: int) -> tuple[argparse.Namespace, Any, Any]:
    """--model, --repeats, --rows, --tokens -> (args, the model in fp32 in eval mode, its tokenizer)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=40)
    args = ap.parse_args()
    started = start_model(args.model)  # fp32
    return args, started.model.eval(), started.tokenizer


def engine_ab(model: Any, tok: Any, rows: int, tokens: int, switch: str) -> tuple[float, float]:
    """The default engine on one thread generating `tokens` tokens for `rows` prompts with TUNING's
    `switch` off and on, twice each in turn (the same seed draws the same tokens) -> the mean tokens/s
    (off, on). The switch is left on."""
    torch.set_num_threads(1)
    prompts = [tok(f"What is {i} + {2 * i}? Think step by step.").input_ids for i in range(rows)]
    runs: dict[bool, list[float]] = {False: [], True: []}
    try:
        for on in (False, True) * 2:
            setattr(TUNING, switch, on)
            engine = HFEngine(model, tok, max_batch=64, seed=1)
            t0 = time.perf_counter()
            out = engine.generate([GenRequest(p, tokens, 1.0) for p in prompts])
            runs[on].append(sum(len(r.token_ids) for r in out) / (time.perf_counter() - t0))
    finally:
        setattr(TUNING, switch, True)
    return statistics.mean(runs[False]), statistics.mean(runs[True])
