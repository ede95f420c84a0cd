"""benchmarks/spec_replay.py: the turns' order, the ratio and its interval, the tokens a turn counts."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tiny_args import TINY

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import spec_replay  # noqa: E402

from streamrl.cli import main  # noqa: E402
from streamrl.engine.base import Draft, GenRequest  # noqa: E402
from streamrl.engine.continuous import ContinuousDecoder  # noqa: E402
from streamrl.engine.hf import HFEngine  # noqa: E402
from streamrl.loop.restore import saved_weights  # noqa: E402
from streamrl.loop.state import load_state  # noqa: E402


def test_each_pair_of_turns_runs_both_arms_and_the_pairs_alternate_which_goes_first():
    assert spec_replay.turn_order(3) == ["plain", "spec", "spec", "plain", "plain", "spec"]


def test_the_ratio_pools_tokens_over_seconds_and_its_interval_is_students_t_over_the_pairs():
    turns = [("plain", 100, 1.0), ("spec", 200, 1.0), ("spec", 600, 2.0), ("plain", 50, 0.5)]
    ratio, lo, hi = spec_replay.ratio_interval(turns)
    assert ratio == pytest.approx((800 / 3.0) / (150 / 1.5))  # pooled, not the mean of the pair ratios
    # per pair: 2 and 3; mean log ln(6)/2, stdev |ln 3 - ln 2| / sqrt 2, t(0.975, 1) = 12.7062
    half = 12.7062 * (math.log(1.5) / math.sqrt(2)) / math.sqrt(2)
    assert lo == pytest.approx(math.exp(math.log(6) / 2 - half), rel=1e-4)
    assert hi == pytest.approx(math.exp(math.log(6) / 2 + half), rel=1e-4)
    one = spec_replay.ratio_interval(turns[:2])
    assert one[0] == 2.0 and math.isnan(one[1]) and math.isnan(one[2])


def test_the_interval_over_seeds_is_students_t_over_their_mean_log_ratios():
    seed0 = [("plain", 100, 1.0), ("spec", 200, 1.0), ("spec", 300, 1.0), ("plain", 100, 1.0)]  # 2, 3
    seed1 = [("plain", 100, 1.0), ("spec", 400, 1.0), ("spec", 400, 1.0), ("plain", 100, 1.0)]  # 4, 4
    m0, m1 = math.log(6) / 2, math.log(4)
    half = 12.7062 * (abs(m1 - m0) / math.sqrt(2)) / math.sqrt(2)
    lo, hi = spec_replay.seeds_interval([seed0, seed1])
    assert lo == pytest.approx(math.exp((m0 + m1) / 2 - half), rel=1e-4)
    assert hi == pytest.approx(math.exp((m0 + m1) / 2 + half), rel=1e-4)
    assert all(math.isnan(x) for x in spec_replay.seeds_interval([seed0]))


def test_a_pair_that_is_not_one_turn_of_each_arm_is_refused():
    with pytest.raises(ValueError, match="turns 0 and 1 are not one of each arm"):
        spec_replay.ratio_interval([("plain", 1, 1.0), ("plain", 1, 1.0)])


def test_a_turn_counts_every_token_sampled_in_it_once(tiny):
    """At every turn's end the arm's count equals the tokens of every response it started (finished or
    still decoding, each once), and the turns' counts add up to it; groups are kept at the load given."""
    model, tok = tiny
    engine = HFEngine(model, tok, max_batch=12, seed=3)
    prompts = [list(range(5, 12)), list(range(20, 26)), list(range(30, 40))]
    drafts = (Draft(tuple(range(40, 52)), tuple([-0.5] * 12)),)
    seen: dict[int, object] = {}

    def make(ids: list[int], d: tuple, gid: int) -> list[GenRequest]:
        return [GenRequest(ids, 24, 1.0, 1.0, (gid, k), drafts) for k in range(4)]

    decoder = ContinuousDecoder(engine)
    arm = spec_replay.Arm(decoder, [(p, ()) for p in prompts], groups=2, make=make)
    step = decoder.step

    def recorded_step() -> list:
        out = step()
        for res in out:
            seen[id(res)] = res
        for b in decoder.batches:
            for res in b.results:
                seen[id(res)] = res
        assert len(arm.open) == 2  # topped up to the load before every step
        return out

    decoder.step = recorded_step
    total = turns = 0
    # at least 4 turns, and on until a group finished (24 tokens at most: within 24 turns, whatever
    # the machine's speed, since a turn runs at least one decode step)
    while turns < 4 or (arm.made <= 2 and turns < 30):
        tokens, seconds = arm.run(0.2)
        total, turns = total + tokens, turns + 1
        assert seconds >= 0.2
        assert arm.sampled() == total == sum(len(r.token_ids) for r in seen.values())
    assert arm.made > 2 and arm.verified > 0  # groups joined as others finished; drafts were verified


