"""The end-of-run summary table: base vs final accuracy with intervals, timings, where things are."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _acc(e: dict[str, Any] | None) -> str:
    if not e:
        return "-"
    lo, hi = e["ci95"]
    return f"{e['accuracy']:.1%} ({e['correct']}/{e['n']}, 95% CI {lo:.1%}-{hi:.1%})"


def print_summary(summary: dict[str, Any], console: Console) -> None:
    ev = summary["eval"]
    table = Table(title="streamrl run summary", show_header=False)
    table.add_row("held-out accuracy, base", _acc(ev.get("base")))
    table.add_row("held-out accuracy, final", _acc(ev.get("final")))
    diff = ev.get("difference")
    if diff:
        lo, hi = diff["ci95"]
        table.add_row("difference (paired)", f"{diff['mean']:+.1%} (95% CI {lo:+.1%} to {hi:+.1%})")
    t = summary["timings"]
    table.add_row(
        "wall time",
        f"{t['total']:.0f} s (model resolve {t['resolve_model']:.0f} s, "
        f"eval {t['eval']:.0f} s, train {t['train']:.0f} s (periodic state saves "
        f"{t.get('periodic_saves', 0.0):.0f} s), final state save {t.get('save', 0.0):.0f} s)",
    )
    stopped = (
        " (stopped in the final evaluation)" if summary.get("final_eval_stopped") else " (stopped early)"
    )
    table.add_row("steps", str(summary["steps"]) + (stopped if summary["interrupted"] else ""))
    acc = summary.get("accounting")
    if acc:
        table.add_row(
            "groups",
            f"generated {acc['generated']}, trained {acc['trained']}, carried over {acc['carried_over']}, "
            f"filtered {acc['filtered']}, lost {acc['lost']}"
            + (f"; {n} prompt(s) too long skipped" if (n := acc.get("prompts_too_long")) else ""),
        )
    table.add_row(
        "run dir", summary["run_dir"] + "  (metrics.jsonl, eval.json, accounting.json, tensorboard/)"
    )
    table.add_row("checkpoint", summary["checkpoint"] or "-")
    console.print(table)
