"""`streamrl report RUN_DIR [RUN_DIR ...] [--out FILE]`: regenerate the HTML report of finished or running
runs. One run: RUN_DIR/report.html. Several: one comparison page overlaying them (e.g. sync vs async),
by default FIRST_RUN_DIR/compare.html. Diagnostics warnings are printed too."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    """Register `report` on the top-level subparsers of cli.main."""
    rep = sub.add_parser(
        "report", help="write report.html for a run, or compare.html overlaying several runs"
    )
    rep.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (with metrics.jsonl)")
    rep.add_argument(
        "--out",
        default=None,
        help="output HTML (default: RUN_DIR/report.html, or FIRST_RUN_DIR/compare.html)",
    )


def run_report(ns: argparse.Namespace) -> int:
    from streamrl.observe.diagnostics import diagnose
    from streamrl.observe.report import write_report
    from streamrl.observe.run_data import load_run

    out = write_report(ns.runs, ns.out)
    for path in ns.runs:
        run = load_run(path)
        for f in diagnose(run.records):
            print(f"{path}: warning [{f.rule}] from step {f.steps[0]}: {f.first_message}", file=sys.stderr)
    print(out)
    return 0
