"""The pieces streamrl shares with verl beyond the basics, each against numbers derived by hand:
token-sum, the abs / k1+ / k3+ KL estimators, token-level REINFORCE++ with gamma < 1, per-token KL
reward shaping, groups of unequal size, GSPO's two forms, and the ratio, ppo_kl and pg_clipfrac_lower
metrics."""

import math

import pytest
import torch
from trajectories import make_traj

from streamrl.algo.advantages import dr_grpo, grpo, reinforce_pp, reinforce_pp_baseline, rloo
from streamrl.algo.advantages_token import kl_shaped_rewards, reinforce_pp_token
from streamrl.algo.kl import abs_kl, k1_plus, k3, k3_plus
from streamrl.algo.loss_inputs import LossParams, LossTensors, ratio_metrics
from streamrl.algo.losses import ppo_clip
from streamrl.algo.losses_is import gspo, gspo_token
from streamrl.config import load_config
from streamrl.loop.step import group_advantages
from streamrl.types import Group, Problem

LOG2 = math.log(2.0)


def close(actual: torch.Tensor, want: list, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.tensor(want, dtype=actual.dtype), atol=atol, rtol=0)


def _grad(fn, logp_value: float, ref_value: float) -> tuple[float, float]:
    logp = torch.tensor([logp_value], requires_grad=True)
    out = fn(logp, torch.tensor([ref_value]))
    out.sum().backward()
    return out.item(), logp.grad.item()


def test_abs_kl_is_the_absolute_log_ratio():
    assert abs_kl(torch.tensor([0.0, -LOG2]), torch.tensor([-LOG2, 0.0])).tolist() == pytest.approx(
        [LOG2] * 2
    )


@pytest.mark.parametrize("log_r", [LOG2, -LOG2])
def test_straight_through_estimators_value_of_k1_k3_gradient_of_k2(log_r):
    # log r = +-log 2: k1 = +-0.693147; k3 = exp(-log r) + log r - 1 = 0.193147 (r = 2) or 0.306853 (r = 1/2)
    # k2's gradient is log r itself (d/dlogp of (log r)^2 / 2); k3's own gradient would be 1 - 1/r
    value, grad = _grad(k1_plus, log_r, 0.0)
    assert (value, grad) == (pytest.approx(log_r), pytest.approx(log_r))
    value, grad = _grad(k3_plus, log_r, 0.0)
    assert value == pytest.approx(0.193147 if log_r > 0 else 0.306853, abs=1e-6)
    assert grad == pytest.approx(log_r, abs=1e-6)
    assert _grad(k3, log_r, 0.0)[1] == pytest.approx(0.5 if log_r > 0 else -1.0, abs=1e-6)


