"""Generate src/streamrl/data/code_problems.jsonl: simple stdin/stdout problems with tests.

    python scripts/make_code_problems.py            (deterministic: fixed seed, same file every time)

Each problem has a prompt, a reference solution and 4 inputs drawn from a seeded generator; the
expected outputs are produced by running the reference solution, so tests and solution agree by
construction (tests/test_code_task.py re-runs every solution in the sandbox to check it).
Rows: {"id", "prompt", "tests": [{"input", "output"}], "solution"}.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import string
import sys
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "streamrl" / "data" / "code_problems.jsonl"
TESTS_PER_PROBLEM = 4
Gen = Callable[[random.Random], str]


def ints(n: int, lo: int = -50, hi: int = 50) -> Gen:
    return lambda r: " ".join(str(r.randint(lo, hi)) for _ in range(n)) + "\n"


def word(lo: int = 1, hi: int = 10, alphabet: str = string.ascii_lowercase) -> Gen:
    return lambda r: "".join(r.choice(alphabet) for _ in range(r.randint(lo, hi))) + "\n"


def int_list(lo_n: int = 1, hi_n: int = 8, lo: int = -20, hi: int = 20) -> Gen:
    def g(r: random.Random) -> str:
        n = r.randint(lo_n, hi_n)
        return f"{n}\n" + " ".join(str(r.randint(lo, hi)) for _ in range(n)) + "\n"

    return g


def sentence(r: random.Random) -> str:
    return " ".join(word(1, 7)(r).strip() for _ in range(r.randint(1, 6))) + "\n"


READ_LIST = "n = int(input())\nxs = list(map(int, input().split()))\n"
# (prompt, reference solution, input generator)
# one problem per two lines: the tables stay tables
# fmt: off
BASE: list[tuple[str, str, Gen]] = [
    ("Read two integers a and b on one line and print their sum.",
     "a, b = map(int, input().split())\nprint(a + b)\n", ints(2)),
    ("Read two integers a and b on one line and print a - b.",
     "a, b = map(int, input().split())\nprint(a - b)\n", ints(2)),
    ("Read two integers a and b on one line and print their product.",
     "a, b = map(int, input().split())\nprint(a * b)\n", ints(2)),
    ("Read two integers a and b on one line and print the larger one.",
     "a, b = map(int, input().split())\nprint(max(a, b))\n", ints(2)),
    ("Read three integers on one line and print the smallest.",
     "print(min(map(int, input().split())))\n", ints(3)),
    ("Read two positive integers a and b on one line and print a // b and a % b separated by a space.",
     "a, b = map(int, input().split())\nprint(a // b, a % b)\n", ints(2, 1, 99)),
    ("Read an integer n and print its absolute value.", "print(abs(int(input())))\n", ints(1, -999, 999)),
    ("Read an integer n and print 'even' if it is even and 'odd' otherwise.",
     "print('even' if int(input()) % 2 == 0 else 'odd')\n", ints(1, -100, 100)),
    ("Read an integer n and print 'positive', 'negative' or 'zero'.",
     "n = int(input())\nprint('positive' if n > 0 else 'negative' if n < 0 else 'zero')\n", ints(1, -3, 3)),
    ("Read a positive integer n and print the sum 1 + 2 + ... + n.",
     "n = int(input())\nprint(n * (n + 1) // 2)\n", ints(1, 1, 1000)),
    ("Read a non-negative integer n (at most 15) and print n factorial.",
     "import math\nprint(math.factorial(int(input())))\n", ints(1, 0, 15)),
    ("Read a non-negative integer n (at most 30) and print the n-th Fibonacci number (F0 = 0, F1 = 1).",
     "n = int(input())\na, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nprint(a)\n", ints(1, 0, 30)),
    ("Read an integer n >= 2 and print 'yes' if it is prime and 'no' otherwise.",
     "n = int(input())\nprint('yes' if all(n % d for d in range(2, int(n ** 0.5) + 1)) else 'no')\n",
     ints(1, 2, 200)),
    ("Read a non-negative integer n and print the sum of its decimal digits.",
     "print(sum(map(int, input().strip())))\n", ints(1, 0, 10**6)),
    ("Read a non-negative integer n and print it in binary without a prefix.",
     "print(bin(int(input()))[2:])\n", ints(1, 0, 1000)),
    ("Read a binary number (digits 0 and 1) and print its decimal value.",
     "print(int(input().strip(), 2))\n", word(1, 12, "01")),
    ("Read two positive integers and print their greatest common divisor.",
     "import math\na, b = map(int, input().split())\nprint(math.gcd(a, b))\n", ints(2, 1, 500)),
    ("Read two positive integers and print their least common multiple.",
     "import math\na, b = map(int, input().split())\nprint(a * b // math.gcd(a, b))\n", ints(2, 1, 60)),
    ("Read a positive integer n and print the numbers 1 to n on one line separated by spaces.",
     "print(*range(1, int(input()) + 1))\n", ints(1, 1, 20)),
    ("Read a positive integer n and print the numbers n down to 1, one per line.",
     "for i in range(int(input()), 0, -1):\n    print(i)\n", ints(1, 1, 8)),
    ("Read a positive integer n and print a right triangle of '*' with n rows (row i has i stars).",
     "for i in range(1, int(input()) + 1):\n    print('*' * i)\n", ints(1, 1, 6)),
    ("Read a positive integer n and print its divisors in increasing order separated by spaces.",
     "n = int(input())\nprint(*[d for d in range(1, n + 1) if n % d == 0])\n", ints(1, 1, 120)),
    ("Read an integer year and print 'leap' if it is a leap year in the Gregorian calendar, else 'common'.",
     "y = int(input())\nprint('leap' if y % 4 == 0 and (y % 100 != 0 or y % 400 == 0) else 'common')\n",
     lambda r: f"{r.choice([1900, 2000, 2023, 2024, 2100, 1996, 2001, 2400])}\n"),
    ("Read a string and print it reversed.", "print(input()[::-1])\n", word()),
    ("Read a string and print its length.", "print(len(input()))\n", word(0, 15)),
    ("Read a lowercase word and print it in uppercase.", "print(input().upper())\n", word()),
    ("Read a lowercase word and print the number of vowels (a, e, i, o, u) in it.",
     "print(sum(c in 'aeiou' for c in input()))\n", word(1, 15)),
    ("Read a lowercase word and print 'yes' if it is a palindrome and 'no' otherwise.",
     "s = input().strip()\nprint('yes' if s == s[::-1] else 'no')\n",
     lambda r: r.choice(["level\n", "noon\n", "abc\n", "racecar\n", "ab\n", "a\n", "abca\n"])),
    ("Read a line of words separated by single spaces and print the number of words.",
     "print(len(input().split()))\n", sentence),
    ("Read a line of words separated by single spaces and print the words in reverse order.",
     "print(' '.join(input().split()[::-1]))\n", sentence),
    ("Read a line of words separated by single spaces and print the longest word (the first one if tied).",
     "print(max(input().split(), key=len))\n", sentence),
    ("Read a line of lowercase words and print it with the first letter of every word capitalised.",
     "print(' '.join(w[:1].upper() + w[1:] for w in input().split()))\n", sentence),
    ("Read a lowercase word and print its letters sorted alphabetically.",
     "print(''.join(sorted(input().strip())))\n", word()),
    ("Read a lowercase word and print it with duplicate letters removed, keeping first occurrences.",
     "s = input().strip()\nprint(''.join(c for i, c in enumerate(s) if c not in s[:i]))\n",
     word(1, 12, "abcde")),
    ("Read a lowercase word and print the most frequent letter (the alphabetically first if tied).",
     "s = input().strip()\nprint(min(set(s), key=lambda c: (-s.count(c), c)))\n", word(1, 12, "abcd")),
    ("Read a lowercase word and print each letter shifted forward by 1 in the alphabet ('z' becomes 'a').",
     "print(''.join(chr((ord(c) - 97 + 1) % 26 + 97) for c in input().strip()))\n", word()),
    ("Read two lowercase words on one line and print 'yes' if they are anagrams of each other, else 'no'.",
     "a, b = input().split()\nprint('yes' if sorted(a) == sorted(b) else 'no')\n",
     lambda r: r.choice(["listen silent\n", "abc cab\n", "abc abd\n", "aab abb\n", "night thing\n"])),
    ("Read a lowercase word and print it run-length encoded: each run as the letter then its count "
     "(e.g. aaab -> a3b1).",
     "import itertools\n"
     "print(''.join(f'{c}{len(list(g))}' for c, g in itertools.groupby(input().strip())))\n",
     word(1, 10, "ab")),
    ("Read n on the first line and n integers on the second; print their sum.",
     READ_LIST + "print(sum(xs))\n", int_list()),
    ("Read n on the first line and n integers on the second; print the maximum.",
     READ_LIST + "print(max(xs))\n", int_list()),
    ("Read n on the first line and n integers on the second; print them sorted ascending, space-separated.",
     READ_LIST + "print(*sorted(xs))\n", int_list()),
    ("Read n on the first line and n integers on the second; print how many are even.",
     READ_LIST + "print(sum(x % 2 == 0 for x in xs))\n", int_list()),
    ("Read n on the first line and n integers on the second; print the difference max - min.",
     READ_LIST + "print(max(xs) - min(xs))\n", int_list()),
    ("Read n on the first line and n integers on the second; print the number of distinct values.",
     READ_LIST + "print(len(set(xs)))\n", int_list(1, 8, 0, 5)),
    ("Read n on the first line and n integers on the second; print the running sums, space-separated.",
     READ_LIST + "import itertools\nprint(*itertools.accumulate(xs))\n", int_list()),
    ("Read n on the first line and n integers on the second; print the second largest distinct value, "
     "or 'none' if there is none.",
     READ_LIST + "v = sorted(set(xs))\nprint(v[-2] if len(v) > 1 else 'none')\n", int_list(1, 6, 0, 4)),
    ("Read n on the first line and n integers on the second; print the mean rounded to 2 decimals.",
     READ_LIST + "print(f'{sum(xs) / n:.2f}')\n", int_list()),
    ("Read n on the first line and n integers on the second; print 'yes' if they are sorted "
     "non-decreasingly, else 'no'.",
     READ_LIST + "print('yes' if xs == sorted(xs) else 'no')\n", int_list(1, 4, 0, 3)),
    ("Read n on the first line and n integers on the second; print the index (0-based) of the first "
     "maximum.", READ_LIST + "print(xs.index(max(xs)))\n", int_list()),
    ("Read a positive integer n and print the multiplication table row n x 1 to n x 10, space-separated.",
     "n = int(input())\nprint(*[n * i for i in range(1, 11)])\n", ints(1, 1, 12)),
    ("Read a temperature in Celsius (an integer) and print it in Fahrenheit with 1 decimal.",
     "c = int(input())\nprint(f'{c * 9 / 5 + 32:.1f}')\n", ints(1, -40, 100)),
    ("Read a number of seconds and print it as H:MM:SS.",
     "s = int(input())\nprint(f'{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}')\n", ints(1, 0, 100000)),
    ("Read a positive integer n and print the number of its decimal digits.",
     "print(len(input().strip()))\n", ints(1, 1, 10**9)),
    ("Read a positive integer and print its digits reversed (drop leading zeros of the result).",
     "print(int(input().strip()[::-1]))\n", ints(1, 1, 10**6)),
    ("Read a positive integer n and print the number of steps of the Collatz process to reach 1.",
     "n = int(input())\nk = 0\nwhile n != 1:\n    n = n // 2 if n % 2 == 0 else 3 * n + 1\n    k += 1\n"
     "print(k)\n", ints(1, 1, 60)),
    ("Read two integers lo and hi and print the sum of all integers from lo to hi inclusive.",
     "lo, hi = map(int, input().split())\nprint(sum(range(lo, hi + 1)))\n",
     lambda r: (lambda a: f"{a} {a + r.randint(0, 30)}\n")(r.randint(-20, 20))),
]
# parameterised families: distinct prompts from one template
FAMILIES: list[tuple[str, str, Gen, list[int]]] = [
    ("Read an integer n and print n multiplied by {k}.", "print(int(input()) * {k})\n", ints(1), [3, 7]),
    ("Read an integer n and print n to the power {k}.", "print(int(input()) ** {k})\n", ints(1, -9, 9),
     [2, 3]),
    ("Read a word and print it repeated {k} times with no separator.", "print(input().strip() * {k})\n",
     word(1, 5), [2, 3]),
    ("Read a positive integer n and print how many of 1..n are divisible by {k}.",
     "print(int(input()) // {k})\n", ints(1, 1, 500), [3, 7]),
]
# fmt: on


def run_reference(solution: str, stdin: str) -> str:
    out = io.StringIO()
    old = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(solution, "solution", "exec"), {"__name__": "__main__"})
    finally:
        sys.stdin = old
    return out.getvalue()


def problems() -> list[tuple[str, str, Gen]]:
    out = list(BASE)
    for prompt, sol, gen, ks in FAMILIES:
        out += [(prompt.format(k=k), sol.format(k=k), gen) for k in ks]
    return out


def main() -> None:
    rng = random.Random(20240601)
    rows = []
    for i, (prompt, sol, gen) in enumerate(problems()):
        inputs: list[str] = []
        for _ in range(100):  # distinct inputs where the generator allows
            x = gen(rng)
            if x not in inputs:
                inputs.append(x)
            if len(inputs) == TESTS_PER_PROBLEM:
                break
        tests = [{"input": x, "output": run_reference(sol, x)} for x in inputs]
        rows.append({"id": f"code-{i:03d}", "prompt": prompt, "tests": tests, "solution": sol})
    OUT.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} problems to {OUT}")


if __name__ == "__main__":
    main()
