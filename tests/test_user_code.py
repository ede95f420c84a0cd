"""user_code.load_object: `module:attr` from the working directory (as `python -m` imports) or an
installed package, `path/to/file.py:attr`; every failure one line naming the key, the spec and the fix."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from streamrl.cli import main
from streamrl.config import load_config
from streamrl.tasks import task_from_config
from streamrl.user_code import load_object

AGENT = "def solve(client, messages):\n    return 'The answer is 1.'\n\nVALUE = 3\n"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory that is not on sys.path (as when `streamrl` runs from a shell there)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path
    for name in [
        n for n, m in sys.modules.items() if str(getattr(m, "__file__", "")).startswith(str(tmp_path))
    ]:
        del sys.modules[name]


def test_module_in_the_working_directory_is_found_without_pythonpath(workdir):
    (workdir / "uc_agents_a.py").write_text(AGENT)
    fn = load_object("uc_agents_a:solve", "task")
    assert fn(None, []) == "The answer is 1." and fn.__module__ == "uc_agents_a"
    assert sys.path[0] == os.getcwd()


def test_installed_module_and_non_callable_attribute():
    assert load_object("os.path:join", "reward.fn") is os.path.join
    assert load_object("os:sep", "reward.fn", callable_required=False) == os.sep


def test_file_spec_relative_to_the_working_directory_and_absolute(workdir):
    (workdir / "agents").mkdir()
    (workdir / "agents" / "uc_file_b.py").write_text(AGENT)
    fn = load_object("agents/uc_file_b.py:solve", "task")
    assert fn(None, []) == "The answer is 1."
    assert load_object(f"{workdir}/agents/uc_file_b.py:solve", "task") is fn  # the file runs once
    assert load_object("agents/uc_file_b.py:VALUE", "task", callable_required=False) == 3


@pytest.mark.parametrize(
    "spec, message",  # each message follows "config key 'task': "
    [
        (
            "uc_missing_c:solve",
            "no module 'uc_missing_c' (from 'uc_missing_c:solve') in the working directory {cwd} or on "
            "sys.path: run from the directory holding uc_missing_c.py, install its package, or give a file: "
            "path/to/uc_missing_c.py:solve",
        ),
        (
            "nope/uc_d.py:solve",
            "file 'nope/uc_d.py' (from 'nope/uc_d.py:solve') not found (relative to {cwd}): "
            "give an existing .py file, absolute or relative to the working directory",
        ),
        (
            "uc_agents_e:solv",
            "'uc_agents_e' has no attribute 'solv' (from 'uc_agents_e:solv'): name one it defines: solve",
        ),
        ("uc_agents_e:VALUE", "'uc_agents_e:VALUE' is an int, not callable: name a function or class"),
        ("uc_agents_e", "'uc_agents_e' must look like package.module:function or path/to/file.py:function"),
        (
            "uc_broken_f:solve",
            "importing 'uc_broken_f' (from 'uc_broken_f:solve') failed: ModuleNotFoundError: "
            "No module named 'not_installed_dep_xyz'; install what it imports",
        ),
        (
            "uc_syntax_g.py:solve",
            "running 'uc_syntax_g.py' (from 'uc_syntax_g.py:solve') failed: SyntaxError: "
            "invalid syntax (uc_syntax_g.py, line 1)",
        ),
    ],
)
def test_errors_are_one_line_naming_key_spec_and_fix(workdir, spec, message):
    (workdir / "uc_agents_e.py").write_text(AGENT)
    (workdir / "uc_broken_f.py").write_text("import not_installed_dep_xyz\n")
    (workdir / "uc_syntax_g.py").write_text("def (:\n")
    with pytest.raises(ValueError) as e:
        load_object(spec, "task")
    assert str(e.value) == "config key 'task': " + message.format(cwd=workdir)


def test_agent_task_loads_its_function_from_the_working_directory(workdir):
    (workdir / "uc_agents_h.py").write_text(AGENT)
    cfg = load_config(None, ["task=agent:uc_agents_h:solve", "runtime.mode=colocated", "max_staleness=0"])
    task = task_from_config(cfg)
    assert task.agent.__module__ == "uc_agents_h" and task.agent.__name__ == "solve"


def test_missing_agent_module_stops_before_the_run_directory(workdir, capsys):
    run = workdir / "run"
    args = [
        "train",
        "task=agent:uc_nope_i:solve",
        "runtime.mode=colocated",
        "max_staleness=0",
        f"run_dir={run}",
    ]
    assert main([*args, "model=tiny-random"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        "streamrl: error: config key 'task': no module 'uc_nope_i' (from 'uc_nope_i:solve')"
    )
    assert not run.exists()


def test_a_missing_name_lists_every_function_the_file_defines(workdir):
    names = [f"fn_{i:02d}" for i in range(14)]
    (workdir / "uc_many_h.py").write_text("".join(f"def {n}(): pass\n" for n in names) + "VALUE = 3\n")
    with pytest.raises(ValueError) as e:
        load_object("uc_many_h.py:nothere", "reward.fn")
    assert str(e.value) == (
        "config key 'reward.fn': 'uc_many_h.py' has no attribute 'nothere' (from 'uc_many_h.py:nothere'): "
        f"name one it defines: {', '.join(names)}"
    )
