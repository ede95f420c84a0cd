"""GSPO, CISPO, truncated IS, REINFORCE, M2PO, PPO dual clip and the aggregations, by hand."""

import math

import pytest
import torch

from streamrl.algo.aggregation import (
    batch_normalizer,
    seq_mean_token_mean,
    seq_mean_token_sum,
    seq_mean_token_sum_norm,
    token_mean,
    token_sum,
)
from streamrl.algo.loss_inputs import LossParams, LossTensors
from streamrl.algo.losses import ppo_clip
from streamrl.algo.losses_is import cispo, gspo, reinforce, truncated_is
from streamrl.algo.losses_m2po import m2_cut, m2_mask, m2po

P = LossParams()

LOG_HALF, LOG_QUARTER = math.log(0.5), math.log(0.25)


def _two_tokens():
    """logp = log(0.5), log(0.25); r = 1.5, 0.5; A = +1, -1."""
    logp = torch.tensor([[LOG_HALF, LOG_QUARTER]], requires_grad=True)
    old = torch.tensor([[LOG_HALF - math.log(1.5), LOG_QUARTER - math.log(0.5)]])
    return logp, old, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)


def test_gspo_sequence_ratio_and_clip():
    # seq 0: mean log r over its 2 loss tokens = (0.2 - 0.1)/2 = 0.05, s = e^0.05 = 1.051271, A = 1: no clip
    # seq 1: s = e^0.4 = 1.491825 > 1.28, A = 2: max(-2.983649, -2.56) = -2.56, no gradient
    log_r = torch.tensor([[0.2, -0.1, 0.5], [0.4, 0.4, 0.4]])
    logp = log_r.clone().requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0], [2.0]]).expand(2, 3)
    loss, m = gspo(LossTensors(logp, torch.zeros(2, 3), adv, mask), P)
    assert loss[0, :2].tolist() == pytest.approx([-1.051271] * 2, abs=1e-6)
    assert loss[1].tolist() == pytest.approx([-2.56] * 3, abs=1e-6)
    (loss * mask).sum().backward()
    # d(-A s)/d logp_t = -A s / len = -1.051271 / 2 per valid token; summed over seq 0's 2 tokens
    assert logp.grad[0].tolist() == pytest.approx([-1.051271, -1.051271, 0.0], abs=1e-6)
    assert logp.grad[1].tolist() == [0.0, 0.0, 0.0]
    assert m["seq_clip_frac"] == pytest.approx(3 / 5)


def test_gspo_counts_a_sequence_as_clipped_only_where_the_clip_holds_it():
    """Below the band with A > 0 (or above with A < 0) the loss keeps the unclipped term and its
    gradient: not clipped. Rows: s below, A +1 (kept); s below, A -1 (clipped); s above, A -1 (kept);
    s above, A +1 (clipped). Two loss tokens each: 4 of 8 clipped."""
    log_r = torch.tensor([[-0.1, -0.1], [-0.1, -0.1], [0.1, 0.1], [0.1, 0.1]])
    logp = log_r.clone().requires_grad_(True)
    adv = torch.tensor([[1.0], [-1.0], [-1.0], [1.0]]).expand(4, 2)
    mask = torch.ones(4, 2)
    loss, m = gspo(LossTensors(logp, torch.zeros(4, 2), adv, mask), LossParams(eps_low=3e-4, eps_high=4e-4))
    assert m["seq_clip_frac"] == pytest.approx(0.5)
    (loss * mask).sum().backward()
    held = (logp.grad == 0).all(dim=1).tolist()
    assert held == [False, True, False, True]  # the metric's clipped rows are exactly those without gradient
    from streamrl.algo.losses_is import gspo_token

    band = LossParams(eps_low=3e-4, eps_high=4e-4)
    _, mt = gspo_token(LossTensors(log_r.clone().requires_grad_(True), torch.zeros(4, 2), adv, mask), band)
    assert mt["seq_clip_frac"] == pytest.approx(0.5)  # per token advantages, the same rows


