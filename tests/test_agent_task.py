"""task=agent:...: an openai-client agent trains unchanged through the chat proxy."""

import json
import threading

import pytest
from trajectories import make_traj

from streamrl.cli import main
from streamrl.config import load_config
from streamrl.loop.step import group_advantages
from streamrl.tasks import task_from_config
from streamrl.types import Group, Problem

TINY = [
    "model=tiny-random",
    "eval.size=2",
    "eval.before=false",
    "eval.after=false",
    "rollout.prompts_per_step=2",
    "rollout.samples_per_prompt=2",
    "rollout.max_new_tokens=6",
    "checkpoint.save=false",
    "runtime.mode=colocated",
    "max_staleness=0",
    "rollout.dynamic_sampling=false",
    "max_steps=2",
]


def _seg(episode, reward):
    t = make_traj(0, [1], [2, 3], reward=reward)
    t.reward_info = {"episode": episode}
    return t


def test_advantages_are_per_episode_and_shared_by_its_trajectories():
    # episode 0 (reward 1) made two trajectories, episode 1 (reward 0) one, episode 2 (reward 0) none
    g = Group(
        Problem("p", [], "1"), [_seg(0, 1.0), _seg(0, 1.0), _seg(1, 0.0)], episode_rewards=[1.0, 0.0, 0.0]
    )
    batch = group_advantages([g], load_config(None, ["algo=dr_grpo"]))
    assert batch.advantages == pytest.approx([2 / 3, 2 / 3, -1 / 3])  # r - mean([1, 0, 0])
    assert g.uninformative is False
    assert Group(g.problem, g.trajectories, episode_rewards=[0.0, 0.0]).uninformative is True


