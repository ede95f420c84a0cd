"""The run's logs: metrics.jsonl and its TensorBoard scalars across a resume, and groups.jsonl's rows."""

import json
from pathlib import Path

import pytest

from streamrl.observe.metrics import GroupLog, MetricsWriter
from streamrl.types import Group, Problem, Trajectory


def _scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_a_resumed_run_appends_to_metrics_jsonl_and_tensorboard_drops_the_replayed_steps(
    tmp_path, monkeypatch
):
    from tensorboard.summary.writer import event_file_writer

    first = MetricsWriter(tmp_path)
    for step in (1, 2, 3):  # step 3 is logged, then the run dies before its state is saved
        first.write({"step": step, "reward_mean": step / 4, "stopped": False, "hist": {"0": 2}})
    first.close()
    # a resume is a new process, seconds later: its event file is named (and read) after the first's.
    # In one process within one second the names' counters (.9, .10) could sort the other way
    later = event_file_writer.time.time() + 5
    with monkeypatch.context() as m:
        m.setattr(event_file_writer.time, "time", lambda: later)
        resumed = MetricsWriter(tmp_path, purge_step=3)  # resumed from step 2's state: step 3 runs again
        resumed.write({"step": 3, "reward_mean": 1.0, "stopped": True, "hist": {"0": 1}})
        resumed.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["reward_mean"]) for r in rows] == [(1, 0.25), (2, 0.5), (3, 0.75), (3, 1.0)]
    # only numbers are scalars (not booleans, not dicts); the replayed step 3 replaces the first one's
    assert _scalars(tmp_path) == {"reward_mean": [(1, 0.25), (2, 0.5), (3, 1.0)]}


def _traj(i: int, reward: float, versions: list[int], text: str = "") -> Trajectory:
    n = len(versions)
    return Trajectory(
        problem_id="p",
        group_id=f"g{i}",
        sample_id=f"s{i}",
        prompt_ids=[1],
        completion_ids=[2] * n,
        behaviour_logprobs=[0.0] * n,
        versions=versions,
        finish_reason="stop",
        text=text,
        reward=reward,
    )


