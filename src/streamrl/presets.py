"""Algorithm presets: `streamrl train algo=NAME` layers configs/NAME.yaml under the user's settings.

Order of precedence: defaults < preset < config file < key=value overrides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamrl.config_parse import read_yaml

HERE = Path(__file__).parent / "configs"  # also reachable as configs/ at the repository root


def names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def load_preset(name: str) -> dict[str, Any]:
    path = HERE / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown algo preset '{name}'; choose from {', '.join(names())}")
    data = read_yaml(path, "algo preset") or {}
    data.pop("description", None)
    return data


def describe(name: str) -> str:
    return str(read_yaml(HERE / f"{name}.yaml", "algo preset").get("description", ""))
