"""streamrl command line: `streamrl train | eval | score | report | simulate` (see `streamrl CMD --help`)."""

from __future__ import annotations

import argparse
import sys

from streamrl.config import ConfigError, load_config
from streamrl.report_cli import add_parser as add_report_parser
from streamrl.report_cli import run_report
from streamrl.score_cli import add_parser as add_score_parser
from streamrl.score_cli import run_score
from streamrl.sim.cli import add_parser as add_simulate_parser


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
    ev = sub.add_parser("eval", help="evaluate a model or checkpoint: greedy, pass@k, avg@n, maj@k")
    ev.add_argument(
        "args", nargs="*", help="[config.yaml] [key=value ...], e.g. model=runs/x/checkpoint n=16 k=1,4,16"
    )
    add_score_parser(sub)
    add_report_parser(sub)
    add_simulate_parser(sub)
    ns = parser.parse_args(argv)
    try:
        if ns.command == "score":
            return run_score(ns)
        if ns.command == "report":
            return run_report(ns)
        if ns.command == "simulate":
            from streamrl.sim.cli import run_simulate

            return run_simulate(ns)
        path, overrides = _split_args(ns.args)
        if ns.command == "eval":
            from streamrl.eval_cli import expand_shorthands, run_eval

            run_eval(load_config(path, expand_shorthands(overrides)))
            return 0
        cfg = load_config(path, overrides)
        from streamrl.preflight import preflight

        checked = preflight(cfg)  # model, task, data: before the heavy imports and any file is written
        from streamrl.loop.job import run_train
        from streamrl.placement.backend import RolloutFailure

        try:
            run_train(cfg, checked=checked)
        except RolloutFailure as e:  # the state is saved: say why, no traceback
            print(
                f"streamrl: stopped: {e}; the state is saved, continue with resume={cfg.run_dir}",
                file=sys.stderr,
            )
            return 1
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"streamrl: error: {e}", file=sys.stderr)
        return 2
    return 0  # a stop by Ctrl-C/SIGTERM is a clean exit: the state is saved for resume=


if __name__ == "__main__":
    sys.exit(main())
