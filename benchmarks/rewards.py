"""Rewards per second of the math scorer and the code scorer through a RewardService with 1 and 2 workers.

    python benchmarks/rewards.py [--n-math 400] [--n-code 64]

Math: math-verify on a fixed mix of right and wrong LaTeX answers. Code: the built-in code problems'
reference solutions (4 sandboxed runs each), so one "reward" = one response scored against 4 tests.
Also prints the sandbox's wall time per run of `print(1)` (the probed isolation level and the rlimits
fallback): the sandbox's overhead figure. Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from streamrl.data.code_task import builtin_text
from streamrl.rewards.code import score_program
from streamrl.rewards.math import math_equal
from streamrl.rewards.sandbox import LocalSandbox
from streamrl.rewards.service import RewardService


def math_items(n: int) -> list[tuple[str, str]]:
    """n distinct (answer, reference) pairs, half equivalent: no scorer-side caching can help."""
    out = []
    for i in range(1, n + 1):
        kinds = [
            (f"\\frac{{{i}}}{{{2 * i}}}", "0.5"),
            (f"{i}\\sqrt{{2}}", f"\\sqrt{{{2 * i * i}}}"),
            (f"{i + 1}", f"{i}"),
            (f"({i}, {i + 1}]", f"({i},{i + 1}]"),
        ]
        out.append(kinds[i % len(kinds)])
    return out


def _math(answer: str, reference: str) -> float:
    return float(math_equal(answer, reference))


def _code(solution: str, tests: list[dict]) -> float:
    return score_program(solution, tests)[0]


def _rate(fn, items: list[tuple], workers: int, mode: str) -> tuple[float, dict[str, float]]:
    """Rewards/s through a RewardService (no cache) after one warm-up call per worker."""
    with RewardService(fn, workers=workers, timeout_s=60, cache_size=0, mode=mode) as service:
        service.wait_ready()
        service.score_many(items[:workers])  # warm-up: imports in each worker, sandbox probe
        service.metrics(reset=True)
        t0 = time.perf_counter()
        outcomes = service.score_many(items)
        rate = len(items) / (time.perf_counter() - t0)
        errors = sum(o.error is not None for o in outcomes)
        return rate, {"errors": errors, **service.metrics()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-math", type=int, default=400)
    ap.add_argument("--n-code", type=int, default=64)
    args = ap.parse_args()
    for sb in (LocalSandbox(), LocalSandbox(isolation="rlimits", min_isolation="rlimits")):
        walls = sorted(sb.run("print(1)").wall_s for _ in range(20))
        med, p90 = statistics.median(walls) * 1000, walls[17] * 1000
        print(f"sandbox isolation {sb.isolation.name}: print(1) wall median {med:.1f} ms, p90 {p90:.1f} ms")
    maths = math_items(args.n_math)
    rows = [json.loads(line) for line in builtin_text().splitlines()]
    codes = [(rows[i % len(rows)]["solution"], rows[i % len(rows)]["tests"]) for i in range(args.n_code)]
    print("RewardService, cache off; math in worker processes, code in threads (each test a sandbox run)")
    for workers in (1, 2):
        m, mm = _rate(_math, maths, workers, "process")
        c, cm = _rate(_code, codes, workers, "thread")
        print(
            f"workers {workers}: math {m:8.1f} rewards/s (p95 {mm['reward/latency_p95_s'] * 1e3:.1f} ms) | "
            f"code {c:6.1f} rewards/s (p95 {cm['reward/latency_p95_s']:.2f} s) | "
            f"errors {mm['errors'] + cm['errors']}"
        )


if __name__ == "__main__":
    main()
