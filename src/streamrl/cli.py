"""streamrl command line: `streamrl train [config.yaml] [key=value ...]`, `streamrl score code|math`."""

from __future__ import annotations

import argparse
import sys

from streamrl.config import ConfigError, load_config
from streamrl.score_cli import add_parser as add_score_parser
from streamrl.score_cli import run_score


def _split_args(items: list[str]) -> tuple[str | None, list[str]]:
    path = None
    overrides = []
    for i, item in enumerate(items):
        if i == 0 and "=" not in item:
            path = item
        else:
            overrides.append(item)
    return path, overrides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamrl", description="Asynchronous RL post-training of LMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a model with RL (no arguments: the default job)")
    train.add_argument(
        "args", nargs="*", help="[config.yaml] [key=value ...], e.g. max_steps=5 train.lr=2e-5"
    )
    add_score_parser(sub)
    ns = parser.parse_args(argv)
    try:
        if ns.command == "score":
            return run_score(ns)
        path, overrides = _split_args(ns.args)
        cfg = load_config(path, overrides)
        from streamrl.runtime.job import run_train  # heavy imports only after the config is valid

        run_train(cfg)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"streamrl: error: {e}", file=sys.stderr)
        return 2
    return 0  # a stop by Ctrl-C/SIGTERM is a clean exit: the state is saved for resume=


if __name__ == "__main__":
    sys.exit(main())
