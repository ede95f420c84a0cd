"""Advantages, losses, KL and aggregation against numbers computed by hand."""

import math

import pytest
import torch

from streamrl.algo.advantages import grpo
from streamrl.algo.aggregation import batch_normalizer, token_mean
from streamrl.algo.kl import k1, k2, k3
from streamrl.algo.loss_inputs import LossParams, LossTensors
from streamrl.algo.losses import decoupled_ppo, ppo_clip

P = LossParams()


def test_grpo_hand_values():
    # mean 0.5; unbiased std = sqrt(4 * 0.25 / 3) = 0.57735; A = +-0.5 / 0.57735 = +-0.866025
    a = grpo(torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]]))
    assert a[0].tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)
    assert a[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # all-equal group teaches nothing


def test_grpo_without_std_is_centered_reward():
    a = grpo(torch.tensor([[1.1, 0.1, 0.0, 0.0]]), std_normalize=False)
    assert a[0].tolist() == pytest.approx([0.8, -0.2, -0.3, -0.3], abs=1e-6)


def test_grpo_single_sample_group_is_zero():
    assert grpo(torch.tensor([[3.0], [1.0]])).tolist() == [[0.0], [0.0]]


def test_ppo_clip_hand_values_and_gradients():
    # ratios 1.5, 0.5, 0.5, 1.5, 1.0 with advantages +1, -1, +1, -1, +2; eps_low 0.2, eps_high 0.28
    ratio = torch.tensor([[1.5, 0.5, 0.5, 1.5, 1.0]])
    old = torch.zeros_like(ratio)
    logp = ratio.log().clone().requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 2.0]])
    mask = torch.ones_like(ratio)
    loss, m = ppo_clip(LossTensors(logp, old, adv, mask), LossParams(eps_low=0.2, eps_high=0.28))
    # A>0,r>1+eh: clipped -1.28 | A<0,r<1-el: clipped 0.8 | A>0,r<1: -0.5 | A<0,r>1: 1.5 | r=1: -2
    assert loss[0].tolist() == pytest.approx([-1.28, 0.8, -0.5, 1.5, -2.0], abs=1e-6)
    loss.sum().backward()
    # clipped tokens carry no gradient; others: d(-A r)/d logp = -A r
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, -0.5, 1.5, -2.0], abs=1e-6)
    assert m["clip_frac_high"] == pytest.approx(0.2)
    assert m["clip_frac_low"] == pytest.approx(0.2)
    assert m["ratio_mean"] == pytest.approx(1.0)


def test_ppo_clip_metrics_respect_mask():
    ratio = torch.tensor([[2.0, 1.0]])
    loss, m = ppo_clip(
        LossTensors(ratio.log(), torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([[0.0, 1.0]])), P
    )
    assert m["clip_frac_high"] == 0.0 and m["ratio_mean"] == pytest.approx(1.0)


def test_kl_estimators_hand_values():
    logp = torch.tensor([0.0])
    ref = torch.tensor([math.log(0.5)])  # log r = log 2 = 0.693147
    assert k1(logp, ref).item() == pytest.approx(0.693147, abs=1e-6)
    assert k2(logp, ref).item() == pytest.approx(0.5 * 0.693147**2, abs=1e-6)
    assert k3(logp, ref).item() == pytest.approx(0.5 + 0.693147 - 1, abs=1e-6)  # 0.193147
    assert k3(torch.tensor([1.0]), torch.tensor([1.0])).item() == 0.0


def test_token_mean_is_invariant_to_micro_batch_split():
    torch.manual_seed(0)
    loss = torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.3).float()
    full = token_mean(loss, mask, batch_normalizer("token-mean", [mask]))
    parts = [(loss[:2], mask[:2]), (loss[2:5], mask[2:5]), (loss[5:], mask[5:])]
    norm = batch_normalizer("token-mean", [m for _, m in parts])
    split = sum(token_mean(lo, ma, norm) for lo, ma in parts)
    assert split.item() == pytest.approx(full.item(), abs=1e-6)
    assert full.item() == pytest.approx(((loss * mask).sum() / mask.sum()).item(), abs=1e-6)


def test_decoupled_equals_ppo_clip_when_prox_is_behaviour():
    torch.manual_seed(1)
    logp = torch.randn(3, 4)
    behav = logp + 0.3 * torch.randn(3, 4)
    adv = torch.randn(3, 1).expand(3, 4)
    mask = (torch.rand(3, 4) > 0.2).float()
    plain, _ = ppo_clip(LossTensors(logp, behav, adv, mask), P)
    dec, m = decoupled_ppo(LossTensors(logp, behav, adv, mask, prox_logprobs=behav.clone()), P)
    assert torch.equal(plain, dec)  # exact: w = exp(0) = 1
    assert m["behav_weight_mean"] == 1.0


def test_decoupled_hand_values_with_cap():
    # token 1: prox/behav = 2, r = theta/prox = 1.5, A = +1 -> w * max(-1.5, -1.28) = 2 * -1.28 = -2.56
    # token 2: prox/behav = 4 capped at 3, r = 1, A = -1 -> 3 * max(1, 1) = 3
    behav = torch.log(torch.tensor([[0.1, 0.1]]))
    prox = torch.log(torch.tensor([[0.2, 0.4]]))
    theta = torch.log(torch.tensor([[0.3, 0.4]]))
    adv = torch.tensor([[1.0, -1.0]])
    loss, m = decoupled_ppo(
        LossTensors(theta, behav, adv, torch.ones(1, 2), prox_logprobs=prox), LossParams(behav_weight_cap=3.0)
    )
    assert loss[0].tolist() == pytest.approx([-2.56, 3.0], abs=1e-5)
    assert m["behav_weight_capped_frac"] == 0.5
