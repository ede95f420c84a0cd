"""The package's import graph: no cycles and no import that runs upward through the layers.

Every `import` and `from ... import` counts, at module level or inside a function: a late import
hides a cycle from the interpreter, not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

# Bottom to top: a module may import its own package and any package of a lower layer.
LAYERS = [
    # brief imports nothing from streamrl, user_code only brief; files imports processes
    {"brief", "types", "config_parse", "presets", "user_code", "processes", "files"},
    {"algo", "run_dirs"},  # run_dirs: what makes a directory a run's (files' lock name)
    {"config_algo", "config_bounds", "config_resume", "config_rewards", "config_validate"},
    # config_docs: `streamrl config`, read from the field comments of config.py and config_sections.py
    {"config", "config_sections", "config_docs"},
    {"models", "observe", "rewards"},
    {"engine", "data"},
    {"envs"},
    {"tasks"},  # the task factory: data/ task types and envs/
    {"preflight"},  # model and task checks before any work
    {"rollout", "trainer"},  # producing rollouts; training on them
    {"eval", "placement"},  # evaluation; where workers and trainer ranks run, how weights travel
    {"loop"},  # the RL loop and the train job
    {"eval_settings"},  # the config of `streamrl eval`: a trained run's task settings under the given ones
    {"sim", "eval_cli", "score_cli", "report_cli"},
    {"api_rows"},  # the Python API's rows from code (train_data=, eval_data=)
    {"cli", "api"},  # the command line; the Python API (streamrl.train, streamrl.evaluate)
]


def _modules() -> dict[str, Path]:
    out = {}
    for p in (SRC / "streamrl").rglob("*.py"):
        parts = p.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The streamrl modules `name` imports (an imported name that is a module counts as that module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _layer(module: str) -> int | None:
    top = module.split(".")[1] if "." in module else ""
    return next((i for i, names in enumerate(LAYERS) if top in names), None)


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_cycle_detection_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_package_has_a_layer():
    unplaced = sorted({m.split(".")[1] for m in _modules() if "." in m and _layer(m) is None})
    assert unplaced == [], "add these to LAYERS"


def test_no_import_runs_upward():
    upward = [
        f"{a} -> {b}"
        for a, deps in _graph().items()
        for b in deps
        if "streamrl" not in (a, b)  # the package's __init__ (__version__) runs first whatever is imported
        and a.split(".")[1] != b.split(".")[1]
        and _layer(b) > _layer(a)
    ]
    assert sorted(upward) == []
