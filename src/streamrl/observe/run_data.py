"""Read a run directory back: metrics.jsonl and the JSON/YAML files next to it (for the report)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrl.config_parse import read_yaml
from streamrl.observe.metrics import NON_FINITE_KEY, nan_or_inf_keys
from streamrl.run_dirs import holds_run, started_only


@dataclass
class RunData:
    """Everything the report shows about one run; optional files are None when absent (run in progress)."""

    label: str
    path: Path
    records: list[dict[str, Any]]
    config: dict[str, Any]
    accounting: dict[str, Any] | None
    summary: dict[str, Any] | None
    evals: dict[str, Any] | None
    environment: dict[str, Any] | None
    findings: list[Any] | None = None  # diagnostics.Finding of a live run's monitor (None: replay)

    def values(self, key: str, x: str = "step") -> tuple[list[float], list[float | None]]:
        """(xs, ys) of a numeric metric over the records that have x; missing and non-finite values are
        None (gaps)."""
        xs, ys = [], []
        for r in self.records:
            if not isinstance(r.get(x), (int, float)):
                continue
            v = r.get(key)
            xs.append(float(r[x]))
            number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            ys.append(float(v) if number else None)
        return xs, ys

    def has(self, key: str) -> bool:
        return any(isinstance(r.get(key), (int, float)) for r in self.records)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Parse metrics.jsonl; a torn last line (the run is writing or crashed mid-line) is skipped."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}:{i + 1}: not a JSON line ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{i + 1}: expected a JSON object per line")
        out.append(_without_gaps(row))
    return out


def _without_gaps(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics line with its null values dropped: a metric the step did not log, or one that was NaN or
    infinite (named in the line's NON_FINITE_KEY list, where a file written before null was used gets its
    bare NaN / Infinity keys too), so every reader treats them as missing."""
    bad = nan_or_inf_keys(row)
    kept = {k: v for k, v in row.items() if v is not None and k not in bad}
    if bad:
        named = kept.get(NON_FINITE_KEY)
        kept[NON_FINITE_KEY] = [*(named if isinstance(named, list) else []), *bad]
    return kept


def _json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON ({e.msg})") from None
    return data if isinstance(data, dict) else None


def _no_metrics_message(path: str | Path) -> str:
    """Why `path` has no metrics.jsonl: it does not exist, its run has no step done yet, or it is no run."""
    p = Path(path)
    if not p.exists():
        return f"'{path}' does not exist: give a run directory (a run's run_dir)"
    if holds_run(p) or started_only(p):  # its config.yaml and what a run writes first, or its start
        return (
            f"'{path}' holds a run that has not finished its first step (no metrics.jsonl yet): "
            "try again after it"
        )
    return f"'{path}' is not a run directory (no metrics.jsonl)"


def load_run(path: str | Path, label: str | None = None) -> RunData:
    """A RunData from a run directory; FileNotFoundError (one line) if it is not one."""
    p = Path(path)
    metrics = p / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(_no_metrics_message(path))
    cfg_path = p / "config.yaml"
    config = read_yaml(cfg_path, "run config") if cfg_path.is_file() else {}
    return RunData(
        label=label or p.resolve().name,
        path=p,
        records=read_metrics(metrics),
        config=config if isinstance(config, dict) else {},
        accounting=_json(p / "accounting.json"),
        summary=_json(p / "summary.json"),
        evals=_json(p / "eval.json"),
        environment=_json(p / "environment.json"),
    )


def unique_labels(paths: list[Path]) -> list[str]:
    """Directory names, widened with parents until they differ (runs/a/x vs runs/b/x -> a/x, b/x)."""
    parts = [p.resolve().parts for p in paths]
    for depth in range(1, max(len(x) for x in parts) + 1):
        labels = ["/".join(x[-depth:]) for x in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(p) for p in paths]


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'train': {'lr': 1}} -> {'train.lr': 1} (config tables)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