def test_the_replay_runs_the_saved_weights_and_only_its_spec_arm_offers_the_saved_drafts(tmp_path):
    """A saved run's replay: both engines run one model holding the saved weights; the problems are
    those the run takes next (a resumed run trains the first two in its next step), each with its own
    stored drafts (none for a problem not trained yet); the speculative arm's requests offer them and
    the plain arm's none; the load is the staleness bound's (max_staleness 0: one batch of groups)."""
    rows = [{"prompt": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(7)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    args = [*TINY, f"task=data:{tmp_path / 'rows.jsonl'}", "eval.size=1", "eval.after=false"]
    args += ["rollout.spec_drafts=4", "rollout.temperature=0.1", "rollout.dynamic_sampling=false"]
    args += ["runtime.mode=colocated", "max_staleness=0", "max_steps=2", f"run_dir={run}"]
    assert main(["train", *args]) == 0  # 4 of the 6 training problems
    state, model_dir, _ = load_state(run)
    saved = {name: w + 0.25 for name, w in saved_weights(model_dir).items()}  # unlike the start's
    save_file(saved, str(model_dir / "model.safetensors"))
    arms, about = spec_replay.replay_arms(run, problems=5)
    model = arms["plain"].decoder.engine.model
    assert arms["spec"].decoder.engine.model is model
    for name, w in saved.items():
        assert torch.equal(model.state_dict()[name], w.to(model.dtype)), name
    stored = {
        pid: tuple(Draft(tuple(i), tuple(lp)) for i, lp in responses) for pid, responses in state.drafts
    }
    ids = about["problem_ids"]
    assert [drafts for _, drafts in arms["spec"].prompts] == [stored.get(pid, ()) for pid in ids]
    assert not stored.get(ids[0]) and not stored.get(ids[1])  # the first epoch's last two: new
    assert about["with_drafts"] == sum(pid in stored for pid in ids) > 0
    assert (about["version"], about["groups"]) == (2, 2)  # 2 prompts a step
    prompt, drafts = next(p for p in arms["spec"].prompts if p[1])
    spec, plain = (arms[a].make(prompt, drafts, 7) for a in ("spec", "plain"))
    assert [r.drafts for r in spec] == [drafts] * 4 and [r.drafts for r in plain] == [()] * 4
    assert [r.tag for r in spec] == [(7, k) for k in range(4)] and spec[0].temperature == 0.1
    assert main(["train", f"resume={run}", "max_steps=3"]) == 0
    logged = [json.loads(x) for x in (run / "groups.jsonl").read_text().splitlines()]
    assert {g["problem_id"] for g in logged if g["step"] == 3} == set(ids[:2])


def test_trainings_acceptance_is_that_of_its_last_epoch(tmp_path):
    rows = [(0.5, 10), (0.6, 10), (0.9, 30), (0.7, 10)]  # (acceptance, verified tokens) per step
    lines = [
        json.dumps({"step": i + 1, "spec_acceptance_rate": a, "spec_verified_tokens": v})
        for i, (a, v) in enumerate(rows)
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert spec_replay.trained_acceptance(tmp_path, 2) == pytest.approx((0.9 * 30 + 0.7 * 10) / 40)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    assert math.isnan(spec_replay.trained_acceptance(tmp_path, 2))
