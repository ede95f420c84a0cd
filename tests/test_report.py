"""The HTML report from synthetic run directories: plots, overlays, atomic writes, CLI errors, W&B sink."""

from __future__ import annotations

import json
import os
import re
import sys
import types

import pytest
import yaml

from streamrl.cli import main
from streamrl.observe.plots import Series, line_chart, nice_ticks, stacked_bars
from streamrl.observe.report import write_report
from streamrl.observe.run_data import read_metrics, unique_labels


def make_run(path, steps=5, mode="async", truncation=0.1):
    path.mkdir(parents=True)
    rows = []
    for s in range(1, steps + 1):
        rows.append(
            {
                "step": s,
                "time": 2.0 * s,
                "reward_mean": 0.1 * s,
                "accuracy": 0.05 * s,
                "response_length": 20 + s,
                "truncation_rate": truncation,
                "format_rate": 0.5,
                "entropy": 1.0,
                "kl_ref": 0.01,
                "approx_kl": 0.001,
                "clip_frac_low": 0.01,
                "clip_frac_high": 0.02,
                "zero_adv_group_frac": 0.1,
                "ratio_min": 0.8,
                "ratio_mean": 1.0,
                "ratio_max": 1.3,
                "tokens_per_s": 100.0,
                "train_tokens_per_s": 150.0,
                "trainer_wait_share": 0.2,
                "engine_idle_share": 0.1,
                "staleness_mean": 0.5,
                "staleness_max": 1,
                "staleness_hist": {"0": 10, "1": 10 * (s > 1)},
                "train_time": 1.0,
                "trainer_wait_time": 0.3,
                "weight_sync_time": 0.01,
                **({"heldout_accuracy": 0.3} if s == 2 else {}),
            }
        )
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "config.yaml").write_text(yaml.safe_dump({"model": "tiny-random", "runtime": {"mode": mode}}))
    (path / "accounting.json").write_text(
        json.dumps(
            {"admitted": 12, "generated": 12, "trained": 10, "filtered": 1, "carried_over": 1, "lost": 0}
        )
    )
    ev = {"accuracy": 0.25, "n": 8, "correct": 2, "ci95": [0.1, 0.5]}
    (path / "eval.json").write_text(json.dumps({"base": ev, "final": {**ev, "accuracy": 0.5, "correct": 4}}))
    return path


def plots(html: str) -> dict[str, str]:
    return dict(re.findall(r'<svg class="plot" data-plot="([^"]+)".*?>(.*?)</svg>', html, re.S))


def test_nice_ticks_cover_the_range():
    assert nice_ticks(0, 1) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    t = nice_ticks(3.2, 3.2)  # a flat line still gets an axis
    assert t[0] <= 3.2 <= t[-1]


def test_line_chart_draws_every_point_and_gaps():
    svg = line_chart("x", "X", [Series("a", [1, 2, 3, 4], [1.0, None, 3.0, float("nan")])])
    assert 'data-points="2"' in svg and svg.count("<circle") == 2
    assert "no data" in line_chart("x", "X", [Series("a", [1], [None])])
    assert "no data" in stacked_bars("s", "S", [], {}, "step")


def test_line_chart_places_points_by_hand_derived_coordinates():
    """The plot area is x 56..468 and y 10..216 (480 x 250 less the margins). Given y_range (0, 1) the
    points (0, 0) and (10, 1) sit at the corners; without it the y range is padded by 5% of the span
    each side: y 0 -> 10 + 206 * (1.05 / 1.1) = 206.6, y 1 -> 10 + 206 * (0.05 / 1.1) = 19.4."""
    ranged = line_chart("x", "X", [Series("a", [0, 10], [0.0, 1.0])], y_range=(0.0, 1.0))
    assert 'd="M56.0,216.0 L468.0,10.0"' in ranged
    assert 'cx="56.0" cy="216.0"' in ranged and 'cx="468.0" cy="10.0"' in ranged
    assert 'd="M56.0,206.6 L468.0,19.4"' in line_chart("x", "X", [Series("a", [0, 10], [0.0, 1.0])])
    # a flat line: padded by a tenth of its value; markers up to 40 points, none beyond
    flat = line_chart("x", "X", [Series("a", list(range(40)), [2.0] * 40)])
    assert flat.count("<circle") == 40 and 'cy="113.0"' in flat
    assert re.findall(r'text-anchor="end">([^<]+)<', flat) == ["1.8", "1.9", "2", "2.1", "2.2"]  # 2 +- 0.2
    assert "<circle" not in line_chart("x", "X", [Series("a", list(range(41)), [2.0] * 41)])
    two = line_chart("x", "X", [Series("a", [1], [1.0]), Series("b", [1], [None], color=1, dash=2)])
    assert two.count("<span>") == 1 and 'stroke="#1f77b4" stroke-width="2" stroke-dasharray=""' in two


