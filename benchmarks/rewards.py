"""Rewards per second of the math scorer and the code scorer with 1 and 2 worker processes.

    python benchmarks/rewards.py [--n-math 400] [--n-code 64]

Math: math-verify on a fixed mix of right and wrong LaTeX answers. Code: the built-in code problems'
reference solutions (4 sandboxed runs each), so one "reward" = one response scored against 4 tests.
Also prints the sandbox's wall time per run for `print(1)`. Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

from streamrl.data.code_task import builtin_text
from streamrl.rewards.code import score_program
from streamrl.rewards.math import math_equal
from streamrl.rewards.sandbox import LocalSandbox

MATH = [("\\frac{1}{2}", "0.5"), ("2\\sqrt{2}", "\\sqrt{8}"), ("3", "4"), ("(1, 2]", "(1,2]"), ("x^2", "x*x")]


def _math(pair: tuple[str, str]) -> float:
    return float(math_equal(*pair))


def _code(row: dict) -> float:
    return score_program(row["solution"], row["tests"])[0]


def _rate(fn, items: list, workers: int) -> float:
    if workers == 1:
        fn(items[0])  # warm-up: imports, sandbox probe
        t0 = time.perf_counter()
        for x in items:
            fn(x)
        return len(items) / (time.perf_counter() - t0)
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(fn, items[:workers]))  # warm the workers
        t0 = time.perf_counter()
        list(pool.map(fn, items, chunksize=4))
        return len(items) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-math", type=int, default=400)
    ap.add_argument("--n-code", type=int, default=64)
    args = ap.parse_args()
    sb = LocalSandbox()
    walls = sorted(sb.run("print(1)").wall_s for _ in range(20))
    med, p90 = statistics.median(walls) * 1000, walls[17] * 1000
    print(f"sandbox isolation {sb.isolation.name}: print(1) wall median {med:.1f} ms, p90 {p90:.1f} ms")
    math_items = [MATH[i % len(MATH)] for i in range(args.n_math)]
    rows = [json.loads(line) for line in builtin_text().splitlines()]
    code_items = [rows[i % len(rows)] for i in range(args.n_code)]
    for workers in (1, 2):
        m = _rate(_math, math_items, workers)
        c = _rate(_code, code_items, workers)
        print(f"workers {workers}: math {m:8.1f} rewards/s | code {c:6.1f} rewards/s ({c * 4:6.1f} runs/s)")


if __name__ == "__main__":
    main()
