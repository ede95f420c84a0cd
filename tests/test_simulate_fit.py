"""The pipeline simulator's inputs and outputs: cost fitting on a synthetic run (lent threads counted
once), the command line and its parameters file, the resources each mode runs with, the table, the JSON
rows and the scenarios."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from streamrl.cli import main
from streamrl.sim import fit
from streamrl.sim.lengths import Fixed, parse_lengths
from streamrl.sim.model import simulate
from streamrl.sim.params import Costs, Setup, Workload

# one decode step = 1 s whatever the batch, a sample of 2 tokens trains in 3 s
UNIT = Costs(decode_step_s=1.0, decode_token_s=0.0, train_token_s=1.5)
TINY = Workload(Fixed(2), batch_groups=1, group_size=1, prompt_len=0)


@pytest.mark.parametrize(
    "decode_alpha, shared, prefix, rows",
    [(None, False, 0, 1.0), (0.3, True, 0, 1.0), (0.3, True, 30, 1.0), (0.3, True, 30, 0.4)],
)
def test_fit_recovers_costs_from_a_synthetic_run(tmp_path, decode_alpha, shared, prefix, rows) -> None:
    a, c, train = 0.05, 0.002, 0.01
    speedup = 2 ** (1.0 if decode_alpha is None else decode_alpha)  # decoding on 2 threads
    B, G, prompt, max_new = 2, 4, 40, 20
    logged: list[dict] = []
    for step, (mean, trunc) in enumerate([(20.0, 1.0), (10.0, 0.5), (5.0, 0.0), (8.0, 0.25)], 1):
        gen = int(mean * B * G)
        s_len = max_new if trunc > 0 else 3 * mean
        # 2 threads; shared: a group's G samples share one prefill of the prompt; prefix: its first
        # `prefix` tokens come from the engine's prefix cache, computed once per step (version); rows:
        # KV-cache rows per decoded sequence
        own = (prompt - prefix) * B * (1 if shared else G)
        gen_time = (a * s_len + c * (rows * gen + own + prefix)) / speedup
        logged.append(
            {
                "step": step,
                "response_length": mean,
                "truncation_rate": trunc,
                "tokens_generated": gen,
                "tokens_trained": gen + prompt * B * G,
                "generate_time": gen_time,
                "train_time": train * (gen + prompt * B * G) / 2,
                "groups_dropped_zero_variance": 0,
                "samples_per_s": 1.0,
                "prompt_shared_tokens": prefix or 5,  # 5 < MIN_PREFIX: nothing cached
                # runs logged before engine_row_share: every sequence its own row
                **({"engine_row_share": rows, "response_length_std": 2.0} if rows < 1 else {}),
            }
        )
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in logged))
    (tmp_path / "config.yaml").write_text(
        "max_staleness: 0\nruntime: {mode: colocated}\ntrain: {threads: 0}\n"
        f"rollout: {{prompts_per_step: {B}, samples_per_prompt: {G}, max_new_tokens: {max_new}, "
        "prefix_cache: true}\n"
    )
    run = fit.load_run(tmp_path, cores=2)
    costs, _ = fit.fit_costs(run, decode_alpha=decode_alpha, shared_prefill=shared)  # training: alpha 1
    assert costs.decode_step_s == pytest.approx(a, rel=1e-6)
    assert costs.decode_token_s == pytest.approx(c, rel=1e-6)
    assert costs.train_token_s == pytest.approx(train, rel=1e-6)
    assert fit.setup(run).mode == "sync" and fit.workload(run).prompt_len == prompt
    assert fit.workload(run, shared).shared_prefill == shared
    assert fit.workload(run).cached_prefix == prefix and fit.workload(run).row_share == rows
    assert fit.workload(run).lengths.stds == ((2.0,) * 4 if rows < 1 else None)
    bench, notes = fit.fit_costs(run, engine=fit.EngineCosts(0.1, 0.2, 0.3))  # measured apart from the run
    assert (bench.decode_step_s, bench.decode_token_s, bench.prefill_token_s) == (0.1, 0.2, 0.3)
    assert bench.train_token_s == pytest.approx(train, rel=1e-6) and notes == [
        "decode: measured engine costs"
    ]
    # scaled: the measured proportions, scaled until the simulated engine is busy as long as the run's
    scaled, notes = fit.fit_costs(run, engine=fit.EngineCosts(0.1, 0.2, 0.3), scale_engine=True)
    factor = scaled.decode_step_s / 0.1
    assert scaled.decode_token_s == pytest.approx(0.2 * factor)
    assert scaled.prefill_token_s == pytest.approx(0.3 * factor)
    r = simulate(scaled, fit.workload(run, True), fit.setup(run))
    assert fit.engine_busy(run) == pytest.approx(sum(row["generate_time"] for row in logged))
    assert (1 - r.engine_idle) * r.time == pytest.approx(fit.engine_busy(run), rel=0.02)
    assert notes[0].startswith("decode: measured engine costs x ")


def test_a_torn_last_metrics_line_is_skipped(tmp_path) -> None:
    row = {"step": 1, "response_length": 4.0, "tokens_generated": 32, "tokens_trained": 64}
    row.update(train_time=1.0, samples_per_s=2.0)
    whole = json.dumps(row) + "\n" + json.dumps({**row, "step": 2}) + "\n"
    (tmp_path / "metrics.jsonl").write_text(whole + json.dumps({**row, "step": 3})[:20])  # killed mid-line
    (tmp_path / "config.yaml").write_text("runtime: {mode: colocated}\n")
    assert [r["step"] for r in fit.load_run(tmp_path, cores=2).rows] == [1, 2]


def test_bad_input_is_one_clear_line(capsys) -> None:
    assert main(["simulate", "steps=0"]) == 2
    assert main(["simulate", "lengths=zipf:3"]) == 2
    assert main(["simulate", "nonsense=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("streamrl: error: ") for e in err)
    with pytest.raises(ValueError, match="bad lengths spec"):
        parse_lengths("lognormal:1,2")


def test_cli_table_and_json(capsys) -> None:
    assert (
        main(
            [
                "simulate",
                "lengths=fixed:2",
                "decode_step_s=1",
                "decode_token_s=0",
                "train_token_s=1.5",
                "prompt_len=0",
                "batch_groups=1",
                "group_size=1",
                "steps=3",
                "modes=sync,async",
                "etas=1",
                "colocated_sync=false",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert re.search(r"sync\s+1\s+1\s+-\s+0\.2\s+1\.00x", out)
    assert re.search(r"async\s+1\s+1\s+1\s+0\.2308\s+1\.15x", out)  # 3 samples / 13 s vs 3 / 15 s
    assert main(["simulate", "scenario=april", "steps=2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in data["rows"]] == ["sync", "partial"]


def test_cli_reads_the_optional_decode_exponent() -> None:
    from streamrl.sim.cli import build

    assert build([])[3].decode_thread_scaling is None  # engines follow thread_scaling
    setup = build(["decode_thread_scaling=0.25", "thread_scaling=0.9"])[3]
    assert setup.decode_thread_scaling == 0.25 and setup.thread_scaling == 0.9


def _lend_run(extra: dict) -> fit.Run:
    """Async on 2 cores split 1 + 1, lending; 2 steps of B=2 x G=4 samples at 2 samples/s (8 s)."""
    cfg = {
        "max_staleness": 1,
        "runtime": {"mode": "async", "elastic_cores": "lend", "rollout_workers": 1, "rollout_threads": 1},
        "train": {"threads": 0},
        "rollout": {"prompts_per_step": 2, "samples_per_prompt": 4, "max_new_tokens": 8},
    }
    row = {"train_time": 2.0, "trainer_wait_time": 1.0, "tokens_trained": 100, "tokens_generated": 40}
    row |= {"response_length": 5.0, "samples_per_s": 2.0}
    rows = [{**row, "step": 1}, {**row, "step": 2, "samples_per_s": 2.0, "engine_idle_share": 0.25, **extra}]
    return fit.Run(None, cfg, rows, 2)


def test_a_lending_runs_fit_counts_the_borrowed_threads_once() -> None:
    # logged: the trainer held 4 s at 1.5 threads on average -> half its time on 2 threads; the engine
    # 6 s at 1.25 -> a quarter
    logged = _lend_run(
        {
            "cores_trainer_held_s": 4.0,
            "cores_trainer_thread_s": 6.0,
            "cores_worker_held_s": 6.0,
            "cores_worker_thread_s": 7.5,
        }
    )
    assert fit.borrowed_shares(logged) == (0.5, 0.25)
    k_t, k_e = fit.speedups(logged, alpha=0.5, decode_alpha=0.66)
    assert k_t == pytest.approx(0.5 + 0.5 * 2**0.5) and k_e == pytest.approx(0.75 + 0.25 * 2**0.66)
    costs, _ = fit.fit_costs(logged, alpha=0.5, decode_alpha=0.66)
    assert costs.train_token_s == pytest.approx(4.0 * k_t / 200)  # 4 s of training over 200 tokens
    # the engine was busy 0.75 x 8 s for 80 generated tokens and 2 steps x 2 groups x 4 prompts of 7.5
    # tokens (120): c = 6 k_e / 200; with half a cache row per decoded sequence, 6 k_e / (40 + 120)
    assert costs.decode_token_s == pytest.approx(6.0 * k_e / 200)
    shared = _lend_run({**logged.rows[-1], "engine_row_share": 0.5})
    assert fit.fit_costs(shared, 0.5, decode_alpha=0.66)[0].decode_token_s == pytest.approx(6.0 * k_e / 160)
    assert fit.workload(shared).row_share == 0.5 and fit.workload(logged).row_share == 1.0
    # not logged (older runs): the trainer borrows while the engine idles (0.25 x 8 s over 4 s of
    # training), the engine while the trainer waits (2 s over its 0.75 x 8 = 6 s busy)
    assert fit.borrowed_shares(_lend_run({})) == (0.5, pytest.approx(1 / 3))
    fixed = _lend_run({})
    fixed.config["runtime"]["elastic_cores"] = "fixed"
    assert fit.borrowed_shares(fixed) == (0.0, 0.0) and fit.speedups(fixed, 0.5, 0.66) == (1.0, 1.0)


def test_simulate_command_line_items_and_parameters_file(tmp_path) -> None:
    from streamrl.sim.cli import build

    for bad in ("eta", "=3"):
        with pytest.raises(ValueError) as e:
            build(["params.yaml", bad])
        assert str(e.value) == f"expected key=value, got '{bad}'"
    with pytest.raises(FileNotFoundError) as missing:
        build([str(tmp_path / "nope.yaml")])
    assert str(missing.value) == f"{tmp_path / 'nope.yaml'}: not a run directory or a params YAML file"
    params = tmp_path / "params.yaml"
    params.write_text("eta: 2\nsteps: 7\n")
    _, _, _, setup, _, _, _ = build([str(params), "eta=4"])
    assert (setup.eta, setup.steps) == (4, 7)  # the command line over the file


def test_the_resources_each_mode_runs_with() -> None:
    from streamrl.sim.report import resources

    split = Setup(mode="sync", engines=3, ranks=1)
    assert (resources(split).engines, resources(split).ranks) == (
        4,
        4,
    )  # colocated: every device, both phases
    assert resources(split, colocated_sync=False) == split
    assert resources(replace(split, mode="async")) == replace(split, mode="async")  # async keeps its split
    shared = Setup(mode="partial", engines=2, shared_cores=2)
    got = resources(shared)
    assert (got.engines, got.engine_threads, got.trainer_threads) == (1, 2, 2)  # each phase on all cores


def test_grid_json_rows_and_scenarios() -> None:
    from streamrl.sim.report import grid, scenario, to_json

    rows = grid(UNIT, TINY, Setup(steps=2), ["sync", "async"], [0, 1], [1], [1])
    out = json.loads(to_json(rows, {"title": "t"}))
    assert out["title"] == "t" and [(r["mode"], r["eta"]) for r in out["rows"]] == [
        ("sync", None),
        ("async", 0),
        ("async", 1),
    ]
    assert "trace" not in out["rows"][0] and out["rows"][0]["speedup"] == 1.0
    with pytest.raises(ValueError) as e:
        scenario("pipeline")
    assert str(e.value) == "unknown scenario 'pipeline': choose areal or april"


def _async_run(path, eta: int) -> None:
    rows = [
        {
            "step": s,
            "response_length": 10.0,
            "truncation_rate": 0.0,
            "tokens_generated": 640,
            "tokens_trained": 640 + 64 * 40,
            "train_time": 2.0,
            "weight_sync_time": 0.1,
            "trainer_wait_time": 5.0 if s == 1 else 1.0,
            "trainer_wait_share": 0.3,
            "engine_idle_share": 0.1,
            "samples_per_s": 64 * s / (3.1 * s + 4),
            "groups_carried_over": 2,
            "filtered_zero_variance": 1,
        }
        for s in range(1, 6)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "config.yaml").write_text(
        f"max_staleness: {eta}\nruntime: {{mode: async, rollout_workers: 1, rollout_threads: 1}}\n"
        "train: {threads: 1}\nrollout: {prompts_per_step: 8, samples_per_prompt: 8, max_new_tokens: 48}\n"
    )


def test_a_run_directory_is_simulated_in_its_own_mode_first(tmp_path, capsys) -> None:
    """An async run at max_staleness=3: the first row is async at eta 3 (3 joins the default etas), then
    the other etas and modes; explicit modes= / etas= still choose the grid."""
    from streamrl.sim.cli import build

    _async_run(tmp_path, 3)
    g = build([str(tmp_path)])[4]
    assert g["modes"] == ["async", "sync", "partial"] and g["etas"] == [3, 0, 1, 2, 4]
    assert build([str(tmp_path), "modes=sync", "etas=1"])[4]["modes"] == ["sync"]
    assert main(["simulate", str(tmp_path), "steps=2", "modes=async,sync"]) == 0
    rows = capsys.readouterr().out.splitlines()
    first = rows.index(next(r for r in rows if r.startswith("mode"))) + 1
    assert [r.split()[0] + " " + r.split()[3] for r in rows[first:]] == [
        "async 3",
        "async 0",
        "async 1",
        "async 2",
        "async 4",
        "sync -",
    ]
    _async_run(tmp_path, 1)  # an eta of the default grid is not repeated
    assert build([str(tmp_path)])[4]["etas"] == [1, 0, 2, 4]


def test_a_metric_the_fit_needs_logged_as_null_is_missing_and_said_in_one_line(tmp_path, capsys) -> None:
    """A NaN or infinite train_time reaches metrics.jsonl as null: a missing value, which the fit names
    (step and key) instead of failing on it."""
    _async_run(tmp_path, 1)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    lines[2] = lines[2].replace('"train_time": 2.0', '"train_time": null')
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl: step 3 has no train_time \(not logged, or NaN"):
        fit.load_run(tmp_path, cores=2)
    assert main(["simulate", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "step 3 has no train_time" in err[0]
