"""Mutation check: plant each deliberate bug of tests/mutations.yaml and run the tests that guard it.

A mutation is an exact text replacement in one source file (`find` must occur exactly once, so a
mutation whose code has moved is reported instead of silently testing nothing) and the test files
expected to catch it. The work happens in a copy of the repository, never in the checkout; the copy's
src/ comes first on PYTHONPATH, so subprocesses the tests start run the mutated code too.

    python scripts/mutation.py            # every mutation; exit 1 unless all are caught
    python scripts/mutation.py -k resume  # those whose name contains 'resume'
    python scripts/mutation.py --list

Outcomes: caught (a test failed), MISSED (every test passed), stale (the text is not found exactly
once), error (the tests could not run: collection error, no tests, timeout). Only caught is good.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "tests" / "mutations.yaml"
COPY = ("src", "tests", "pyproject.toml", "Makefile", "benchmarks", "docs", "README.md")


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]


def load(path: Path = LIST) -> list[Mutation]:
    raw = yaml.safe_load(path.read_text()) or []
    out, seen = [], set()
    for i, m in enumerate(raw):
        missing = {"name", "file", "find", "replace", "tests"} - set(m)
        if missing:
            raise SystemExit(f"{path}: entry {i} lacks {', '.join(sorted(missing))}")
        if m["name"] in seen:
            raise SystemExit(f"{path}: mutation name '{m['name']}' is used twice")
        if m["find"] == m["replace"]:
            raise SystemExit(f"{path}: mutation '{m['name']}' replaces its text with itself")
        seen.add(m["name"])
        out.append(Mutation(m["name"], m["file"], m["find"], m["replace"], tuple(m["tests"])))
    return out


def _pytest(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[int | None, str]:
    env = {**os.environ, "PYTHONPATH": str(copy / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    try:
        p = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    lines = [x for x in p.stdout.strip().splitlines() if x.strip()]
    return p.returncode, lines[-1] if lines else p.stderr.strip()[-300:]


def run_one(m: Mutation, copy: Path, timeout: float) -> tuple[str, str]:
    path = copy / m.file
    original = path.read_text()
    n = original.count(m.find)
    if n != 1:
        return "stale", f"the text to replace occurs {n} times in {m.file}"
    path.write_text(original.replace(m.find, m.replace))
    try:
        code, last = _pytest(copy, m.tests, timeout)
    finally:
        path.write_text(original)
    if code == 1:
        return "caught", last
    if code == 0:
        return "MISSED", last
    return "error", f"pytest exit {code}: {last}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", default="", help="only mutations whose name contains this")
    ap.add_argument("--list", action="store_true", help="print the mutations and exit")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per mutation's test run")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the tests")
    args = ap.parse_args(argv)
    muts = [m for m in load() if args.k in m.name]
    if args.list:
        for m in muts:
            print(f"{m.name:40s} {m.file}  <- {' '.join(m.tests)}")
        return 0
    with tempfile.TemporaryDirectory(prefix="streamrl-mutation-") as tmp:
        copy = Path(tmp)
        for name in COPY:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, copy / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
            elif src.exists():
                shutil.copy2(src, copy / name)
        if not args.no_baseline:  # a test that already fails would make every mutation look caught
            tests = tuple(sorted({t for m in muts for t in m.tests}))
            code, last = _pytest(copy, tests, args.timeout * 2)
            print(f"baseline (no mutation), {len(tests)} test files: {last}", flush=True)
            if code != 0:
                print("the tests fail without any mutation: fix them first")
                return 1
        results = []
        for i, m in enumerate(muts, 1):
            t0 = time.perf_counter()
            outcome, detail = run_one(m, copy, args.timeout)
            results.append(outcome)
            print(
                f"[{i:2d}/{len(muts)}] {outcome:7s} {m.name:40s} {time.perf_counter() - t0:5.0f} s  {detail}",
                flush=True,
            )
    caught = results.count("caught")
    print(f"\n{caught} of {len(muts)} mutations caught", end="")
    bad = {o: results.count(o) for o in ("MISSED", "stale", "error") if o in results}
    print("; " + ", ".join(f"{v} {k}" for k, v in bad.items()) if bad else "")
    return 0 if caught == len(muts) else 1


if __name__ == "__main__":
    sys.exit(main())
