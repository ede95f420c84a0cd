"""report.html: one self-contained page (inline SVG + CSS, no JavaScript, no network) per run, or one
comparison page overlaying several runs.

`write_report(paths, out)` reads the run directories (metrics.jsonl, eval.json, accounting.json,
config.yaml, environment.json, summary.json) and writes `out` atomically (temp file + rename), so a
browser or a reader never sees half a page while training refreshes it.
"""

from __future__ import annotations

import statistics
import time
from html import escape
from pathlib import Path
from typing import Any

from streamrl.files import write_text_atomic
from streamrl.observe.diagnostics import RULES, Finding, diagnose
from streamrl.observe.environment import collect_environment
from streamrl.observe.error_examples import run_examples
from streamrl.observe.plots import Series, line_chart, stacked_bars
from streamrl.observe.run_data import RunData, flatten, load_run, unique_labels
from streamrl.run_dirs import has_saved_state

# (plot name, title, metric keys, fixed y range)
LINE_PANELS: list[tuple[str, str, list[str], tuple[float, float] | None]] = [
    ("length", "Response length (tokens)", ["response_length"], None),
    ("truncation", "Truncation and format rate", ["truncation_rate", "format_rate"], (0.0, 1.0)),
    ("entropy", "Entropy (nats/token)", ["entropy"], None),
    ("kl", "KL: to the reference and step-to-step", ["kl_ref", "approx_kl"], None),
    (
        "clip",
        "Clip fractions and zero-advantage groups",
        ["clip_frac_low", "clip_frac_high", "zero_adv_group_frac"],
        (0.0, 1.0),
    ),
    ("ratio", "Importance ratio pi_theta / pi_prox", ["ratio_min", "ratio_mean", "ratio_max"], None),
    (
        "throughput",
        "Throughput (tokens/s)",
        ["tokens_per_s", "generate_tokens_per_s", "train_tokens_per_s"],
        None,
    ),
    (
        "waiting",
        "Share of time waiting (cumulative)",
        ["trainer_wait_share", "engine_idle_share"],
        (0.0, 1.0),
    ),
]
# speculative rollouts (rollout.spec_drafts > 0): shown when a run has them
SPEC_PANELS: list[tuple[str, str, list[str], tuple[float, float] | None]] = [
    (
        "speculative",
        "Speculative rollouts: draft acceptance",
        ["spec_acceptance_rate", "spec_draft_share", "spec_token_share"],
        (0.0, 1.0),
    ),
    ("spec_tokens", "Speculative rollouts: accepted tokens per draft", ["spec_accepted_per_draft"], None),
    ("spec_saved", "Speculative rollouts: decode steps saved per step", ["spec_decode_steps_saved"], None),
]
REWARD_KEYS = ["reward_mean", "accuracy", "heldout_accuracy"]
PHASES = [
    "generate_time",
    "reward_time",
    "trainer_wait_time",
    "train_time",
    "weight_sync_time",
    "heldout_eval_time",
]
ACCOUNTING = ["trained", "filtered", "carried_over", "lost"]

CSS = """
body{font-family:system-ui,-apple-system,"DejaVu Sans",sans-serif;margin:16px 24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 6px;border-bottom:1px solid #ddd}
.meta{color:#555;font-size:13px} .grid{display:flex;flex-wrap:wrap;gap:10px}
figure.chart{margin:0;padding:6px;border:1px solid #e3e3e3;border-radius:4px;width:480px}
figcaption{font-size:13px;font-weight:600;margin-bottom:2px}
svg.plot text{font-size:10px;fill:#444} svg.plot .frame{fill:none;stroke:#bbb}
svg.plot line.grid{stroke:#eee} svg.plot text.empty{font-size:13px;fill:#999}
.legend{font-size:11px;display:flex;flex-wrap:wrap;gap:4px 12px} svg.key{vertical-align:middle}
table{border-collapse:collapse;font-size:12px;margin:4px 0}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left} th{background:#f5f5f5}
.warn{background:#fff4e5;border-left:4px solid #f0a020;padding:4px 8px;margin:3px 0;font-size:13px}
.ok{color:#2a7a2a;font-size:13px} details{font-size:12px} .tables{display:flex;flex-wrap:wrap;gap:24px}
"""


