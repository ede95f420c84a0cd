"""Samplers on synthetic populations with known success rates, and rollout replay's batch mixing."""

import itertools
import json
import random

from streamrl.data.replay import ReplayBuffer
from streamrl.data.samplers import CurriculumSampler, MoPPSSampler, OnlineFilterSampler, Sampler
from streamrl.tasks import make_task
from streamrl.types import Group, Problem, TrainBatch, Trajectory

RATES = [0.0, 0.03, 0.5, 0.97, 1.0]  # success rate of each difficulty class; one in five is "mid"


def _population(n_per_class=12):
    return [
        Problem(id=f"p{c}-{i}", messages=[], answer="", meta={"rate": r})
        for c, r in enumerate(RATES)
        for i in range(n_per_class)
    ]


def _epochs(problems, seed=0):
    """A finite dataset's training stream: reshuffled epochs, like DataTask.train_stream."""
    rng = random.Random(seed)
    order = list(problems)
    while True:
        rng.shuffle(order)
        yield from order


def _traj(pid, k, correct, version=0, logprob=-0.5):
    return Trajectory(
        problem_id=pid,
        group_id=f"g-{pid}",
        sample_id=f"{pid}-{k}",
        prompt_ids=[1],
        completion_ids=[2, 3],
        behaviour_logprobs=[logprob, logprob],
        versions=[version, version],
        finish_reason="stop",
        reward=float(correct),
        correct=correct,
    )


def _group(problem, rng, G=8):
    return Group(problem, [_traj(problem.id, k, rng.random() < problem.meta["rate"]) for k in range(G)])


def _mid_share(sampler, draws, rng):
    mid = 0
    for _ in range(draws):
        p = next(sampler)
        mid += p.meta["rate"] == 0.5
        sampler.observe(_group(p, rng))
    return mid / draws


def test_mopps_concentrates_on_mid_difficulty_prompts():
    rng = random.Random(1)
    uniform = _mid_share(Sampler(_epochs(_population())), 3000, rng)
    mopps = _mid_share(MoPPSSampler(_epochs(_population()), pool=16, seed=0), 3000, rng)
    assert abs(uniform - 0.2) < 0.03
    assert mopps > 0.6  # Thompson sampling toward 0.5 picks the p = 0.5 prompts most of the time


def test_mopps_posterior_update_and_resume_state_is_exact():
    s = MoPPSSampler(_epochs(_population()), pool=8, seed=3)
    rng = random.Random(0)
    for _ in range(40):
        s.observe(_group(next(s), rng))
    p = next(s)
    a, b = s._ab(p.id)
    s.observe(Group(p, [_traj(p.id, k, k < 3) for k in range(8)]))  # 3 of 8 correct
    assert s.post[p.id] == [a + 3, b + 5]
    state = json.loads(json.dumps(s.state_dict()))  # plain JSON
    t = MoPPSSampler(_epochs(_population()), pool=8, seed=99)
    t.load_state_dict(state)
    assert list(t.pool) == list(s.pool) and t.post == s.post
    r1, r2 = random.Random(5), random.Random(5)
    seq_s, seq_t = [], []
    for _ in range(30):
        ps, pt = next(s), next(t)
        seq_s.append(ps.id)
        seq_t.append(pt.id)
        s.observe(_group(ps, r1))
        t.observe(_group(pt, r2))
    assert seq_s == seq_t


def test_mopps_on_fewer_prompts_than_its_pool_pulls_about_one_problem_per_draw():
    """10 prompts, a pool of 64: the pool can never fill, and a fill that pulled 64 problems at every
    draw made a resume replay 64 pulls per draw."""
    s = MoPPSSampler(_epochs(_population(2)), pool=64, seed=0)
    rng = random.Random(0)
    drawn = [next(s) for _ in range(200)]
    for p in drawn[:5]:
        s.observe(_group(p, rng))
    assert {p.id for p in drawn} == {p.id for p in _population(2)}
    assert s.base_drawn <= 10 * 200  # a few pulls per draw, not 64
    t = MoPPSSampler(_epochs(_population(2)), pool=64, seed=0)
    t.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert [next(t).id for _ in range(30)] == [next(s).id for _ in range(30)]  # a resume goes on alike


def test_online_filter_skips_prompts_last_seen_at_zero_or_full_pass_rate():
    pop = _population(4)
    order = itertools.cycle(pop)  # fixed order: epoch 2 repeats epoch 1
    s = OnlineFilterSampler(order)
    for _ in range(len(pop)):  # epoch 1: everything is drawn and measured
        p = next(s)
        rate = p.meta["rate"]
        s.observe(
            Group(p, [_traj(p.id, k, k < 8 * rate if rate not in (0.03, 0.97) else k == 0) for k in range(8)])
        )
    epoch2 = [next(s) for _ in range(12)]
    assert {p.meta["rate"] for p in epoch2} == {0.03, 0.5, 0.97}  # 0 and 1 were skipped
    assert s.skipped == 4  # the rate-0 prompts come first in the order
    assert [next(s).meta["rate"] for _ in range(4)] == [0.03] * 4  # epoch 3 starts after 4 + 4 skips
    assert s.skipped == 12
    # skipped twice (recheck=2): the rate-0 prompts are measured again in epoch 4
    assert [next(s).meta["rate"] for _ in range(12)] == [0.5] * 4 + [0.97] * 4 + [0.0] * 4
    assert s.skipped == 16
    assert OnlineFilterSampler(iter(pop)).state_dict()["base_drawn"] == 0