def test_stacked_bars_by_hand_derived_coordinates():
    """Two bars of totals 4 and 2: the axis tops at 4.2; each category gets 412 / 2 = 206 px, its bar
    70% of it (144.2) centred. Bar a: x (1 -> 0..1) then y (3 -> 1..4); bar b: x (2), y's 0 drawn as
    nothing. y v -> 10 + 206 * (1 - v / 4.2)."""
    svg = stacked_bars("s", "S", ["a", "b"], {"x": [1.0, 2.0], "y": [3.0, 0.0]}, "step")
    rects = re.findall(
        r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)" fill="(#\w+)"', svg
    )
    assert rects == [
        ("86.9", "167.0", "144.2", "49.05", "#1f77b4"),
        ("86.9", "19.8", "144.2", "147.14", "#d62728"),
        ("292.9", "117.9", "144.2", "98.10", "#1f77b4"),
    ]
    assert "<title>a: y = 3</title>" in svg and svg.count('data-stack="y"') == 1


def test_a_killed_renders_temporary_file_is_removed_a_running_ones_kept(tmp_path):
    run = make_run(tmp_path / "run")
    dead = run / ".tmp-report.html-4194305"  # above Linux's largest pid: its writer is gone
    running = run / f".tmp-report.html-{os.getppid()}"  # a writer that still runs (this test's parent)
    for p in (dead, running):
        p.write_text("<html>half")
    write_report([run])
    assert not dead.exists() and running.read_text() == "<html>half"


def test_single_run_report_has_every_plot_non_empty(tmp_path):
    run = make_run(tmp_path / "run")
    out = write_report([run])
    assert out == run / "report.html" and not list(run.glob(".tmp-*"))  # temp file renamed away
    html = out.read_text()
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    found = plots(html)
    assert set(found) == {
        "reward_step",
        "reward_time",
        "length",
        "truncation",
        "entropy",
        "kl",
        "clip",
        "ratio",
        "staleness",
        "phases",
        "throughput",
        "waiting",
        "accounting",
    }
    for name, body in found.items():
        assert "<path" in body or "<rect x=" in body.replace('class="frame"', ""), name
    # held-out accuracy: base at step 0, the periodic eval at step 2, final at the last step
    assert re.search(r'data-series="heldout_accuracy" data-points="3"', found["reward_step"])
    assert found["staleness"].count('data-stack="1 behind"') == 4  # step 1 has no stale tokens
    assert "no diagnostic rule fired" in html


def test_report_shows_diagnostics(tmp_path):
    html = write_report([make_run(tmp_path / "run", truncation=0.9)]).read_text()
    assert 'data-rule="truncation_high"' in html and "at steps 1-5" in html


def test_a_live_runs_report_shows_its_monitors_findings(tmp_path):
    """The live report takes the findings the run's monitor kept (no replay of the whole stream at each
    report); without them the report replays the records."""
    from streamrl.observe.diagnostics import Finding

    run = make_run(tmp_path / "run")
    given = [Finding("kl_spike", "d", [3, 4], "first", "last")]
    html = write_report([run], findings=given).read_text()
    assert 'data-rule="kl_spike"' in html and "at steps 3-4: first" in html
    assert "no diagnostic rule fired" in write_report([run]).read_text()