def test_reinforce_pp_token_discounts_per_token_and_whitens_over_the_batch():
    # gamma = 0.5; row 0: reward 1 on its last of 3 tokens -> G = [0.25, 0.5, 1];
    # row 1: 2 tokens, reward -1 on the last -> G = [-0.5, -1], then a pad (G 0, never read)
    # valid G: mean 0.05, unbiased var = (0.04 + 0.2025 + 0.9025 + 0.3025 + 1.1025) / 4 = 0.6375
    # A = (G - 0.05) / sqrt(0.6375 + 1e-8) = (G - 0.05) * 1.2524486
    tr = torch.tensor([[0.0, 0.0, 1.0], [0.0, -1.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = reinforce_pp_token(tr, mask, gamma=0.5)
    assert ret.tolist() == [[0.25, 0.5, 1.0], [-0.5, -1.0, 0.0]]
    close(adv, [[0.250490, 0.563602, 1.189826], [-0.688847, -1.315071, 0.0]], atol=1e-5)


def test_reinforce_pp_token_skips_holes_without_discounting_them():
    # mask [1, 0, 1], gamma 0.5, reward 1 on the last token: G = [0.5, 0, 1] (the hole is not a step)
    _, ret = reinforce_pp_token(torch.tensor([[0.0, 9.0, 1.0]]), torch.tensor([[1.0, 0.0, 1.0]]), gamma=0.5)
    assert ret.tolist() == [[0.5, 0.0, 1.0]]


def test_kl_shaped_rewards_put_the_outcome_on_the_last_token_and_subtract_kl_everywhere():
    # R = 1, kl = [0.1, -0.2, 0.3, (pad 9)], coef 0.5 -> [-0.05, 0.1, 1 - 0.15, 0]
    out = kl_shaped_rewards(
        torch.tensor([1.0]), torch.tensor([[1.0, 1.0, 1.0, 0.0]]), torch.tensor([[0.1, -0.2, 0.3, 9.0]]), 0.5
    )
    close(out, [[-0.05, 0.1, 0.85, 0.0]], atol=1e-7)


RAGGED = torch.tensor([[1.0, 0.0, 1.0], [2.0, 0.0, 5.0]])  # group 2 has two samples (slot 3 is padding)
VALID = torch.tensor([[True, True, True], [True, True, False]])


def test_groups_of_unequal_size():
    # group 1 [1, 0, 1]: mean 2/3, unbiased std sqrt((1/9 + 4/9 + 1/9) / 2) = 0.57735
    #   GRPO: 0.57735, -1.154701, 0.57735; RLOO: r - (2 - r) / 2 = 0.5, -1, 0.5; Dr.GRPO: 1/3, -2/3, 1/3
    # group 2 [2, 0]: mean 1, std sqrt(2) -> GRPO +-0.707106; RLOO 2 - 0, 0 - 2; Dr.GRPO +-1
    # the padded slot (reward 5, never read) gets 0
    g = grpo(RAGGED, VALID)
    close(g, [[0.577350, -1.154699, 0.577350], [0.707106, -0.707106, 0.0]], atol=1e-5)
    close(rloo(RAGGED, VALID), [[0.5, -1.0, 0.5], [2.0, -2.0, 0.0]])
    close(dr_grpo(RAGGED, VALID), [[1 / 3, -2 / 3, 1 / 3], [1.0, -1.0, 0.0]])
    # REINFORCE++ whitens the 5 valid rewards [1, 0, 1, 2, 0]: mean 0.8, unbiased var 2.8 / 4 = 0.7
    sd = math.sqrt(0.7) + 1e-6
    want = [[0.2 / sd, -0.8 / sd, 0.2 / sd], [1.2 / sd, -0.8 / sd, 0.0]]
    close(reinforce_pp(RAGGED, VALID), want)
    # REINFORCE++-baseline: centred [1/3, -2/3, 1/3, 1, -1], mean 0, unbiased var (2/3 + 2) / 4 = 2/3
    sd = math.sqrt(2 / 3) + 1e-6
    want = [[1 / 3 / sd, -2 / 3 / sd, 1 / 3 / sd], [1 / sd, -1 / sd, 0.0]]
    close(reinforce_pp_baseline(RAGGED, VALID), want)


def test_group_advantages_of_groups_of_unequal_size():
    def group(rewards):
        trajs = [make_traj(i, [1], [2, 3], reward=r) for i, r in enumerate(rewards)]
        return Group(Problem("p", [], "1"), trajs)

    batch = group_advantages([group([1.0, 0.0, 1.0]), group([2.0, 0.0])], load_config(None, ["algo=rloo"]))
    assert batch.advantages == pytest.approx([0.5, -1.0, 0.5, 2.0, -2.0])
    assert batch.rewards == [1.0, 0.0, 1.0, 2.0, 0.0]


def test_gspo_forms_differ_only_when_the_advantage_varies_inside_a_sequence():
    # one sequence, log r = [0.1, -0.1]: mean 0, s = 1; A = [1, 3]; wide clip (never engaged)
    # gspo: A_i = mean A = 2 on both tokens: loss [-2, -2]; d(sum)/d logp_t = -2 * 2 * s / 2 = -2 each
    # gspo_token: loss_t = -A_t s: [-1, -3]; gradient -A_t s = [-1, -3]
    t = LossTensors(
        torch.tensor([[0.1, -0.1]]), torch.zeros(1, 2), torch.tensor([[1.0, 3.0]]), torch.ones(1, 2)
    )
    p = LossParams(eps_low=0.5, eps_high=0.5)
    for fn, loss_want, grad_want in (
        (gspo, [-2.0, -2.0], [-2.0, -2.0]),
        (gspo_token, [-1.0, -3.0], [-1.0, -3.0]),
    ):
        logp = t.logprobs.clone().requires_grad_(True)
        loss, _ = fn(LossTensors(logp, t.old_logprobs, t.advantages, t.mask), p)
        loss.sum().backward()
        assert loss[0].tolist() == pytest.approx(loss_want) and logp.grad[0].tolist() == pytest.approx(
            grad_want
        )


def test_gspo_clamps_the_sequence_ratio():
    # mean log r = 100 on four tokens: s = e^10 (clamped); A = +1: clipped at 1.28, no gradient;
    # A = -1: loss = e^10 = 22026.47, no gradient through the saturated clamp
    for adv, want in ((1.0, -1.28), (-1.0, math.exp(10.0))):
        logp = torch.full((1, 4), 100.0, requires_grad=True)
        loss, _ = gspo(
            LossTensors(logp, torch.zeros(1, 4), torch.full((1, 4), adv), torch.ones(1, 4)), LossParams()
        )
        loss.sum().backward()
        assert loss[0, 0].item() == pytest.approx(want, rel=1e-6) and logp.grad.tolist() == [[0.0] * 4]


def test_ppo_kl_and_pg_clipfrac_lower():
    # r = [5, 2, 5], A = [-1, -1, 1], dual clip 3: only token 0 is bounded by the dual clip (5 > 3)
    # ppo_kl = mean(-log r) = -(2 ln 5 + ln 2) / 3 = -1.304008
    ratio = torch.tensor([[5.0, 2.0, 5.0]])
    t = LossTensors(ratio.log(), torch.zeros(1, 3), torch.tensor([[-1.0, -1.0, 1.0]]), torch.ones(1, 3))
    _, m = ppo_clip(t, LossParams(dual_clip=3.0))
    assert m["pg_clipfrac_lower"] == pytest.approx(1 / 3)
    assert m["ppo_kl"] == pytest.approx(-1.304008, abs=1e-6)
    assert ppo_clip(t, LossParams())[1]["pg_clipfrac_lower"] == 0.0  # dual clip off


def test_ratio_metrics_hand_values_on_masked_clamped_and_empty_batches():
    # r = [2, 4] on the mask (the third token, r = e^9, is padding): ratio_mean (2 + 4) / 2 = 3,
    # approx_kl mean((log r)^2 / 2) = (ln2^2 + 4 ln2^2) / 4 = 1.25 ln2^2, ppo_kl mean(-log r) = -1.5 ln2
    m = ratio_metrics(torch.tensor([[LOG2, 2 * LOG2, 9.0]]), torch.tensor([[1.0, 1.0, 0.0]]))
    assert m == pytest.approx({"ratio_mean": 3.0, "approx_kl": 1.25 * LOG2**2, "ppo_kl": -1.5 * LOG2})
    # log r = 50 counts as the clamp's 20: r = e^20
    m = ratio_metrics(torch.tensor([[50.0]]), torch.ones(1, 1))
    assert m == pytest.approx({"ratio_mean": math.exp(20.0), "approx_kl": 200.0, "ppo_kl": -20.0})
    # a micro-batch with no loss token (every sample masked out) reports 0, not NaN
    m = ratio_metrics(torch.tensor([[1.0, -1.0]]), torch.zeros(1, 2))
    assert m == {"ratio_mean": 0.0, "approx_kl": 0.0, "ppo_kl": 0.0}


def test_trainer_reinforce_pp_token_whitens_over_the_whole_batch_with_kl_token_rewards(tiny):
    import copy

    from streamrl.trainer.batching import collate
    from streamrl.trainer.logprobs import completion_logprobs
    from streamrl.trainer.trainer import Trainer
    from streamrl.types import TrainBatch

    model = copy.deepcopy(tiny[0])
    overrides = ["advantage.name=reinforce_pp_token", "advantage.gamma=0.5", "train.token_budget=8"]
    kl = ["loss.kl_in=token_reward", "loss.kl_coef=0.5", "loss.kl_estimator=k1", "train.precision=fp32"]
    cfg = load_config(None, [*overrides, *kl, "train.shared_prompt=false", "rollout.temperature=1.0"])
    trainer = Trainer.from_config(model, cfg, pad_id=0)
    trajs = [make_traj(0, [5, 6, 7], [8, 9, 10], reward=1.0), make_traj(1, [5, 6], [11, 12], reward=-1.0)]
    with torch.no_grad():  # behaviour = reference + 0.1 per token: k1 = 0.1, penalty 0.05 per token
        for t in trajs:
            lp = completion_logprobs(model, collate([t], [0.0], 0), temperature=1.0)[0][0]
            t.behaviour_logprobs = (lp + 0.1).tolist()
    mbs, _ = trainer.prepare(TrainBatch(trajs, [0.0, 0.0]))
    assert len(mbs) == 2  # one trajectory per micro-batch: the whitening still spans both
    # token rewards [-0.05, -0.05, 0.95] and [-0.05, -1.05]; gamma 0.5 returns:
    # [-0.05 + 0.5 * 0.425, -0.05 + 0.5 * 0.95, 0.95] = [0.1625, 0.425, 0.95];
    # [-0.05 + 0.5 * -1.05, -1.05] = [-0.575, -1.05]
    # mean -0.0175, unbiased var = (0.18^2 + 0.4425^2 + 0.9675^2 + 0.5575^2 + 1.0325^2) / 4 = 0.635281
    returns = torch.tensor([0.1625, 0.425, 0.95, -0.575, -1.05])
    want = ((returns + 0.0175) / math.sqrt(0.635281 + 1e-8)).tolist()
    by_len = {
        mb.advantages.shape[1]: mb.advantages[0].tolist() for mb in mbs
    }  # the micro-batch order is free
    got = by_len[3] + by_len[2]
    assert got == pytest.approx(want, abs=2e-4)