def test_cispo_clips_the_weight_not_the_gradient():
    logp, old, adv, mask = _two_tokens()
    loss, _ = cispo(LossTensors(logp, old, adv, mask), LossParams(eps_low=0.2, eps_high=0.28))
    # w = clip(r) = 1.28, 0.8; loss = -w A logp = -1.28*0.693147... = 0.887228, -0.8*1.386294 = -1.109035
    assert loss[0].tolist() == pytest.approx([0.887228, -1.109035], abs=1e-6)
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.28, 0.8], abs=1e-6)  # every token has a gradient


def test_truncated_is_and_reinforce():
    logp, old, adv, mask = _two_tokens()
    loss, _ = truncated_is(LossTensors(logp, old, adv, mask), LossParams(eps_high=0.28))
    # w = min(r, 1.28) = 1.28, 0.5: loss = 0.887228, -0.5 * 1.386294 = -0.693147
    assert loss[0].tolist() == pytest.approx([0.887228, -0.693147], abs=1e-6)
    plain, _ = reinforce(LossTensors(logp, old, adv, mask), P)
    assert plain[0].tolist() == pytest.approx([0.693147, -1.386294], abs=1e-6)


def test_m2_mask_drops_the_fewest_largest_tokens():
    # (log r)^2 = 0.01, 0.25, 0.04, 1.0: means after dropping 0, 1, 2 largest: 0.325, 0.1, 0.025 <= 0.04
    log_r = torch.tensor([[0.1, -0.5, 0.2, 1.0]])
    assert m2_mask(log_r, torch.ones(1, 4), 0.04).tolist() == [[1.0, 0.0, 1.0, 0.0]]
    # token 3 not a loss token: (0.01, 0.25, 0.04) -> means 0.1, 0.025: drop token 1 only
    assert m2_mask(log_r, torch.tensor([[1.0, 1.0, 1.0, 0.0]]), 0.04).tolist() == [[1.0, 0.0, 1.0, 0.0]]
    assert m2_mask(log_r, torch.ones(1, 4), 1.0).tolist() == [[1.0, 1.0, 1.0, 1.0]]  # 0.325 <= 1


def test_m2_cut_of_a_mini_batch_is_not_its_micro_batches():
    # (log r)^2 0.01, 0.25, 0.04, 1.0 at threshold 0.04: the two largest go, the smallest dropped is 0.25
    assert m2_cut(torch.tensor([0.01, 0.25, 0.04, 1.0]), 0.04) == (
        pytest.approx(0.25),
        0.0,
    )  # 0.25 alone: dropped
    assert m2_cut(torch.tensor([0.01, 0.25, 0.04, 1.0]), 1.0).value == math.inf  # mean 0.325 <= 1
    assert m2_cut(torch.zeros(0), 0.04).value == math.inf
    # micro-batch 1: log r 0.5, 0, 0, 0 (mean square 0.0625 > 0.04); micro-batch 2: all 0. Over the
    # mini-batch's 8 tokens the mean is 0.03125 <= 0.04: nothing is dropped, though micro-batch 1 alone
    # drops its 0.5
    first, mask = torch.tensor([[0.5, 0.0, 0.0, 0.0]]), torch.ones(1, 4)
    assert m2_cut(torch.cat([first, torch.zeros(1, 4)], 1).flatten() ** 2, 0.04).value == math.inf
    assert m2_mask(first, mask, 0.04).tolist() == [[0.0, 1.0, 1.0, 1.0]]
    # the loss takes the mini-batch's keep mask when it is given
    loss, m = m2po(LossTensors(first, torch.zeros(1, 4), torch.ones(1, 4), mask, m2_keep=mask), LossParams())
    assert m["m2_masked_frac"] == 0.0 and loss[0, 0].item() == pytest.approx(-math.exp(0.5))