def _heldout_series(run: RunData, x: str) -> tuple[list[float], list[float | None]]:
    """Held-out accuracy: base (eval.json, before training, at 0), periodic evals, final (at the end)."""
    xs, ys = run.values("heldout_accuracy", x)
    pts = [(a, b) for a, b in zip(xs, ys) if b is not None]
    ev = run.evals or {}
    if (ev.get("base") or {}).get("accuracy") is not None:
        pts.insert(0, (0.0, float(ev["base"]["accuracy"])))
    if (ev.get("final") or {}).get("accuracy") is not None and run.records:
        end = run.records[-1].get(x)
        if isinstance(end, (int, float)):
            pts.append((float(end), float(ev["final"]["accuracy"])))
    return [p[0] for p in pts], [p[1] for p in pts]


def _series(runs: list[RunData], keys: list[str], x: str) -> list[Series]:
    """One series per (run, key): color by key for a single run, by run (dash by key) when comparing."""
    out = []
    for i, run in enumerate(runs):
        for j, key in enumerate(keys):
            xs, ys = _heldout_series(run, x) if key == "heldout_accuracy" else run.values(key, x)
            name = key if len(runs) == 1 else f"{run.label}: {key}"
            color, dash = (j, 0) if len(runs) == 1 else (i, j)
            out.append(Series(name, xs, ys, color=color, dash=dash))
    return out


def _staleness(runs: list[RunData]) -> str:
    if len(runs) > 1:  # per-step histograms do not overlay: compare the mean and max instead
        return line_chart(
            "staleness",
            "Token staleness (policy versions)",
            _series(runs, ["staleness_mean", "staleness_max"], "step"),
        )
    run = runs[0]
    rows = [r for r in run.records if isinstance(r.get("staleness_hist"), dict)]
    ages = sorted({int(k) for r in rows for k in r["staleness_hist"]})
    stacks = {f"{a} behind": [float(r["staleness_hist"].get(str(a), 0)) for r in rows] for a in ages}
    return stacked_bars(
        "staleness",
        "Staleness histogram per step (tokens by policy versions behind)",
        [str(r.get("step")) for r in rows],
        stacks,
        "step",
    )


def _phases(runs: list[RunData]) -> str:
    keys = [k for k in PHASES if any(run.has(k) for run in runs)]
    if len(runs) > 1:
        cats = [run.label for run in runs]
        # over every step: a phase a step did not log (the held-out evaluation of some steps) took 0 s
        stacks = {
            k: [statistics.fmean(v or 0.0 for v in run.values(k)[1]) if run.has(k) else 0.0 for run in runs]
            for k in keys
        }
        return stacked_bars("phases", "Mean seconds per step by phase", cats, stacks, "run")
    run = runs[0]
    stacks = {k: [v or 0.0 for v in run.values(k)[1]] for k in keys}
    return stacked_bars(
        "phases",
        "Seconds per step by phase (the trainer's view)",
        [str(int(s)) for s in run.values("step")[0]],
        stacks,
        "step",
    )


def _accounting(runs: list[RunData]) -> str:
    have = [r for r in runs if r.accounting]
    stacks = {k: [float(r.accounting.get(k, 0)) for r in have] for k in ACCOUNTING}  # type: ignore[union-attr]
    chart = stacked_bars("accounting", "Sample accounting (groups)", [r.label for r in have], stacks, "run")
    cols = ["admitted", "generated", *ACCOUNTING, "filter_reasons"]
    rows = [[r.label, *[r.accounting.get(c, "") for c in cols]] for r in have]  # type: ignore[union-attr]
    return chart + _table(["run", *cols], rows)


