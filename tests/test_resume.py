"""Ctrl-C mid-run, then resume: every group is trained exactly once and the bound still holds."""

import json
import os
import signal
import subprocess
import sys
import time

from streamrl.cli import main
from streamrl.loop.state import latest_state

ARGS = [
    "model=tiny-random",
    "eval.size=8",
    "rollout.prompts_per_step=2",
    "rollout.samples_per_prompt=4",
    "rollout.max_new_tokens=8",
    "eval.max_new_tokens=8",
    "reward.extract=last_number",
    "max_staleness=2",
    "max_steps=10",
]


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_ctrl_c_then_resume_is_exactly_once(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli", "train", *ARGS, f"run_dir={run}"],
        start_new_session=True,  # its own process group, like a terminal job
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 120
    while len(_lines(run / "metrics.jsonl")) < 3:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the controller and its workers
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()[-2000:]

    first = _lines(run / "metrics.jsonl")
    k = len(first)
    assert 3 <= k < 10
    acc1 = json.loads((run / "accounting.json").read_text())
    assert acc1["lost"] == 0 and acc1["trained"] == 2 * k
    assert acc1["carried_over"] > 0  # eta = 2 keeps groups in flight: they must survive the stop
    state = json.loads((latest_state(run) / "run_state.json").read_text())
    assert state["step"] == state["version"] == k
    # the async loop's totals behind trainer_wait_share, as of step k: the resume continues them
    clock = state["clock"]
    assert 0 < clock["trainer_waited"] < clock["loop_elapsed"] <= clock["time"]
    carried = {g for g, st in state["ledger"]["state"].items() if st == "carried_over"}
    assert len(carried) == acc1["carried_over"]

    assert main(["train", f"resume={run}"]) == 0
    rows = _lines(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 11))
    assert [r["policy_version"] for r in rows] == list(range(1, 11))
    assert all(r["staleness_max"] <= 2 for r in rows)
    groups = _lines(run / "groups.jsonl")
    assert len(groups) == 20
    assert len({g["group_id"] for g in groups}) == 20  # no group trained twice
    assert len({g["problem_id"] for g in groups}) == 20  # nor a problem drawn twice
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["trained"] == 20 and acc["lost"] == 0
    assert acc["admitted"] == acc["trained"] + acc["filtered"] + acc["carried_over"]
    ended = json.loads((latest_state(run) / "run_state.json").read_text())
    assert ended["clock"]["loop_elapsed"] > clock["loop_elapsed"]
    assert ended["clock"]["trainer_waited"] >= clock["trainer_waited"]
    assert rows[-1]["trainer_wait_share"] == ended["clock"]["trainer_waited"] / ended["clock"]["loop_elapsed"]
    final = ended["ledger"]["state"]
    assert all(final[g] in ("trained", "filtered", "carried_over") for g in carried)
    assert carried & {g["group_id"] for g in groups}, "carried-over groups are trained first after resume"
    ev = json.loads((run / "eval.json").read_text())
    assert ev["base"]["n"] == 8 and ev["final"]["n"] == 8 and "difference" in ev