@pytest.mark.parametrize(
    "agent",
    ["streamrl.envs.agents:two_tries", "streamrl.envs.agents:calculator", "agents_for_tests:call_then_fail"],
)
def test_agent_task_trains_end_to_end(tmp_path, agent):
    run = tmp_path / "run"
    assert main(["train", f"task=agent:{agent}", *TINY, f"run_dir={run}"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2]
    assert all(r["tokens_trained"] > 0 for r in rows)
    assert [r["episodes"] for r in rows] == [4, 4]  # 2 problems x 2 episodes per step
    if agent.endswith("call_then_fail"):  # the failed episodes cost their reward, their calls still train
        assert all(r["reward_mean"] == 0 for r in rows)
        assert all(
            r["episode_errors"] == 4 and r["episode_error_reasons"] == {"RuntimeError": 4} for r in rows
        )
    else:
        assert all(r["episode_errors"] == 0 and r["episode_error_reasons"] == {} for r in rows)


def test_an_agent_over_a_data_file_reads_it_with_the_data_settings(tmp_path):
    from streamrl.tasks import make_task

    rows, held = tmp_path / "rows.jsonl", tmp_path / "held.jsonl"
    rows.write_text("".join(json.dumps({"q": f"{i} + 1?", "a": str(i + 1)}) + "\n" for i in range(6)))
    held.write_text(json.dumps({"q": "9 + 1?", "a": "10"}) + "\n")
    task = make_task(
        "agent:streamrl.envs.agents:calculator",
        {"base": f"data:{rows}"},
        "",
        "",
        "answer_is",
        columns={"prompt": "q", "answer": "a"},
        eval_data=str(held),
        code_partial_credit=False,
    )
    assert [(p.meta["question"], p.answer) for p in task.heldout(5)] == [("9 + 1?", "10")]
    assert len(task.base.rows) == 6 and task.base.partial_credit is False


def _seven_agent_task(tmp_path):
    """An agent that makes one call, then answers 7, on two held-out rows (answers 7 and 8)."""
    from streamrl.tasks import make_task

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{a}", "answer": str(a)}) + "\n" for a in (7, 8)))
    task = make_task(
        "agent:agents_for_tests:call_then_answer_seven",
        {"base": f"data:{rows}"},
        "",
        "",
        "answer_is",
        eval_data=str(rows),
    )
    return task


def test_an_agent_over_a_mixture_trains_on_each_sources_problems(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(json.dumps({"prompt": f"{i} + 1 = ?", "answer": str(i + 1)}) + "\n" for i in range(8))
    )
    run = tmp_path / "run"
    mix = [
        "task_config.args={base: mix}",
        f"task_config.sources=[{{task: rg:chain_sum}}, {{task: 'data:{rows}'}}]",
    ]
    args = [*TINY, *mix, "max_steps=3", "rollout.prompts_per_step=4", f"run_dir={run}"]
    assert main(["train", "task=agent:streamrl.envs.agents:one_call", *args]) == 0
    trained = [json.loads(x)["problem_id"] for x in (run / "groups.jsonl").read_text().splitlines()]
    assert len(trained) == 12 and {p.split("-")[0] for p in trained} == {"m0", "m1"}


def test_held_out_evaluation_runs_the_agent_and_scores_its_answer(tiny, tmp_path):
    from streamrl.engine.hf import HFEngine
    from streamrl.eval.heldout import evaluate

    model, tok = tiny
    task = _seven_agent_task(tmp_path)
    problems = sorted(task.heldout(2), key=lambda p: p.answer)
    res = evaluate(HFEngine(model, tok, 4, 0, "cpu"), tok, task, problems, 4, agent_timeout_s=60)
    assert (res.correct, res.formatted) == ([True, False], [True, True])  # the agent's answer, scored
    assert [s["response"] for s in res.samples] == ["The answer is 7."] * 2
    assert 0 < res.mean_length <= 3  # its one call, greedy, max_tokens=3


def test_held_out_agents_run_two_per_engine_row_at_most(tiny, tmp_path):
    import agents_for_tests

    from streamrl.engine.hf import HFEngine
    from streamrl.eval.heldout import evaluate

    model, tok = tiny
    cfg = load_config(None, ["task=agent:agents_for_tests:count_running", "eval.size=10"])
    task = task_from_config(cfg)
    res = evaluate(HFEngine(model, tok, 2, 0, "cpu"), tok, task, task.heldout(10), 2, agent_timeout_s=60)
    assert len(res.correct) == 10 and agents_for_tests.RUNNING["now"] == 0
    assert 1 <= agents_for_tests.RUNNING["peak"] <= 4  # engine rows 2, two agents per row


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("task=agent:nomodule_xyz:f", "config key 'task': no module 'nomodule_xyz' (from 'nomodule_xyz:f')"),
        (
            "task=agent:streamrl.envs.agents:nope",
            "'streamrl.envs.agents' has no attribute 'nope' (from 'streamrl.envs.agents:nope'): name one",
        ),
        (
            "task=agent:justmodule",
            "config key 'task': 'justmodule' must look like package.module:function or path/to/file.py:",
        ),
    ],
)
def test_bad_agent_specs_fail_with_one_line(tmp_path, capsys, override, fragment):
    assert main(["train", override, *TINY, f"run_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


def test_an_agent_task_trains_asynchronously_within_the_staleness_bound(tmp_path):
    run = tmp_path / "async"
    args = [a for a in TINY if not a.startswith(("runtime.mode", "max_staleness", "max_steps"))]
    args += ["runtime.mode=async", "max_staleness=1", "max_steps=4", "rollout.prompts_per_step=2"]
    assert main(["train", "task=agent:streamrl.envs.agents:calculator", *args, f"run_dir={run}"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2, 3, 4]
    assert all(r["staleness_max"] <= 1 and r["tokens_trained"] > 0 for r in rows)
    # the lead ramps up: version 0 admits one batch, so steps 1 and 2 train on-policy groups; version 1
    # admits two, and step 3 trains the second of them: agent calls carry the versions that generated
    # their tokens
    assert [r["staleness_max"] for r in rows[:3]] == [0, 0, 1]
    assert all(r["episode_errors"] == 0 for r in rows) and sum(r["episodes"] for r in rows) >= 16
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["lost"] == 0 and acc["trained"] == 8
    assert acc["admitted"] == acc["trained"] + acc["filtered"] + acc["carried_over"]
    trained = [json.loads(x)["group_id"] for x in (run / "groups.jsonl").read_text().splitlines()]
    assert len(trained) == len(set(trained)) == 8


def test_episodes_failing_before_any_call_are_counted_and_warned_about(tmp_path, capsys):
    run = tmp_path / "fail"
    args = [a for a in TINY if not a.startswith(("runtime.mode", "max_staleness", "max_steps"))]
    args += ["runtime.mode=async", "max_staleness=1", "max_steps=3"]
    assert main(["train", "task=agent:agents_for_tests:fail_at_once_on_odd", *args, f"run_dir={run}"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    errors = sum(r["episode_errors"] for r in rows)
    assert errors > 0 and errors % 2 == 0  # a failing problem fails both of its episodes
    assert {k for r in rows for k in r["episode_error_reasons"]} == {"ConnectionError"}
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["lost"] == 0 and acc["filter_reasons"]["no_calls"] >= errors // 2
    err = capsys.readouterr().err
    assert "warning [episode_errors]" in err and "agent episodes" in err
    # the message: in the step records, and printed once however many episodes failed
    message = "ConnectionError: agent could not reach its own backend (problem "
    examples = [r["episode_error_examples"]["ConnectionError"] for r in rows if r["episode_errors"]]
    assert examples and all(e.startswith(message) for e in examples)
    assert " ".join(err.split()).count(message) == 1


def test_a_stop_cuts_off_the_held_out_agents(tiny, tmp_path):
    from streamrl.engine.hf import HFEngine
    from streamrl.eval.heldout import EvalStopped, evaluate

    model, tok = tiny
    task = _seven_agent_task(tmp_path)
    problems = task.heldout(2)
    with pytest.raises(EvalStopped, match="^stopped with 0 of 2 agent runs over$"):  # at the first poll
        evaluate(
            HFEngine(model, tok, 4, 0, "cpu"), tok, task, problems, 4, agent_timeout_s=60, stop=lambda: True
        )

    def engine_stops() -> bool:  # the stop as the engine's decode steps see it, not the polling loop
        return threading.current_thread().name == "batching-engine"

    # each agent gets its aborted call as an empty reply and answers on: its run ends, cut short
    with pytest.raises(EvalStopped, match=r"stopped with 0 of 2 agent runs over \(2 cut short\)"):
        evaluate(
            HFEngine(model, tok, 4, 0, "cpu"), tok, task, problems, 4, agent_timeout_s=60, stop=engine_stops
        )


class BaseSpy:
    """A base task factory that records what it was asked for and answers heldout_from_training."""

    def __init__(self, from_training: bool) -> None:
        self.asked: list[tuple[str, dict]] = []
        self.from_training = from_training

    def __call__(self, spec: str, args: dict, **kw):
        self.asked.append((spec, dict(args)))
        spy = self

        class Base:
            def heldout_from_training(self) -> bool:
                return spy.from_training

        return Base()


KW = {"system_prompt": "S", "instruction": "I", "extract": "answer_is"}


def test_the_base_task_gets_the_other_args_or_its_defaults_and_answers_for_the_agent_task():
    from streamrl.data.task import default_task_args
    from streamrl.envs.agent_task import AgentTask

    spy = BaseSpy(from_training=False)
    task = AgentTask("streamrl.envs.agents:one_call", {"base": "rg:basic_arithmetic", "size": 7}, spy, **KW)
    assert spy.asked == [("rg:basic_arithmetic", {"size": 7})] and not task.heldout_from_training()
    spy = BaseSpy(from_training=True)
    task = AgentTask("streamrl.envs.agents:one_call", {}, spy, **KW)
    assert spy.asked == [("rg:chain_sum", default_task_args("rg:chain_sum"))] and task.heldout_from_training()


@pytest.mark.parametrize("base", ["env:python_tool", "agent:streamrl.envs.agents:one_call"])
def test_a_multi_turn_base_task_is_refused(base):
    from streamrl.envs.agent_task import AgentTask

    with pytest.raises(ValueError) as e:
        AgentTask("streamrl.envs.agents:one_call", {"base": base}, BaseSpy(False), **KW)
    assert str(e.value) == f"task_config.args.base must be a single-turn task, got '{base}'"


def test_an_episode_earns_the_base_tasks_partial_credit():
    """A base task that gives partial credit (the code pass fraction) gives it to the agent's episode."""
    from types import SimpleNamespace

    from streamrl.data.task import Score
    from streamrl.envs.chat_completion import CallRecord
    from streamrl.rollout.agent import AgentRun, inline_outcome, score_episode
    from streamrl.types import Problem

    task = SimpleNamespace(score=lambda problem, text: Score(False, True, text, value=0.6))
    settings = SimpleNamespace(format_weight=0.1, mask_truncated=False)
    calls = [CallRecord([1, 2], [3, 4], [-0.1, -0.2], [0, 0], "stop", "x")]
    p = Problem("p", [], "1")
    ep = score_episode(settings, p, "g", 0, AgentRun("x"), calls, inline_outcome(task, settings, p, "x"))
    assert ep.reward == pytest.approx(0.7) and [t.reward for t in ep.trajectories] == [pytest.approx(0.7)]
    assert not ep.correct and ep.formatted
    failed = score_episode(
        settings, p, "g", 1, AgentRun("", "KeyError"), calls, inline_outcome(task, settings, p, "")
    )
    assert failed.reward == 0.0 and not failed.formatted
    # loss.mask_truncated reaches the episode's calls: one cut at its max_tokens is not trained on
    cut = [CallRecord([1, 2], [3, 4], [-0.1, -0.2], [0, 0], "length", "x")]
    for mask, expected in ((False, [1, 1]), (True, [0, 0])):
        settings = SimpleNamespace(format_weight=0.1, mask_truncated=mask)
        ep = score_episode(settings, p, "g", 2, AgentRun("x"), cut, inline_outcome(task, settings, p, "x"))
        assert ep.trajectories[0].loss_mask == expected


def test_an_episode_whose_scoring_failed_earns_nothing():
    """The reward service gave up on the final text (a scorer past reward.timeout_s): reward 0, not
    correct, and the reason on every trajectory."""
    from types import SimpleNamespace

    from streamrl.envs.chat_completion import CallRecord
    from streamrl.rewards.service import RewardOutcome
    from streamrl.rollout.agent import AgentRun, score_episode
    from streamrl.types import Problem

    settings = SimpleNamespace(format_weight=0.1, mask_truncated=False)
    calls = [CallRecord([1, 2], [3, 4], [-0.1, -0.2], [0, 0], "stop", "x")]
    timed_out = RewardOutcome(0.0, {"error_detail": "over reward.timeout_s=1"}, "timeout", 1.0)
    ep = score_episode(settings, Problem("p", [], "1"), "g", 0, AgentRun("x"), calls, timed_out)
    assert (ep.reward, ep.correct, ep.formatted, ep.error) == (0.0, False, False, "")
    info = ep.trajectories[0].reward_info
    assert info["reward_error"] == "timeout"
    assert info["reward_error_detail"] == "timeout: over reward.timeout_s=1 (problem p)"
    assert (info["reward_latency_s"], info["reward_cached"]) == (1.0, False)
    assert ep.trajectories[0].reward == 0.0


def test_a_long_agent_error_is_cut_before_the_problem_it_names():
    """A 2000-character exception message: the first line of the agent's error is cut so that the
    problem's name survives the step record's MESSAGE_CHARS."""
    from types import SimpleNamespace

    from streamrl.envs.chat_completion import CallRecord
    from streamrl.loop.episode_errors import EpisodeErrors
    from streamrl.observe.error_examples import MESSAGE_CHARS
    from streamrl.rewards.service import RewardOutcome
    from streamrl.rollout.agent import AgentRun, episode_group, score_episode
    from streamrl.types import Problem

    settings = SimpleNamespace(format_weight=0.1, mask_truncated=False)
    calls = [CallRecord([1, 2], [3, 4], [-0.1, -0.2], [0, 0], "stop", "x")]
    run = AgentRun("", "KeyError", "KeyError: " + "k" * 2000 + "\nTraceback ...")
    p = Problem("p7", [], "1")
    ep = score_episode(settings, p, "g", 0, run, calls, RewardOutcome(0.0, {}))
    kept = MESSAGE_CHARS - len("KeyError: ... (problem p7)")
    message = f"KeyError: {'k' * kept}... (problem p7)"
    assert len(message) == MESSAGE_CHARS and ep.detail == message
    errors = EpisodeErrors(active=True)
    errors.add(episode_group(p, [ep]))
    assert errors.take()["episode_error_examples"] == {"KeyError": message}


def test_a_steps_accuracy_and_reward_count_each_episode_once():
    """An episode makes any number of trajectories (n > 1 choices, rewritten histories) or none: the
    step's reward, accuracy and format rate are over episodes, not trajectories."""
    from trajectories import make_traj

    from streamrl.loop.step_metrics import step_record
    from streamrl.types import Group, Problem

    right = [make_traj(i, [1], [2, 3]) for i in range(3)]  # episode 0: correct, three trajectories
    wrong = [make_traj(3, [1], [2])]  # episode 1: wrong, one trajectory; episode 2 made no call
    for t in right:
        t.reward, t.correct, t.reward_info = 1.1, True, {"episode": 0, "formatted": True}
    wrong[0].reward, wrong[0].correct, wrong[0].reward_info = 0.0, False, {"episode": 1, "formatted": False}
    group = Group(
        Problem("p", [], "1"),
        right + wrong,
        episode_rewards=[1.1, 0.0, 0.1],
        episode_errors=["", "", ""],
        episode_correct=[True, False, False],
        episode_formatted=[True, False, True],
    )
    rec = step_record(1, [group], {}, 0)
    assert rec["accuracy"] == pytest.approx(1 / 3) and rec["format_rate"] == pytest.approx(2 / 3)
    assert rec["reward_mean"] == pytest.approx(1.2 / 3)
    assert rec["response_length"] == pytest.approx(7 / 4)  # tokens are per trajectory


@pytest.mark.parametrize("mode", ["colocated", "async"])
def test_an_episode_whose_history_outgrows_the_token_budget_is_refused_at_the_proxy(tmp_path, mode):
    """An episode's trajectory is its last call's prompt and completion: the proxy bounds each call by
    train.token_budget (a longer chat is refused as past the context, max_tokens cut to what is left), so
    no sample outgrows a trainer micro-batch however many calls the agent makes."""
    run = tmp_path / mode
    args = [a for a in TINY if not a.startswith(("runtime.mode", "max_staleness"))]
    args += [f"runtime.mode={mode}", f"max_staleness={int(mode == 'async')}", "train.token_budget=256"]
    assert main(["train", "task=agent:agents_for_tests:grow_until_refused", *args, f"run_dir={run}"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["episode_errors"] == 0 and r["tokens_trained"] > 0 for r in rows)
    # several calls per episode (6 tokens each), and none of them past the budget
    assert all(r["tokens_generated"] > 6 * r["episodes"] for r in rows)


def test_the_shipped_agents_answer_with_what_they_have_when_the_context_is_full():
    from types import SimpleNamespace

    from streamrl.envs.agents import calculator, two_tries

    class Full(Exception):
        code = "context_length_exceeded"

    class Client:
        def __init__(self, replies):
            self.replies = list(replies)
            create = self.create
            self.chat = SimpleNamespace(completions=SimpleNamespace(create=create))

        def create(self, **kw):
            reply = self.replies.pop(0)
            if isinstance(reply, Exception):
                raise reply
            message = SimpleNamespace(content=reply, tool_calls=None)
            return SimpleNamespace(choices=[SimpleNamespace(message=message)])

    msgs = [{"role": "user", "content": "2+2?"}]
    assert two_tries(Client(["maybe 4", Full()]), msgs) == "maybe 4"  # no room to ask again
    assert calculator(Client([Full()]), msgs) == ""
    with pytest.raises(ConnectionError):  # any other failure is the agent's error, as before
        two_tries(Client(["maybe 4", ConnectionError("down")]), msgs)
