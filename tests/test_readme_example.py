"""The README's example of your own reward functions and data through the Python API runs as written:
my_rewards.py and the training script are taken from the README, unchanged, and run as a user would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    section = README.read_text().split("## Your model, your reward, your data", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_readme_api_example_runs(tmp_path: Path) -> None:
    rewards, script = _python_blocks()
    assert rewards.startswith("# my_rewards.py\n")
    (tmp_path / "my_rewards.py").write_text(rewards)
    (tmp_path / "train.py").write_text(script)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    res = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    run_dir, brevity, accuracy, checkpoint = res.stdout.strip().splitlines()[-1].split()
    assert (tmp_path / run_dir / "config.yaml").is_file() and (
        tmp_path / checkpoint / "config.json"
    ).is_file()
    rows = [json.loads(x) for x in (tmp_path / run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert float(brevity) == rows[-1]["reward/brevity"] and {"reward/shows_work", "reward/task"} <= set(
        rows[-1]
    )
    assert 0.0 <= float(accuracy) <= 1.0