def test_tokens_tied_at_the_m2_cut_keep_the_share_the_rule_keeps():
    # (log r)^2: 1.0 on three tokens (identical samples), 0 on five: means after dropping the 0, 1, 2, 3
    # largest 3/8, 2/7, 1/6, 0: at threshold 0.2 two of the three go, so each tied token keeps 1/3
    log_r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]])
    cut = m2_cut((log_r**2).flatten(), 0.2)
    assert (cut.value, cut.tied_keep) == (1.0, pytest.approx(1 / 3))
    keep = m2_mask(log_r, torch.ones(2, 4), 0.2)
    assert keep.flatten().tolist() == pytest.approx([1 / 3, 1, 1, 1, 1 / 3, 1, 1 / 3, 1])
    # a padding token keeps nothing, whatever its ratio
    assert m2_mask(log_r, torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0] * 4]), 0.2)[0, 1] == 0.0
    # the weighted mean of the kept squares is the fewest-dropped mean, 1/6 <= 0.2
    assert float((keep * log_r**2).sum() / keep.sum()) == pytest.approx(1 / 6)
    _, m = m2po(
        LossTensors(log_r, torch.zeros(2, 4), torch.ones(2, 4), torch.ones(2, 4)),
        LossParams(m2_threshold=0.2),
    )
    assert m["m2_masked_frac"] == pytest.approx(2 / 8)


def test_m2po_loss_is_unclipped_ratio_on_kept_tokens():
    log_r = torch.tensor([[0.1, -0.5, 0.2, 1.0]])
    loss, m = m2po(
        LossTensors(log_r, torch.zeros(1, 4), torch.ones(1, 4), torch.ones(1, 4)),
        LossParams(m2_threshold=0.04),
    )
    assert loss[0].tolist() == pytest.approx([-math.exp(0.1), 0.0, -math.exp(0.2), 0.0], abs=1e-6)
    assert m["m2_masked_frac"] == pytest.approx(0.5)


def test_ppo_dual_clip_bounds_negative_advantage_loss():
    ratio = torch.tensor([[5.0, 2.0, 5.0]])
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    loss, _ = ppo_clip(
        LossTensors(ratio.log(), torch.zeros(1, 3), adv, torch.ones(1, 3)), LossParams(dual_clip=3.0)
    )
    # A<0, r=5: max(5, 1.28) = 5 -> min(5, 3) = 3 | A<0, r=2: 2 (< 3) | A>0, r=5: -1.28 unchanged
    assert loss[0].tolist() == pytest.approx([3.0, 2.0, -1.28], abs=1e-6)


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "name, fn, expected",
    [
        ("token-mean", token_mean, 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("token-sum", token_sum, 7.0),  # 1 + 2 + 4, not normalised
        ("seq-mean-token-mean", seq_mean_token_mean, 2.75),  # mean(1.5, 4)
        ("seq-mean-token-sum", seq_mean_token_sum, 3.5),  # mean(3, 4)
        ("seq-mean-token-sum-norm", seq_mean_token_sum_norm, 0.875),  # 7 / (2 seqs * horizon 4)
    ],
)
def test_aggregations_and_micro_batch_invariance(name, fn, expected):
    assert fn(LOSS, MASK, batch_normalizer(name, [MASK], horizon=4)).item() == pytest.approx(expected)
    torch.manual_seed(3)
    loss, mask = torch.randn(7, 5), (torch.rand(7, 5) > 0.4).float()
    mask[4] = 0  # a row with no loss token is not a sequence
    full = fn(loss, mask, batch_normalizer(name, [mask], horizon=5))
    parts = [slice(0, 3), slice(3, 4), slice(4, 7)]
    norm = batch_normalizer(name, [mask[p] for p in parts], horizon=5)
    split = sum(fn(loss[p], mask[p], norm) for p in parts)
    assert split.item() == pytest.approx(full.item(), abs=1e-6)
