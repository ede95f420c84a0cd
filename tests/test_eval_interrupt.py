"""A Ctrl-C during `streamrl eval` stops it with one line and exit code 130, no traceback, and writes
nothing: an eval.json it would have updated stays as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from streamrl import cli

LINE = "streamrl eval: interrupted; nothing written\n"
ARGS = ["eval", "model=tiny-random", "size=2", "eval.max_new_tokens=2", "reward.extract=last_number"]


def main(args: list[str]) -> int:
    """cli.main; a KeyboardInterrupt it lets through fails the test (pytest would stop the session)."""
    try:
        return cli.main(args)
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt went through main()")


def test_a_keyboard_interrupt_is_one_line_and_exit_code_130(tmp_path, monkeypatch, capsys):
    import streamrl.eval_cli

    def interrupted(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(streamrl.eval_cli, "run_eval", interrupted)
    assert main([*ARGS, f"run_dir={tmp_path / 'e'}"]) == 130
    assert capsys.readouterr().err == LINE
    assert not (tmp_path / "e").exists()


def _ctrl_c_at_generation(monkeypatch) -> None:
    from streamrl.engine.hf import HFEngine

    def generate(self, requests, stop=None):
        raise KeyboardInterrupt  # what Python's own SIGINT handler raises (a pytest-xdist worker ignores
        # SIGINT, so the signal itself is sent in the subprocess test below)

    monkeypatch.setattr(HFEngine, "generate", generate)


def test_a_ctrl_c_while_generating_leaves_the_runs_eval_json_as_it_was(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: tiny-random\n")
    before = json.dumps({"base": {"accuracy": 0.25}})
    (run / "eval.json").write_text(before)
    _ctrl_c_at_generation(monkeypatch)
    assert main([*ARGS, "n=2", f"run_dir={run}"]) == 130
    err = capsys.readouterr().err
    assert err.endswith(LINE) and "Traceback" not in err
    assert (run / "eval.json").read_text() == before
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "eval.json"]


def test_the_streamrl_command_exits_130_without_a_traceback(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from streamrl.engine.hf import HFEngine
        from streamrl.cli import run

        signal.signal(signal.SIGINT, signal.default_int_handler)  # a pytest-xdist parent ignores SIGINT

        def generate(self, requests, stop=None):
            os.kill(os.getpid(), signal.SIGINT)

        HFEngine.generate = generate
        sys.argv = ["streamrl", *{ARGS!r}, "run_dir={tmp_path / "e"}"]
        run()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src")}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 130, p.stderr
    assert p.stderr.endswith(LINE) and "Traceback" not in p.stderr
    assert not (tmp_path / "e").exists()