def test_a_saved_sampler_state_is_a_snapshot_that_later_draws_leave_alone():
    """The async loop takes the state under its lock and writes it later, while admission keeps
    drawing: what state_dict returned must not change with the sampler."""
    rng = random.Random(2)
    for s in (Sampler(_epochs(_population())), MoPPSSampler(_epochs(_population()), pool=8, seed=0)):
        for _ in range(30):
            s.observe(_group(next(s), rng))
        state = s.state_dict()
        saved = json.dumps(state)
        for _ in range(30):
            s.observe(_group(next(s), rng))
        assert json.dumps(state) == saved, type(s).__name__
    f = OnlineFilterSampler(itertools.cycle(_population(2)))
    for _ in range(10):  # every prompt measured once: only the rate-0 and rate-1 ones at 0 and 8 of 8
        p = next(f)
        rate = p.meta["rate"]
        f.observe(
            Group(p, [_traj(p.id, k, k < 8 * rate if rate in (0.0, 0.5, 1.0) else k == 0) for k in range(8)])
        )
    state = f.state_dict()
    saved = json.dumps(state)
    assert state["skips"] == {}
    assert [next(f).meta["rate"] for _ in range(6)] == [0.03] * 2 + [0.5] * 2 + [0.97] * 2  # rate 0 skipped
    assert f.skipped == 2 and len(f.skips) == 2 and json.dumps(state) == saved


def test_curriculum_raises_difficulty_when_rolling_accuracy_passes_threshold():
    task = make_task("rg:chain_sum", {}, "", "", "answer_is")

    def stream(args, raises):
        t = make_task("rg:chain_sum", args, "", "", "answer_is")
        return t.train_stream(raises, set())

    s = CurriculumSampler("chain_sum", stream, threshold=0.75, window=16)
    assert s.args()["max_terms"] == 2 and s.args()["max_digits"] == 1
    p = next(s)
    s.observe(Group(p, [_traj(p.id, k, k < 4) for k in range(8)]))  # 50%: below the threshold
    s.observe(Group(p, [_traj(p.id, k, k < 4) for k in range(8)]))
    assert s.levels() == {"num_terms": 0, "num_digits": 0}
    for _ in range(2):
        s.observe(Group(p, [_traj(p.id, k, True) for k in range(8)]))
    assert s.levels() == {"num_terms": 1, "num_digits": 0}  # the 16-sample window reached 75%
    terms = {len(q.meta["entry"]["metadata"]["expression"].split("+")) for q in itertools.islice(s, 40)}
    assert 3 in terms  # the restarted stream generates the harder level
    for _ in range(2):
        s.observe(Group(p, [_traj(p.id, k, True) for k in range(8)]))
    assert s.levels() == {"num_terms": 1, "num_digits": 1}  # round robin over attributes
    state = json.loads(json.dumps(s.state_dict()))
    t = CurriculumSampler("chain_sum", stream, threshold=0.75, window=16)
    t.load_state_dict(state)
    assert t.levels() == s.levels() and [next(t).id for _ in range(5)] == [next(s).id for _ in range(5)]
    assert task.name == "rg:chain_sum"


def test_replay_mixes_distinct_successes_with_their_behaviour_logprobs():
    buf = ReplayBuffer(share=0.25, capacity=100, seed=0)
    old = [_traj(f"o{i}", 0, i % 2 == 0, version=1, logprob=-0.1 * i) for i in range(10)]
    # A > 0 for i % 4 in (0, 1): the odd ones are wrong, so only o0, o4 and o8 are kept
    buf.add(TrainBatch(old, [1.0 if i % 4 in (0, 1) else -1.0 for i in range(10)]), step=1)
    assert [r.trajectory.sample_id for r in buf.items] == ["o0-0", "o4-0", "o8-0"]  # correct and A > 0
    for i in range(10, 40):
        buf.add(TrainBatch([_traj(f"o{i}", 0, True, version=2)], [0.5]), step=2)
    fresh = TrainBatch([_traj(f"f{i}", 0, False, version=5) for i in range(12)], [0.0] * 12)
    mixed, stats = buf.mix(fresh, step=6)
    assert stats["replay_samples"] == 4 and stats["replay_share"] == 4 / 16  # floor(0.25 * 12 / 0.75)
    ids = [t.sample_id for t in mixed.trajectories]
    assert len(set(ids)) == len(ids) == 16 and ids[:12] == [t.sample_id for t in fresh.trajectories]
    by_id = {r.trajectory.sample_id: r for r in buf.items}
    for t, a in zip(mixed.trajectories[12:], mixed.advantages[12:]):
        src = by_id[t.sample_id.rsplit("-r", 1)[0]]
        assert t.reward_info["replayed"] and t.sample_id.endswith("-r6")
        assert (
            t.behaviour_logprobs == src.trajectory.behaviour_logprobs
            and t.versions == src.trajectory.versions
        )
        assert a == src.advantage
    buf.add(mixed, step=6)
    assert len(buf.items) == 33  # replayed copies are not added again
    # never the same sample twice in one batch, over many draws from a small buffer
    small = ReplayBuffer(share=0.5, capacity=5, seed=1)
    small.add(TrainBatch([_traj(f"s{i}", 0, True) for i in range(5)], [1.0] * 5), step=1)
    for step in range(50):
        m, st = small.mix(TrainBatch([_traj(f"n{i}", 0, False) for i in range(8)], [0.0] * 8), step)
        assert st["replay_samples"] == 5 and len({t.sample_id for t in m.trajectories}) == 13