def test_compared_runs_mean_seconds_per_step_count_the_steps_without_a_phase(tmp_path, monkeypatch):
    """An evaluation of 60 s at one step of five is 12 s per step, not 60."""
    import streamrl.observe.report as report

    a, b = make_run(tmp_path / "a" / "run"), make_run(tmp_path / "b" / "run")
    rows = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    rows[1]["heldout_eval_time"] = 60.0
    (a / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    seen = {}
    real = report.stacked_bars
    monkeypatch.setattr(report, "stacked_bars", lambda *a, **k: seen.setdefault(a[0], a[3]) and real(*a, **k))
    write_report([a, b])
    assert seen["phases"]["heldout_eval_time"] == [12.0, 0.0]
    assert seen["phases"]["train_time"] == [1.0, 1.0]


def test_compare_overlays_runs_and_defaults_to_compare_html(tmp_path):
    a = make_run(tmp_path / "a" / "run", mode="async")
    b = make_run(tmp_path / "b" / "run", mode="colocated", steps=3)
    assert main(["report", str(a), str(b)]) == 0
    html = (a / "compare.html").read_text()
    assert "a/run: reward_mean" in html and "b/run: reward_mean" in html
    assert "runtime.mode" in html  # the config keys that differ are listed
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "c.html")]) == 0
    assert (tmp_path / "c.html").is_file()


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err
        == f"streamrl: error: '{tmp_path}' is not a run directory (no metrics.jsonl)\n"
    )
    assert main(["report", str(tmp_path / "typo")]) == 2
    said = f"streamrl: error: '{tmp_path / 'typo'}' does not exist: give a run directory (a run's run_dir)\n"
    assert capsys.readouterr().err == said
    env = json.dumps({"trainer_threads": 1, "rollout_workers": 1})  # as a run writes it first
    starting = tmp_path / "starting"  # a run still before its first step
    starting.mkdir()
    (starting / "config.yaml").write_text("task: gsm8k\n")
    (starting / "environment.json").write_text(env)
    loading = tmp_path / "loading"  # a run loading its model: its lock, no config.yaml yet
    loading.mkdir()
    (loading / ".lock").write_text("")
    (loading / "environment.json").write_text(env)
    for path in (starting, loading):
        assert main(["report", str(path)]) == 2
        assert capsys.readouterr().err == (
            f"streamrl: error: '{path}' holds a run that has not finished its first step (no metrics.jsonl "
            "yet): try again after it\n"
        )
    yours = tmp_path / "yours"  # a config.yaml and an environment.json of your own
    yours.mkdir()
    (yours / "config.yaml").write_text("task: gsm8k\n")
    (yours / "environment.json").write_text("{}")
    assert main(["report", str(yours)]) == 2
    said = f"streamrl: error: '{yours}' is not a run directory (no metrics.jsonl)\n"
    assert capsys.readouterr().err == said
    assert not (tmp_path / "typo").exists() and not (starting / "report.html").exists()
    run = make_run(tmp_path / "bad")
    (run / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    assert main(["report", str(run)]) == 2
    assert "metrics.jsonl:2: not a JSON line" in capsys.readouterr().err


def test_torn_last_line_is_skipped(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1}\n{"step": 2, "rew')  # the writer is mid-line
    assert read_metrics(p) == [{"step": 1}]


def test_unique_labels(tmp_path):
    assert unique_labels([tmp_path / "a" / "run", tmp_path / "b" / "run"]) == ["a/run", "b/run"]
    assert unique_labels([tmp_path / "x", tmp_path / "y"]) == ["x", "y"]


def test_wandb_sink_logs_offline_through_the_api(tmp_path, monkeypatch):
    calls: dict = {"log": []}

    class FakeRun:
        def log(self, data, step):
            calls["log"].append((step, data))

        def finish(self):
            calls["finished"] = True

    def init(**kw):
        calls["init"] = kw
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    from streamrl.observe.metrics import MetricsWriter
    from streamrl.observe.wandb_sink import WandbSink, rewind_wandb_run

    sink = WandbSink(tmp_path, "proj", "offline", {"model": "m"})
    w = MetricsWriter(tmp_path, tensorboard=False, sinks=[sink])
    w.write({"step": 3, "reward_mean": 0.5, "staleness_hist": {"0": 4}, "ok": True, "_groups": []})
    w.close()
    assert calls["init"]["mode"] == "offline" and calls["init"]["dir"] == str(tmp_path)
    assert calls["log"] == [(3, {"reward_mean": 0.5, "staleness_hist/0": 4})]
    assert calls["finished"]
    first = calls["init"]["id"]
    WandbSink(tmp_path, "proj", "offline", {"model": "m"})  # the same run directory, resumed
    assert calls["init"]["id"] == first and calls["init"]["resume"] == "allow"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / ".tmp-wandb_run_id-4194305").write_text("3f")  # a start killed mid-write
    WandbSink(tmp_path / "other", "proj", "offline", {})
    assert calls["init"]["id"] != first  # another run directory is another W&B run
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["wandb_run_id"]
    assert (tmp_path / "other" / "wandb_run_id").read_text() == calls["init"]["id"] + "\n"
    # resumed after a crash that had logged steps past the saved step 4: W&B would ignore steps 5.. of
    # the old run, so they go to a new run, which names the old one; a later resume continues the new one
    rewind_wandb_run(tmp_path, 4)
    WandbSink(tmp_path, "proj", "offline", {"model": "m"})
    second = calls["init"]["id"]
    assert second != first and calls["init"]["config"] == {"model": "m", "resumed_from": first}
    assert calls["init"]["name"] == f"{tmp_path.name}-from-step-4"
    assert (tmp_path / "wandb_run_id").read_text() == second + "\n"
    WandbSink(tmp_path, "proj", "offline", {"model": "m"})  # a later resume: the new run, as it started
    assert calls["init"]["id"] == second and calls["init"]["name"] == f"{tmp_path.name}-from-step-4"
    # a rewind killed after it wrote the switch, before the new id: the next start completes it
    rewind_wandb_run(tmp_path, 7)
    third = json.loads((tmp_path / "wandb_switch.json").read_text())["id"]
    (tmp_path / "wandb_run_id").write_text(second + "\n")
    WandbSink(tmp_path, "proj", "offline", {"model": "m"})
    assert calls["init"]["id"] == third != second and calls["init"]["config"]["resumed_from"] == second
    assert (tmp_path / "wandb_run_id").read_text() == third + "\n"
    rewind_wandb_run(tmp_path / "never", 3)  # no W&B run started there: nothing to switch
    assert not (tmp_path / "never").exists()


def test_wandb_missing_is_a_config_error(not_installed):
    from streamrl.config import ConfigError, load_config

    not_installed("wandb")
    with pytest.raises(ConfigError, match=r"pip install 'streamrl\[wandb\]'"):
        load_config(None, ["observe.wandb=true"])


def test_a_metrics_values_leave_gaps_where_a_record_has_no_number():
    from pathlib import Path

    from streamrl.observe.run_data import RunData

    records = [{"step": 1, "m": 0.5}, {"step": 2}, {"step": 3, "m": True}, {"step": 4, "m": "x"}, {"m": 1.0}]
    run = RunData("a", Path("."), records, {}, None, None, None, None)
    # a flag (bool) or a text is no point on the curve; a record without a step is no x
    assert run.values("m") == ([1.0, 2.0, 3.0, 4.0], [0.5, None, None, None])


def test_an_out_path_that_cannot_be_written_is_refused_before_the_runs_are_read(
    tmp_path, capsys, monkeypatch
):
    from streamrl.observe import report

    run = make_run(tmp_path / "run")
    monkeypatch.setattr(report, "load_run", lambda *a: pytest.fail("the runs were read first"))
    assert main(["report", str(run), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"streamrl: error: --out {tmp_path} is a directory: name an .html file in an existing directory"
    )
    missing = tmp_path / "nowhere" / "r.html"
    assert main(["report", str(run), "--out", str(missing)]) == 2
    assert (
        f"--out {missing} is in a directory that does not exist ({missing.parent})" in capsys.readouterr().err
    )


def _status(html: str) -> str:
    return re.findall(r"<td>([^<]*)</td></tr>", html.split("<h2>Diagnostics")[0])[-1]


def test_the_status_column_tells_a_stopped_run_from_a_finished_one(tmp_path):
    """summary.json is written when a run ends, stopped too: the report says how it ended."""
    run = make_run(tmp_path / "run")
    assert _status(write_report([run]).read_text()) == "in progress (or stopped before the end)"
    summary = {"steps": 5, "interrupted": False, "final_eval_stopped": False, "timings": {"total": 12.0}}
    (run / "summary.json").write_text(json.dumps(summary))
    assert _status(write_report([run]).read_text()) == "finished"
    (run / "summary.json").write_text(json.dumps({**summary, "steps": 3, "interrupted": True}))
    assert _status(write_report([run]).read_text()) == "stopped at step 3"  # no state/: cannot resume
    (run / "state" / ".tmp-step-000003-42").mkdir(parents=True)  # a first save a kill cut short
    assert _status(write_report([run]).read_text()) == "stopped at step 3"
    (run / "state" / "step-000003").mkdir()
    assert _status(write_report([run]).read_text()) == "stopped at step 3 (resume to continue)"
    (run / "summary.json").write_text(
        json.dumps({**summary, "interrupted": True, "final_eval_stopped": True})
    )
    said = "stopped in the final evaluation at step 5 (resume to evaluate it)"
    assert _status(write_report([run]).read_text()) == said


@pytest.mark.parametrize("written", ["null", "bare"])
def test_a_diverged_steps_values_are_gaps_and_its_diagnostic_is_shown(tmp_path, written):
    """Step 6 logged NaN entropy and an infinite train_time: metrics.jsonl holds null (or, written before
    null was used, bare NaN / Infinity); the curves leave a gap, the bars count 0 s, the rule names them."""
    from streamrl.observe.metrics import json_line

    run = make_run(tmp_path / "run")
    bad = {
        "step": 6,
        "time": 12.0,
        "entropy": float("nan"),
        "train_time": float("inf"),
        "weight_sync_time": 0.5,
    }
    line = json_line(bad) if written == "null" else json.dumps(bad)
    with (run / "metrics.jsonl").open("a") as f:
        f.write(line + "\n")
    html = write_report([run]).read_text()
    assert (
        '<div class="warn" data-rule="non_finite"><b>non_finite</b> at steps 6: 2 metric(s) are NaN or'
        in html
    )
    assert 'data-series="entropy" data-points="5"' in html
    phases = plots(html)["phases"]
    assert not re.search(r"nan|inf", phases, re.I)
    assert re.findall(r"<title>6: ([^<]+)</title>", phases) == ["weight_sync_time = 0.5"]


def test_table_cells_are_escaped_dicts_too():
    from streamrl.observe.report import _table

    html = _table(["k"], [[{"<img src=x onerror=alert(1)>": "<b>2</b>"}], ["<i>", 0.5]])
    assert "<img" not in html and "<b>" not in html and "<i>" not in html
    assert "<td>&lt;img src=x onerror=alert(1)&gt;: &lt;b&gt;2&lt;/b&gt;</td>" in html


def test_the_accounting_tables_filter_reasons_are_escaped(tmp_path):
    run = make_run(tmp_path / "run")
    acc = json.loads((run / "accounting.json").read_text())
    acc["filter_reasons"] = {"<script>x</script>": 3}
    (run / "accounting.json").write_text(json.dumps(acc))
    html = write_report([run]).read_text()
    assert "<script" not in html and "<td>&lt;script&gt;x&lt;/script&gt;: 3</td>" in html


def test_stacked_bars_draw_no_segment_for_a_non_finite_value():
    """NaN and infinities are left out: the same bars as with 0 there, the axis set by the finite ones."""
    nan, inf = float("nan"), float("inf")
    odd = stacked_bars("s", "S", ["a", "b"], {"x": [1.0, inf], "y": [3.0, nan], "z": [-inf, 2.0]}, "step")
    plain = stacked_bars("s", "S", ["a", "b"], {"x": [1.0, 0.0], "y": [3.0, 0.0], "z": [0.0, 2.0]}, "step")
    assert odd == plain and not re.search(r"nan|inf", odd, re.I) and odd.count("data-stack=") == 3
    assert "no data" in stacked_bars("s", "S", ["a"], {"x": [nan], "y": [inf]}, "step")