def _table(head: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        if isinstance(v, dict):
            return escape(", ".join(f"{k}: {x}" for k, x in v.items())) or "-"
        return escape(str(v))

    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    out, start = [], None
    for i, s in enumerate(steps):
        if start is None:
            start = s
        if i + 1 == len(steps) or steps[i + 1] != s + 1:
            out.append(str(start) if start == s else f"{start}-{s}")
            start = None
    return ", ".join(out)


def _diagnostics(runs: list[RunData]) -> str:
    parts = []
    for run in runs:
        found = run.findings if run.findings is not None else diagnose(run.records)
        prefix = f"{escape(run.label)}: " if len(runs) > 1 else ""
        if not found:
            parts.append(f'<p class="ok">{prefix}no diagnostic rule fired over {len(run.records)} steps.</p>')
        for f in found:
            parts.append(
                f'<div class="warn" data-rule="{f.rule}">{prefix}<b>{f.rule}</b> '
                f"at steps {_ranges(f.steps)}: "
                f"{escape(f.first_message)}</div>"
            )
    rules = _table(["rule", "fires when", "threshold"], [[r.name, r.description, r.threshold] for r in RULES])
    return "".join(parts) + f"<details><summary>rules</summary>{rules}</details>"


def _error_examples(runs: list[RunData]) -> str:
    """Each kind of failure's first message in the run, where it first appeared and in how many steps
    (the step records' *_error_examples); nothing when no run had one."""
    head = ["kind", "reason", "first message", "first at step", "steps with it"]
    rows = [
        [run.label, e.what, e.reason, e.message, e.first_step, e.steps]
        for run in runs
        for e in run_examples(run.records)
    ]
    if not rows:
        return ""
    table = _table(["run", *head], rows) if len(runs) > 1 else _table(head, [r[1:] for r in rows])
    return f"<h2>Error messages</h2>{table}"


def _evals(runs: list[RunData]) -> str:
    def acc(e: dict[str, Any] | None) -> str:
        if not e:
            return "-"
        lo, hi = e["ci95"]
        return f"{e['accuracy']:.1%} ({e['correct']}/{e['n']}, 95% CI {lo:.1%}-{hi:.1%})"

    rows = []
    for run in runs:
        ev = run.evals or {}
        diff = ev.get("difference")
        d = f"{diff['mean']:+.1%} (95% CI {diff['ci95'][0]:+.1%} to {diff['ci95'][1]:+.1%})" if diff else "-"
        wall = (run.summary or {}).get("timings", {}).get("total")
        rows.append(
            [
                run.label,
                len(run.records),
                acc(ev.get("base")),
                acc(ev.get("final")),
                d,
                f"{wall:.0f} s" if wall else "-",
                _status(run),
            ]
        )
    return _table(
        ["run", "steps", "held-out base", "held-out final", "difference (paired)", "wall time", "status"],
        rows,
    )


def _status(run: RunData) -> str:
    """How the run ended, from summary.json (written when a run ends, stopped too; none while it runs)."""
    s = run.summary
    if not s:
        return "in progress (or stopped before the end)"
    if not s.get("interrupted"):
        return "finished"
    where = "in the final evaluation " if s.get("final_eval_stopped") else ""
    said = f"stopped {where}at step {s.get('steps', '?')}"
    if not has_saved_state(run.path):  # stopped before its first save: nothing to resume
        return said
    return said + (" (resume to evaluate it)" if where else " (resume to continue)")


def _config_env(runs: list[RunData]) -> str:
    flat = [flatten(r.config) for r in runs]
    keys = sorted({k for f in flat for k in f})
    if len(runs) > 1:
        diff = [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1]
        head = _table(
            ["config key", *[r.label for r in runs]], [[k, *[f.get(k, "") for f in flat]] for k in diff]
        )
        shown = "<h3>Config keys that differ</h3>" + head
    else:
        main = [
            "model",
            "task",
            "algo",
            "max_steps",
            "max_staleness",
            "runtime.mode",
            "loss.name",
            "advantage.name",
            "rollout.prompts_per_step",
            "rollout.samples_per_prompt",
            "train.lr",
        ]
        shown = _table(["config key", "value"], [[k, flat[0].get(k, "")] for k in main if k in flat[0]])
    full = _table(
        ["config key", *[r.label for r in runs]], [[k, *[f.get(k, "") for f in flat]] for k in keys]
    )
    envs = [r.environment or _report_time_environment(r) for r in runs]
    env_keys = sorted({k for e in envs for k in e})
    env = _table(
        ["environment", *[r.label for r in runs]], [[k, *[e.get(k, "") for e in envs]] for k in env_keys]
    )
    return (
        f'<div class="tables"><div>{shown}<details><summary>full config</summary>{full}</details></div>'
        f"<div>{env}</div></div>"
    )


def _report_time_environment(run: RunData) -> dict[str, Any]:
    """For runs from before environment.json: the config's thread settings and this machine's versions,
    marked as such (they may differ from what the run used)."""
    cfg = run.config
    env = collect_environment(
        str(cfg.get("model", "?")),
        (cfg.get("train") or {}).get("threads", "?"),
        (cfg.get("runtime") or {}).get("rollout_threads", "?"),
        (cfg.get("runtime") or {}).get("rollout_workers", "?"),
    )
    if env.get("trainer_threads") == 0:
        env["trainer_threads"] = "auto (cores minus rollout threads)"
    return {"recorded": "no: versions at report time, threads from config.yaml", **env}


def render_report(runs: list[RunData]) -> str:
    """The HTML page for one run or an overlay of several."""
    compare = len(runs) > 1
    title = (
        "streamrl comparison: " + " vs ".join(r.label for r in runs)
        if compare
        else f"streamrl run {runs[0].label}"
    )
    cfg = runs[0].config
    meta = (
        f"{len(runs)} runs"
        if compare
        else f"{escape(str(runs[0].path))} &middot; model {escape(str(cfg.get('model', '?')))} &middot; task "
        f"{escape(str(cfg.get('task', '?')))} &middot; algo {escape(str(cfg.get('algo') or '-'))}"
    )
    charts = [
        line_chart(
            "reward_step",
            "Reward, accuracy and held-out accuracy vs step",
            _series(runs, REWARD_KEYS, "step"),
            "step",
        ),
        line_chart(
            "reward_time",
            "Reward, accuracy and held-out accuracy vs wall time",
            _series(runs, REWARD_KEYS, "time"),
            "seconds since start",
        ),
    ]
    for name, ptitle, keys, yr in LINE_PANELS:
        charts.append(line_chart(name, ptitle, _series(runs, keys, "step"), "step", yr))
    charts.insert(8, _staleness(runs))
    charts.insert(9, _phases(runs))
    if any(run.has("spec_acceptance_rate") for run in runs):
        for name, ptitle, keys, yr in SPEC_PANELS:
            charts.append(line_chart(name, ptitle, _series(runs, keys, "step"), "step", yr))
    generated = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title><style>{CSS}</style></head>
<body>
<h1>{escape(title)}</h1>
<p class="meta">{meta} &middot; generated {generated} by <code>streamrl report</code></p>
<h2>Held-out evaluation</h2>{_evals(runs)}
<h2>Diagnostics</h2>{_diagnostics(runs)}{_error_examples(runs)}
<h2>Training curves</h2><div class="grid">{"".join(charts)}</div>
<h2>Sample accounting</h2><div class="grid">{_accounting(runs)}</div>
<h2>Config and environment</h2>{_config_env(runs)}
</body></html>
"""


def write_report(
    paths: list[str | Path], out: str | Path | None = None, findings: list[Finding] | None = None
) -> Path:
    """Render the run directories `paths` into `out` (default: RUN/report.html for one run,
    FIRST_RUN/compare.html for several), whole (files.py); returns the path written. `findings`: the
    diagnostics of the one run as a live DiagnosticsMonitor has them (else replayed from its records)."""
    if not paths:
        raise ValueError("report: give at least one run directory")
    if out is not None and (Path(out).is_dir() or not Path(out).parent.is_dir()):
        where = (
            "is a directory"
            if Path(out).is_dir()
            else f"is in a directory that does not exist ({Path(out).parent})"
        )
        raise ValueError(f"--out {out} {where}: name an .html file in an existing directory")
    dirs = [Path(p) for p in paths]
    runs = [load_run(p, label) for p, label in zip(dirs, unique_labels(dirs))]
    if findings is not None and len(runs) == 1:
        runs[0].findings = findings
    target = Path(out) if out else dirs[0] / ("report.html" if len(dirs) == 1 else "compare.html")
    write_text_atomic(target, render_report(runs))  # readers see the old page or the new one
    return target
