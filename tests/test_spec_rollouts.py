"""Speculative rollouts in the RL loop: the draft store (rollout/drafts.py), its way into requests and
across a resume, the refused combinations, the step metrics and the report panels."""

from __future__ import annotations

import copy
import itertools
import json
import pickle
import re
from pathlib import Path

import pytest
from interrupt import stop_after  # tests/ is on sys.path
from tiny_args import TINY

from streamrl.cli import main
from streamrl.config import ConfigError, load_config
from streamrl.engine.base import Draft, GenRequest
from streamrl.loop.ledger import Ledger
from streamrl.loop.state import RunState, load_state, state_dirs
from streamrl.loop.step_metrics import speculative_stats
from streamrl.rollout.drafts import DraftStore
from streamrl.rollout.worker import GroupRequest
from streamrl.types import Group, Problem, Trajectory

# step metrics that measure time, not what was computed
TIMING = re.compile(r"(^time$|_time$|_s$|per_s$|_share$|_elapsed$)")
ROWS = [{"prompt": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(3)]


def _traj(pid: str, ids: list[int], accepted: int = 0, verified: int = 0, tree: int = 0) -> Trajectory:
    n = len(ids)
    return Trajectory(
        pid,
        "g",
        "g-0",
        [1],
        ids,
        [-0.5] * n,
        [0] * n,
        "stop",
        draft_tokens=verified,
        draft_accepted=accepted,
        tree_tokens=tree,
    )


def _group(pid: str, *responses: list[int]) -> Group:
    return Group(Problem(pid, [], "1"), [_traj(pid, ids) for ids in responses])


def test_the_store_keeps_the_newest_responses_of_the_newest_prompts():
    store = DraftStore(per_prompt=3, prompts=2)
    store.add(_group("a", [1, 2], [3]))
    store.add(_group("b", [4]))
    store.add(_group("a", [5, 6], [], [7]))  # an empty response is no draft
    assert [d.token_ids for d in store.drafts("a")] == [(3,), (5, 6), (7,)]
    assert store.drafts("a")[1] == Draft((5, 6), (-0.5, -0.5))
    store.add(_group("c", [8]))  # a third prompt: b, stored least recently, goes
    assert store.drafts("b") == () and [d.token_ids for d in store.drafts("c")] == [(8,)]
    again = DraftStore(per_prompt=3, prompts=2)
    again.load_state_dict(json.loads(json.dumps(store.state_dict())))
    assert again.state_dict() == store.state_dict()
    again.add(_group("d", [9]))  # the order survives: a is now the oldest
    assert again.drafts("a") == () and again.drafts("c") != ()


def test_speculative_step_metrics():
    trajs = [
        _traj("a", [1, 2, 3, 4], accepted=2, verified=4, tree=3),  # a residual token stayed in the tree
        _traj("a", [1, 2], accepted=2, verified=2, tree=2),  # ended on the tree: 1 step saved, not 2
        _traj("a", [5, 6]),  # no draft
    ]
    assert speculative_stats(trajs) == {
        "spec_verified_tokens": 6,
        "spec_acceptance_rate": 4 / 6,
        "spec_accepted_per_draft": 2.0,
        "spec_decode_steps_saved": 4,  # 3 + 1 tree tokens, not the 4 accepted
        "spec_draft_share": 2 / 3,
        "spec_token_share": 5 / 8,
    }
    assert speculative_stats(trajs[2:]) == {}


class _Decoder:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""


def test_samples_offered_drafts_the_cut_tree_left_out_still_count(lms):
    """Two drafts that differ from their first token: at branch_min=2 the tree keeps no node, so no
    sample verifies a token. They were still offered drafts: the figures say 0 accepted, not nothing."""
    from spec_harness import PROMPT, draw

    from streamrl.rollout.trajectory import RolloutSettings, make_trajectory

    drafts = (Draft((2, 3, 1), (-1.0,) * 3), Draft((3, 2, 1), (-1.0,) * 3))
    reqs = [GenRequest(PROMPT, 3, 1.0, drafts=drafts) for _ in range(4)]
    reqs += [GenRequest(PROMPT, 3, 1.0), GenRequest(PROMPT, 3, 0.0, drafts=drafts)]  # none; greedy
    settings = RolloutSettings(6, 3, 1.0, 1.0, 8, False, False, 0.0)
    problem = Problem("p", [], "1")
    results = draw(lms[0], reqs, seed=0, branch_min=2)
    trajs = [make_trajectory(problem, r, _Decoder(), settings, "g", k) for k, r in enumerate(results)]
    assert [t.drafted for t in trajs] == [True] * 4 + [False, False]
    assert [(t.draft_tokens, t.tree_tokens) for t in trajs] == [(0, 0)] * 6
    assert speculative_stats(trajs) == {
        "spec_verified_tokens": 0,
        "spec_acceptance_rate": 0.0,
        "spec_accepted_per_draft": 0.0,
        "spec_decode_steps_saved": 0,
        "spec_draft_share": 4 / 6,
        "spec_token_share": 0.0,
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["engine=vllm", "runtime.mode=async"],
            "rollout.spec_drafts > 0 needs engine=hf: vLLM's API neither verifies a draft given per request "
            "nor returns the full next-token distribution the residual needs; set rollout.spec_drafts=0",
        ),
        (
            ["task=env:python_tool"],
            "rollout.spec_drafts > 0 drafts single-turn responses; task=env:python_tool runs multi-turn "
            "episodes: set rollout.spec_drafts=0",
        ),
        (
            ["rollout.temperature=0"],
            "rollout.spec_drafts > 0 verifies sampled responses; rollout.temperature=0 is greedy: "
            "set rollout.temperature > 0 or rollout.spec_drafts=0",
        ),
        (["rollout.spec_lenience=-1"], "config key 'rollout.spec_lenience' must be >= 0, got -1"),
        (
            ["rollout.spec_lenience=1.5", "loss.prox=behav"],
            "rollout.spec_lenience > 0 biases the responses, which decoupled PPO's weight pi_prox / pi_behav "
            "corrects, but loss.prox=behav makes that weight 1: set loss.prox=recompute, a "
            "loss.rollout_correction, or rollout.spec_lenience=0",
        ),
        (
            ["rollout.spec_lenience=1.5", "loss.name=ppo_clip"],
            "rollout.spec_lenience > 0 biases the responses, which decoupled PPO's weight pi_prox / pi_behav "
            "corrects, but loss.name=ppo_clip has no such weight: set loss.name=decoupled_ppo, a "
            "loss.rollout_correction, or rollout.spec_lenience=0",
        ),
        (
            ["rollout.spec_lenience=1.5", "loss.name=reinforce"],
            "rollout.spec_lenience > 0 biases the responses, which decoupled PPO's weight pi_prox / pi_behav "
            "corrects, but loss.name=reinforce has no such weight: set loss.name=decoupled_ppo, a "
            "loss.rollout_correction, or rollout.spec_lenience=0",
        ),
    ],
)
def test_refused_combinations(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rollout.spec_drafts=4", *overrides])
    assert str(e.value) == message


@pytest.mark.parametrize(
    "override", ["rollout.spec_lenience=0.5", "rollout.spec_branch_min=3", "rollout.spec_prompts=10"]
)
def test_speculative_settings_without_drafts_are_refused(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value) == (f"config key '{key}' needs speculative rollouts: set rollout.spec_drafts > 0")
    load_config(None, [override, "rollout.spec_drafts=4"])  # with drafts: accepted


@pytest.mark.parametrize(
    "overrides",
    [
        ["loss.prox=recompute"],
        ["loss.name=ppo_clip", "loss.rollout_correction=token_tis"],  # weighted by pi_old / pi_behav
        ["loss.prox=behav", "rollout.spec_lenience=0"],  # exact verification: nothing to correct
        ["loss.name=reinforce", "loss.rollout_correction=token_tis"],
    ],
)
def test_lenience_where_a_weight_corrects_it(overrides):
    load_config(None, ["rollout.spec_drafts=4", "rollout.spec_lenience=1.5", *overrides])


@pytest.mark.parametrize("override", ["rollout.spec_branch_min=2", "rollout.spec_prompts=4096"])
def test_speculative_settings_at_their_defaults_need_no_drafts(override):
    load_config(None, [override])


def test_lenience_without_drafts_is_refused_before_anything_is_written(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "rollout.spec_lenience=1.5", f"run_dir={run}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "streamrl: error: config key 'rollout.spec_lenience' needs speculative rollouts: "
        "set rollout.spec_drafts > 0"
    )
    assert not run.exists()


def _chain_sum():
    from streamrl.data.task import default_task_args
    from streamrl.tasks import make_task

    return make_task("rg:chain_sum", default_task_args("rg:chain_sum"), "", "", "answer_is")


def _async_runner(tiny, state: RunState):
    from scripted_worker import scripted_worker  # tests/ is on sys.path (rootdir conftest)

    from streamrl.loop.asynchronous import AsyncRunner
    from streamrl.loop.signals import StopFlag
    from streamrl.trainer.trainer import Trainer

    cfg = load_config(
        None, ["rollout.spec_drafts=2", "rollout.prompts_per_step=2", "runtime.elastic_cores=fixed"]
    )
    trainer = Trainer.from_config(copy.deepcopy(tiny[0]), cfg, pad_id=0)
    stream = itertools.islice(_chain_sum().train_stream(0, set()), state.problems_drawn, None)
    return AsyncRunner(cfg, trainer, tiny[1], stream, state, StopFlag(), scripted_worker)


def test_requests_take_their_prompts_drafts_and_keep_them_across_a_resume(tiny):
    """The controller puts a prompt's stored responses into its next request; an unfinished request
    carried over (a partial rollout) and the store itself come back unchanged after a resume."""
    problems = list(itertools.islice(_chain_sum().train_stream(0, set()), 2))
    store = DraftStore(2, 10)
    store.add(_group(problems[0].id, [5, 6, 7], [8]))
    carried = GroupRequest("g9", problems[1], [1, 2], 2, 3, drafts=(Draft((4,), (-1.0,)),))
    ledger = Ledger()
    ledger.admitted("g9")
    ledger.carry_over()
    state = RunState(
        unfinished=[carried], drafts=store.state_dict(), groups_made=10, ledger=ledger.state_dict()
    )
    runner = _async_runner(tiny, state)
    first = runner.admission.next_request()  # the carried-over request, drafts and all
    assert first.group_id == "g9" and first.drafts == (Draft((4,), (-1.0,)),)
    fresh = runner.admission.next_request()  # the stream's first problem: its stored responses
    assert fresh.problem.id == problems[0].id and [d.token_ids for d in fresh.drafts] == [(5, 6, 7), (8,)]
    runner.sh.inflight[fresh.group_id] = fresh
    snap = runner.snapshot()
    assert snap.drafts == store.state_dict() and snap.unfinished[0].drafts == fresh.drafts


def _data(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def _spec_args(tmp_path: Path) -> list[str]:
    """Two training problems, both in every step: from step 2 on every sample has drafts."""
    return [
        *TINY,
        f"task=data:{_data(tmp_path)}",
        "eval.size=1",
        "eval.after=false",
        "rollout.spec_drafts=4",
        "rollout.temperature=0.1",  # tiny-random's tokens are close to uniform: a cold policy accepts some
        "rollout.dynamic_sampling=false",
    ]


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_resumed_run_offers_the_same_drafts(tmp_path):
    """Colocated and synchronous: stopped after step 2 and resumed, the run logs the same steps as an
    uninterrupted one, speculative metrics included (the store is part of the saved state)."""
    sync = [*_spec_args(tmp_path), "runtime.mode=colocated", "max_staleness=0", "max_steps=4"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert main(["train", *sync, f"run_dir={whole}"]) == 0
    with pytest.MonkeyPatch.context() as mp:
        stop_after(mp, 2)
        assert main(["train", *sync, f"run_dir={split}"]) == 0
    state, _, _ = load_state(split)
    assert sorted(pid for pid, _ in state.drafts) == sorted(_problem_ids(split))
    assert all(len(responses) == 4 for _, responses in state.drafts)
    assert main(["train", f"resume={split}"]) == 0
    a, b = _rows(whole), _rows(split)
    assert "spec_acceptance_rate" not in a[0]  # step 1: nothing stored yet
    assert all(r["spec_draft_share"] == 1.0 for r in a[1:])
    for ra, rb in zip(a, b, strict=True):
        # the reward cache lives in memory: a resumed run starts it empty
        keys = [
            k for k in ra if k != "reward_cache_hit_rate" and (k.startswith("spec_") or not TIMING.search(k))
        ]
        assert {k: rb.get(k) for k in keys} == {k: ra[k] for k in keys}, f"step {ra['step']}"
    groups = [(run / "groups.jsonl").read_text() for run in (whole, split)]
    assert groups[0] == groups[1]


@pytest.mark.parametrize("mode", ["colocated", "async"])
def test_a_resume_without_drafts_keeps_the_saved_ones(tmp_path, mode):
    """Saved with rollout.spec_drafts=4 and resumed with 0: every state the resume saves (a periodic one,
    the last) keeps the saved store as it was, for a later resume with drafts on."""
    staleness = "max_staleness=0" if mode == "colocated" else "max_staleness=1"
    run = tmp_path / "run"
    args = [*_spec_args(tmp_path), f"runtime.mode={mode}", staleness, f"run_dir={run}"]
    assert main(["train", *args, "max_steps=2"]) == 0
    saved = load_state(run)[0].drafts
    assert sorted(pid for pid, _ in saved) == sorted(_problem_ids(run))
    assert main(["train", f"resume={run}", "rollout.spec_drafts=0", "train.save_every=1", "max_steps=4"]) == 0
    assert [r["step"] for r in _rows(run)] == [1, 2, 3, 4]
    states = state_dirs(run)
    assert [d.name for d in states] == ["step-000003", "step-000004"]
    assert all(pickle.loads((d / "carried.pkl").read_bytes())["drafts"] == saved for d in states)


def test_a_failed_colocated_step_leaves_the_drafts_as_before_it(tmp_path, monkeypatch):
    """Step 3 fails once its first group came back: the state saved is step 2's, and so is its store
    (the failed step's responses are dropped with it, as its problems are drawn again)."""
    from streamrl.loop.dynamic_sampling import DynamicSampling

    sync = [*_spec_args(tmp_path), "runtime.mode=colocated", "max_staleness=0", "train.save_every=0"]
    two, failed = tmp_path / "two", tmp_path / "failed"
    assert main(["train", *sync, "max_steps=2", f"run_dir={two}"]) == 0
    calls, real = [0], DynamicSampling.keep

    def keep(self, group):
        calls[0] += 1
        if calls[0] == 5:  # two groups a step: step 3's first
            raise RuntimeError("injected failure after a group came back")
        return real(self, group)

    monkeypatch.setattr(DynamicSampling, "keep", keep)
    with pytest.raises(RuntimeError, match="injected failure"):
        main(["train", *sync, "max_steps=3", f"run_dir={failed}"])
    monkeypatch.undo()
    saved, expected = load_state(failed)[0], load_state(two)[0]
    assert saved.step == expected.step == 2
    assert len(saved.drafts) == 2 and saved.drafts == expected.drafts


def _problem_ids(run: Path) -> set[str]:
    return {json.loads(x)["problem_id"] for x in (run / "groups.jsonl").read_text().splitlines()}


def test_async_workers_verify_the_drafts_they_are_sent(tmp_path):
    """The async loop end to end: requests carry drafts to the rollout worker process, whose engine
    verifies them; the report shows the speculative panels."""
    run = tmp_path / "run"
    args = [*_spec_args(tmp_path), "max_steps=5", "max_staleness=1", f"run_dir={run}"]
    assert main(["train", *args]) == 0
    rows = _rows(run)
    spec = [r for r in rows if "spec_acceptance_rate" in r]
    assert len(spec) >= 2  # (what each figure is: test_speculative_step_metrics, by hand)
    assert sum(r["spec_decode_steps_saved"] for r in spec) > 0  # the workers accepted draft tokens
    html = (run / "report.html").read_text()
    for panel in ("speculative", "spec_tokens", "spec_saved"):
        assert f'data-plot="{panel}"' in html