def test_group_log_rows_carry_each_groups_own_advantages_versions_and_greedy_reward(tmp_path):
    a = Group(
        Problem("pa", [], "1"),
        [_traj(0, 1.0, [4, 3], "x" * 300), _traj(0, 0.0, [2, 5])],
        baseline=_traj(0, 0.5, [5]),
    )
    b = Group(Problem("pb", [], "2"), [_traj(1, 0.0, []), _traj(1, 0.0, []), _traj(1, 1.0, [6])])
    log = GroupLog(tmp_path / "groups.jsonl")
    log.write([a, b], step=7, advantages=[0.5, -0.5, -0.25, -0.25, 0.5])
    log.write([b], step=8)  # token-level advantages are not logged
    log.close()
    rows = [json.loads(x) for x in (tmp_path / "groups.jsonl").read_text().splitlines()]
    assert rows[0] == {
        "step": 7,
        "group_id": "g0",
        "problem_id": "pa",
        "rewards": [1.0, 0.0],
        "version_min": 2,
        "version_max": 5,
        "sample": "x" * 200,
        "advantages": [0.5, -0.5],
        "greedy_reward": 0.5,
    }
    # an empty completion has no versions: the group's span is its other samples' (or 0 without any)
    assert rows[1]["advantages"] == [-0.25, -0.25, 0.5] and "greedy_reward" not in rows[1]
    assert (rows[1]["version_min"], rows[1]["version_max"]) == (6, 6)
    assert rows[2]["step"] == 8 and "advantages" not in rows[2]
    log = GroupLog(tmp_path / "groups.jsonl")  # a resumed run appends
    log.write([Group(Problem("pc", [], "3"), [_traj(2, 0.0, [])])], step=9)
    log.close()
    rows = [json.loads(x) for x in (tmp_path / "groups.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [7, 7, 8, 9]
    assert (rows[3]["version_min"], rows[3]["version_max"]) == (0, 0)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_metrics_stay_out_of_tensorboard(tmp_path, value):
    w = MetricsWriter(tmp_path)
    w.write({"step": 1, "kl_ref": value, "loss": 0.5})
    w.close()
    assert _scalars(tmp_path) == {"loss": [(1, 0.5)]}
    # metrics.jsonl: null, and the key named
    line = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert line == {"step": 1, "kl_ref": None, "loss": 0.5, "non_finite": ["kl_ref"]}


def _strict(constant: str) -> None:
    raise ValueError(f"not JSON: {constant}")


def test_metrics_jsonl_is_strict_json_and_a_reader_sees_what_was_not_finite(tmp_path):
    """NaN and Infinity are no JSON: written as null with the keys named, the record itself unchanged
    (the live diagnostics read it after the writer); read back, a null is a missing value and the
    non_finite rule finds the step as it did live. A file written with bare NaN reads the same."""
    from streamrl.observe.diagnostics import diagnose
    from streamrl.observe.run_data import read_metrics

    record = {
        "step": 1,
        "loss": float("nan"),
        "kl_ref": float("-inf"),
        "lr": 0.1,
        "hist": {"0": float("inf")},
    }
    w = MetricsWriter(tmp_path, tensorboard=False)
    w.write(record)
    w.write({"step": 2, "loss": 0.5, "heldout_accuracy": None})
    w.close()
    assert str(record["loss"]) == "nan" and "non_finite" not in record  # not changed
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    first = json.loads(lines[0], parse_constant=_strict)
    assert first == {
        "step": 1,
        "loss": None,
        "kl_ref": None,
        "lr": 0.1,
        "hist": {"0": None},
        "non_finite": ["loss", "kl_ref"],
    }
    read = read_metrics(tmp_path / "metrics.jsonl")
    assert read == [
        {"step": 1, "lr": 0.1, "hist": {"0": None}, "non_finite": ["loss", "kl_ref"]},
        {"step": 2, "loss": 0.5},
    ]
    live, replayed = diagnose([record]), diagnose(read)
    assert [(f.rule, f.steps) for f in replayed] == [("non_finite", [1])]
    assert replayed[0].first_message == live[0].first_message
    old = tmp_path / "old.jsonl"  # written before null was used
    old.write_text('{"step": 1, "loss": NaN, "kl_ref": -Infinity, "lr": 0.1, "x": null}\n')
    assert read_metrics(old) == [{"step": 1, "lr": 0.1, "non_finite": ["loss", "kl_ref"]}]


def test_a_sync_writes_out_tensorboards_pending_events(tmp_path):
    class Events:
        def __init__(self) -> None:
            self.scalars: list[tuple[str, float, int]] = []
            self.flushes = 0

        def add_scalar(self, key: str, value: float, step: int) -> None:
            self.scalars.append((key, value, step))

        def flush(self) -> None:
            self.flushes += 1

    w = MetricsWriter(tmp_path, tensorboard=False)
    w.sync()  # no TensorBoard: the log alone
    events = w._tb = Events()
    w.write({"step": 1, "loss": 0.5})
    assert events.flushes == 0
    w.sync()
    assert (events.scalars, events.flushes) == ([("loss", 0.5, 1)], 1)
    w._tb = None
    w.close()


def test_the_writer_the_reader_and_the_rule_name_the_same_non_finite_keys():
    """One list for all three: the top-level floats that are NaN or infinite, in the row's order (an int,
    a bool, a string, None and a nested table of counts are not)."""
    from streamrl.observe.diagnostics import non_finite_keys
    from streamrl.observe.metrics import json_line, nan_or_inf_keys
    from streamrl.observe.run_data import _without_gaps

    inf = float("inf")
    row = {"step": 3, "z": inf, "ok": True, "a": float("nan"), "n": None, "s": "x", "b": -inf, "h": {"0": 1}}
    assert nan_or_inf_keys(row) == ["z", "a", "b"]
    assert json.loads(json_line(row))["non_finite"] == ["z", "a", "b"]
    kept = {"step": 3, "ok": True, "s": "x", "h": {"0": 1}}
    assert _without_gaps(row) == {**kept, "non_finite": ["z", "a", "b"]}
    assert non_finite_keys(row) == ["a", "b", "z"]
