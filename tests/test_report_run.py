"""A real tiny-random run: TensorBoard holds the same scalars as metrics.jsonl, and report.html opens in
headless Chromium with no console errors and every plot drawn.

Chromium comes from Debian (`make chromium`, a dependency of `make test`). Without it the browser tests
are skipped with a loud reason; everything else still runs.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import warnings
from html.parser import HTMLParser
from pathlib import Path

import pytest

from streamrl.cli import main

TINY = [
    "model=tiny-random",
    "seed=0",
    "max_steps=4",
    "eval.size=8",
    "eval.every=2",
    "rollout.prompts_per_step=2",
    "rollout.samples_per_prompt=4",
    "rollout.max_new_tokens=8",
    "eval.max_new_tokens=8",
    "train.lr=1e-2",
    "checkpoint.save=false",
    "reward.extract=last_number",
    "observe.report_every=2",
]
PLOTS = {"reward_step", "reward_time", "length", "truncation", "entropy", "kl", "clip", "ratio", "staleness",
         "phases", "throughput", "waiting", "accounting"}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("report") / "run"
    assert main(["train", *TINY, f"run_dir={run}"]) == 0
    return run


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    reason = "CHROMIUM NOT INSTALLED: the report browser test did NOT run; install it with `make chromium`"
    warnings.warn(reason, stacklevel=2)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def chromium() -> str:
    """Resolved before tiny_run in the browser tests, so a missing browser skips without training."""
    return _chromium()


def _run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
           f"--user-data-dir={tmp_path / 'profile'}", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


def _console_errors(stderr: str) -> list[str]:
    """JS console messages and uncaught exceptions as Chromium logs them (INFO:CONSOLE lines)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


class _Plots(HTMLParser):
    """Per <svg class="plot">: points of each <path> (from its d attribute), bars and circles."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, dict[str, list[int]]] = {}
        self._cur: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "svg" and "plot" in (a.get("class") or ""):
            self._cur = a["data-plot"] or ""
            self.plots[self._cur] = {"path": [], "rect": [], "circle": []}
        elif self._cur is not None and tag == "path":
            self.plots[self._cur]["path"].append(len(re.findall(r"[ML]-?[\d.]+,-?[\d.]+", a.get("d") or "")))
        elif self._cur is not None and tag == "rect" and a.get("data-stack"):
            self.plots[self._cur]["rect"].append(int(float(a.get("height") or 0) > 0))
        elif self._cur is not None and tag == "circle":
            self.plots[self._cur]["circle"].append(1)

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._cur = None


def test_tensorboard_holds_the_jsonl_scalars(tiny_run: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = [json.loads(x) for x in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    acc = EventAccumulator(str(tiny_run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = {k for r in rows for k, v in r.items()
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}  # fmt: skip
    assert {"reward_mean", "entropy", "trainer_wait_share", "heldout_accuracy"} <= expected
    assert tags == expected
    for key in expected:
        jsonl = {r["step"]: float(r[key]) for r in rows if key in r and math.isfinite(r[key])}
        tb = {e.step: e.value for e in acc.Scalars(key)}
        assert tb.keys() == jsonl.keys(), key
        for step, v in jsonl.items():
            assert tb[step] == pytest.approx(v, rel=1e-6, abs=1e-6), (key, step)  # TB stores float32


def test_run_dir_has_report_and_environment(tiny_run: Path):
    env = json.loads((tiny_run / "environment.json").read_text())
    assert {"python", "torch", "transformers", "trainer_threads", "model"} <= env.keys()
    html = (tiny_run / "report.html").read_text()
    assert "streamrl run" in html and "finished" in html and not list(tiny_run.glob(".tmp-*"))


def test_report_opens_in_headless_chromium(chromium: str, tiny_run: Path, tmp_path: Path):
    page = (tiny_run / "report.html").resolve()
    html = page.read_text()
    # self-contained and script-free: nothing to fetch, nothing to execute
    assert "<script" not in html and not re.search(r'(src|href)="(https?:)?//', html)
    res = _run_chromium(tmp_path, "--dump-dom", page.as_uri())
    assert _console_errors(res.stderr) == []
    parser = _Plots()
    parser.feed(res.stdout)  # the DOM as the browser built it
    assert set(parser.plots) == PLOTS
    for name, found in parser.plots.items():
        drawn = sum(1 for n in found["path"] if n >= 1) + sum(found["rect"])
        assert drawn > 0, f"plot {name} is empty: {found}"
    assert max(parser.plots["reward_step"]["path"]) == 4  # 4 training steps -> 4 points on reward_mean
    shot = tmp_path / "report.png"
    _run_chromium(
        tmp_path, "--hide-scrollbars", "--window-size=1100,3000", f"--screenshot={shot}", page.as_uri()
    )
    assert shot.stat().st_size > 20_000  # a blank page compresses to a few KB


def test_console_error_detection_works(chromium: str, tmp_path: Path):
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>notDefined();</script></body></html>")
    res = _run_chromium(tmp_path, "--dump-dom", bad.as_uri())
    assert any("notDefined" in line for line in _console_errors(res.stderr))
