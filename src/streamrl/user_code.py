"""Load a user's object named in the config: `package.module:attr` or `path/to/file.py:attr`.

The working directory is importable the way `python -m` makes it, so `task=agent:my_agents:solve`
finds ./my_agents.py without PYTHONPATH; a file path is taken relative to the working directory. Every
failure is a ValueError of one line naming the config key, the spec and the fix.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from streamrl.brief import brief_error

_FILE_MODULES: dict[Path, ModuleType] = {}  # a file is executed once per process


def article(noun: str) -> str:
    """`noun` with its indefinite article: 'an int', 'a float'."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _import_module(name: str, key: str, spec: str) -> ModuleType:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
            raise ValueError(
                f"config key '{key}': no module '{name}' (from '{spec}') in the working directory {cwd} or "
                f"on sys.path: run from the directory holding {name.replace('.', '/')}.py, install its "
                f"package, or give a file: path/to/{name.rpartition('.')[2]}.py:{spec.rpartition(':')[2]}"
            ) from None
        raise ValueError(
            f"config key '{key}': importing '{name}' (from '{spec}') failed: {brief_error(e, typed=True)}; "
            "install what it imports"
        ) from None
    except Exception as e:  # any error of the user's module becomes one line
        raise ValueError(
            f"config key '{key}': importing '{name}' (from '{spec}') failed: {brief_error(e, typed=True)}"
        ) from None


def _import_file(path_text: str, key: str, spec: str) -> ModuleType:
    path = Path(path_text).expanduser()
    path = (path if path.is_absolute() else Path.cwd() / path).resolve()
    if not path.is_file():
        where = "" if Path(path_text).expanduser().is_absolute() else f" (relative to {os.getcwd()})"
        raise ValueError(
            f"config key '{key}': file '{path_text}' (from '{spec}') not found{where}: "
            "give an existing .py file, absolute or relative to the working directory"
        )
    if path in _FILE_MODULES:
        return _FILE_MODULES[path]
    main = sys.modules.get("__main__")  # in a spawned worker: the script as multiprocessing re-ran it
    if getattr(main, "__file__", None) and Path(main.__file__).resolve() == path:
        return main  # the running script (streamrl.train(reward_fn=...) in it): never run it a second time
    name = (
        path.stem
        if path.stem.isidentifier() and path.stem not in sys.modules
        else f"_streamrl_user_{len(_FILE_MODULES)}"
    )
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ValueError(
            f"config key '{key}': '{path_text}' (from '{spec}') is not a Python file: name it *.py"
        )
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # as an import would: pickling and dataclasses look the module up by name
    try:
        loader_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ValueError(
            f"config key '{key}': running '{path_text}' (from '{spec}') failed: {brief_error(e, typed=True)}"
        ) from None
    _FILE_MODULES[path] = module
    return module


def load_object(spec: str, key: str, callable_required: bool = True) -> Any:
    """`package.module:attr` or `path/to/file.py:attr` -> the object; ValueError (one line) naming `key`."""
    where, _, attr = spec.rpartition(":")
    if not where or not attr or not attr.isidentifier():
        raise ValueError(
            f"config key '{key}': '{spec}' must look like package.module:function or path/to/file.py:function"
        )
    is_file = where.endswith(".py") or "/" in where or os.sep in where
    module = _import_file(where, key, spec) if is_file else _import_module(where, key, spec)
    if not hasattr(module, attr):
        names = sorted(
            n
            for n, v in vars(module).items()
            if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        )
        fix = f"name one it defines: {', '.join(names)}" if names else "check the name"
        raise ValueError(f"config key '{key}': '{where}' has no attribute '{attr}' (from '{spec}'): {fix}")
    obj = getattr(module, attr)
    if callable_required and not callable(obj):
        raise ValueError(
            f"config key '{key}': '{spec}' is {article(type(obj).__name__)}, not callable: name a function "
            "or class"
        )
    return obj
