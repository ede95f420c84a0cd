"""streamrl command line: `streamrl train | eval | config | score | report | simulate` (`CMD --help`)."""

from __future__ import annotations

import argparse
import gc
import sys
from typing import Any

from streamrl import __version__
from streamrl.config import ConfigError, load_config
from streamrl.report_cli import add_parser as add_report_parser
from streamrl.report_cli import run_report
from streamrl.score_cli import add_parser as add_score_parser
from streamrl.score_cli import run_score
from streamrl.sim.cli import add_parser as add_simulate_parser

KEYS_EPILOG = (
    "Every key, with its type, default, accepted range and meaning: streamrl config [SECTION]\n"
    "(e.g. streamrl config train). Precedence: defaults < algo preset < config file < key=value."
)


def _split_args(items: list[str], config: str | None) -> tuple[str | None, list[str]]:
    """(config file, key=value overrides): the file is --config FILE or a first item without '='."""
    path = items[0] if items and "=" not in items[0] else None
    if path is not None and config is not None:
        raise ConfigError(f"two config files, '{path}' and --config '{config}': give one of them")
    return path or config, items[1:] if path is not None else items


def _add_job_parser(sub: Any, name: str, help: str, example: str) -> None:
    p = sub.add_parser(
        name, help=help, epilog=KEYS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--config", metavar="FILE", help="a YAML config file (the same as a first positional FILE)"
    )
    p.add_argument("args", nargs="*", metavar="[FILE] [key=value ...]", help=f"e.g. {example}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamrl", description="Asynchronous RL post-training of LMs.")
    parser.add_argument("--version", action="version", version=f"streamrl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_job_parser(
        sub, "train", "train a model with RL (no arguments: the default job)", "max_steps=5 train.lr=2e-5"
    )
    _add_job_parser(
        sub,
        "eval",
        "evaluate a model or checkpoint (a run's: on the run's task settings): greedy, pass@k, avg@n, maj@k",
        "model=runs/x/checkpoint n=16 k=1,4,16 (n, k, temperature, size: the eval.* keys)",
    )
    cfg = sub.add_parser("config", help="list the config keys: type, default, accepted range, meaning")
    cfg.add_argument("section", nargs="?", help="only this section (train, rollout, reward, ...)")
    add_score_parser(sub)
    add_report_parser(sub)
    add_simulate_parser(sub)
    return parser


def _eval(path: str | None, overrides: list[str]) -> int:
    """`streamrl eval`: the Config of eval_settings.py (a run's checkpoint: with the run's task settings).
    A Ctrl-C stops it with one line and exit code 130: its eval.json is written whole at the end, so an
    evaluation stopped before then writes none."""
    try:
        from streamrl.eval_cli import expand_shorthands, run_eval
        from streamrl.eval_settings import eval_config, say_taken

        cfg, taken = eval_config(path, expand_shorthands(overrides))
        say_taken(taken)
        run_eval(cfg)
    except KeyboardInterrupt:
        print("streamrl eval: interrupted; nothing written", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports a command a Ctrl-C stopped
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns, extra = parser.parse_known_args(argv)
    if ns.command not in ("train", "eval") or any(x.startswith("-") for x in extra):
        if extra:  # train/eval take key=value after --config too; anything else is argparse's error
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if ns.command == "config":
            from streamrl.config_docs import render

            sys.stdout.write(render(ns.section))
            return 0
        if ns.command == "score":
            return run_score(ns)
        if ns.command == "report":
            return run_report(ns)
        if ns.command == "simulate":
            from streamrl.sim.cli import run_simulate

            return run_simulate(ns)
        path, overrides = _split_args([*ns.args, *extra], ns.config)
        if ns.command == "eval":
            return _eval(path, overrides)
        cfg = load_config(path, overrides)
        from streamrl.placement.forkserver import start_server_for
        from streamrl.preflight import preflight

        start_server_for(cfg)  # imports only: the workers' server loads torch while we check the inputs

        checked = preflight(cfg)  # model, task, data: before the heavy imports and any file is written
        from streamrl.loop.export import CheckpointWriteError
        from streamrl.loop.job import run_train
        from streamrl.loop.state import StateSaveError
        from streamrl.placement.backend import RolloutFailure

        try:
            run_train(cfg, checked=checked)
        except RolloutFailure as e:  # the state is saved: say why, no traceback
            kept = f"the state is saved, continue with resume={cfg.run_dir}"
            print(f"streamrl: stopped: {e}; {kept}", file=sys.stderr)
            return 1
        except StateSaveError as e:  # the newest complete state is kept: say why, no traceback
            print(f"streamrl: stopped: {e} with resume={cfg.run_dir}", file=sys.stderr)
            return 1
        except CheckpointWriteError as e:  # the run state is kept: say why and where, no traceback
            print(f"streamrl: stopped: {e}", file=sys.stderr)
            return 1
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"streamrl: error: {e}", file=sys.stderr)
        return 2
    return 0  # a stop by Ctrl-C/SIGTERM is a clean exit: the state is saved for resume=


def run() -> None:
    """The `streamrl` command: main(), then exit without the interpreter's last garbage collection over
    every object the run imported or built (about 2 s of one core; everything is written and closed by
    then)."""
    code = main()
    from streamrl.placement.forkserver import stop_server

    stop_server()  # its workers are gone; a server still importing would hold our stdout and stderr
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
