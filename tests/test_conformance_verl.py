"""Cross-check against the formulas verl 0.9 documents (trainer/ppo/core_algos.py, rollout_corr_helper.py).

The reference functions below are our own transcriptions of verl's documented formulas, with its
epsilon and clamping conventions; where streamrl deliberately differs (docs/algorithms.md), the test pins
the difference.
"""

import math

import pytest
import torch

from streamrl.algo import registry
from streamrl.algo.advantages import dr_grpo, grpo, reinforce_pp_baseline, remax, rloo
from streamrl.algo.advantages_token import gae, kl_shaped_rewards, reinforce_pp_token, terminal_rewards
from streamrl.algo.aggregation import batch_normalizer
from streamrl.algo.kl import k1
from streamrl.algo.loss_inputs import LossParams, LossTensors
from streamrl.algo.losses import ppo_clip
from streamrl.algo.losses_is import cispo, gspo, gspo_token
from streamrl.algo.rollout_correction import CorrectionParams

# ---- verl's formulas, transcribed ----------------------------------------------------------------------


def masked_mean(x, m):
    return (x * m).sum() / m.sum()


def masked_whiten(x, m):
    """(x - mean) * rsqrt(var + 1e-8), mean and unbiased var over the mask."""
    mean = masked_mean(x, m)
    var = masked_mean((x - mean) ** 2, m) * m.sum() / (m.sum() - 1)
    return (x - mean) * torch.rsqrt(var + 1e-8)


def by_index(scores, index, fn):
    """Apply fn(group scores) -> group advantages per prompt index (verl groups by index, any size)."""
    out = scores.clone()
    for idx in set(index):
        rows = [i for i, j in enumerate(index) if j == idx]
        out[rows] = fn(scores[rows])
    return out


def verl_grpo(scores, index, eps=1e-6, norm_by_std=True):
    """(s - mean) / (std + eps) per index, unbiased std; a lone sample: mean 0, std 1."""

    def f(g):
        mean, std = (g.mean(), g.std()) if len(g) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
        return (g - mean) / (std + eps) if norm_by_std else g - mean

    return by_index(scores, index, f)


def verl_rloo(scores, index):
    """s * n / (n - 1) - mean * n / (n - 1) per index; a lone sample keeps its score."""
    return by_index(
        scores,
        index,
        lambda g: g * len(g) / (len(g) - 1) - g.mean() * len(g) / (len(g) - 1) if len(g) > 1 else g,
    )


def verl_reinforce_pp(token_rewards, mask, gamma):
    """Discounted returns; a token with mask 0 carries the running return through unchanged; whitened."""
    returns, running = torch.zeros_like(token_rewards), torch.zeros(token_rewards.shape[0])
    for t in reversed(range(token_rewards.shape[1])):
        new = token_rewards[:, t] + gamma * running
        returns[:, t] = new * mask[:, t]
        running = new * mask[:, t] + running * (1 - mask[:, t])
    return masked_whiten(returns, mask) * mask, returns


def verl_agg(loss, mask, mode, loss_scale_factor=None):
    seq_sums, seqs = (loss * mask).sum(-1), (mask.sum(-1) > 0).float()
    if mode == "token-mean":
        return (loss * mask).sum() / mask.sum()
    if mode == "token-sum":
        return (loss * mask).sum()
    if mode == "seq-mean-token-mean":
        return ((seq_sums / (mask.sum(-1) + 1e-8)) * seqs).sum() / seqs.sum()
    out = (seq_sums * seqs).sum() / seqs.sum()  # seq-mean-token-sum(-norm)
    if mode == "seq-mean-token-sum-norm":
        out = out / (mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return out


def verl_kl(logp, ref, name):
    base = name.rstrip("+")
    lr = logp - ref
    if base == "k1":
        fwd = lr
    elif base == "abs":
        fwd = lr.abs()
    elif base == "k2":
        fwd = 0.5 * lr.square()
    else:  # k3 / low_var_kl
        kl = (ref - logp).clamp(-20.0, 20.0)
        fwd = (torch.exp(kl) - kl - 1).clamp(-10.0, 10.0)
    if not name.endswith("+") or base == "k2":
        return fwd
    back = 0.5 * lr.square()
    return back - back.detach() + fwd.detach()


def verl_vanilla_ppo(old, logp, adv, clip_low, clip_high, clip_c=3.0):
    """Per-token loss (+-20 clamp, clip, dual clip for A < 0) and verl's ppo_kl / pg_clipfrac_lower."""
    nakl = (logp - old).clamp(-20.0, 20.0)
    ratio = torch.exp(nakl)
    l1, l2 = -adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high)
    c1 = torch.maximum(l1, l2)
    c2 = torch.minimum(-adv * clip_c, c1)
    lower = (c1 > -adv * clip_c) & (adv < 0)
    return torch.where(adv < 0, c2, c1), -nakl, lower.float()


def verl_gspo(old, logp, adv, mask, clip_low, clip_high):
    seq = ((logp - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    s = torch.exp((logp - logp.detach() + seq.detach()[:, None]).clamp(max=10.0))
    return torch.maximum(-adv * s, -adv * s.clamp(1 - clip_low, 1 + clip_high))


def verl_is_weights(log_ratio, mask, level, upper, lower=None):
    """Token or sequence IS weight, log clamped to +-20, zero on padding; TIS caps, IcePop zeroes outside."""
    lr = log_ratio if level == "token" else (log_ratio * mask).sum(-1, keepdim=True)
    w = torch.exp(lr.clamp(-20.0, 20.0)).expand_as(log_ratio) * mask
    if lower is None:
        return w.clamp(max=upper)
    return torch.where((w >= lower) & (w <= upper), w, torch.zeros_like(w))


def verl_rs_keep(log_ratio, mask, option, lower, upper):
    """Rejection on k1 = log(pi_rollout / pi_old): the sequence sum (seq_sum_k1) or mean (seq_mean_k1)
    is kept within [log lower, log upper]."""
    k1_tok = -log_ratio.clamp(-20.0, 20.0)
    stat = (k1_tok * mask).sum(-1) if option == "seq_sum_k1" else (k1_tok * mask).sum(-1) / mask.sum(-1)
    keep = (stat >= math.log(lower)) & (stat <= math.log(upper))
    return keep[:, None].expand_as(mask).float()


# ---- advantages -----------------------------------------------------------------------------------------


def test_grpo_rloo_dr_grpo_match_verl_for_groups_of_any_size():
    rewards = torch.tensor([[1.0, 0.0, 2.0, 1.0], [3.0, 1.0, 0.0, 0.0], [0.5, 0.5, 2.0, 0.0]])
    valid = torch.tensor([[True] * 4, [True, True, False, False], [True, True, True, False]])
    flat, index = rewards[valid], [i for i, row in enumerate(valid) for v in row if v]
    assert torch.allclose(grpo(rewards, valid)[valid], verl_grpo(flat, index), atol=1e-6)
    assert torch.allclose(rloo(rewards, valid)[valid], verl_rloo(flat, index), atol=1e-6)
    centred = verl_grpo(flat, index, norm_by_std=False)
    assert torch.allclose(dr_grpo(rewards, valid)[valid], centred, atol=1e-6)
    assert torch.allclose(grpo(rewards, valid, std_normalize=False)[valid], centred, atol=1e-6)
    # a lone sample: verl's baseline 0 (and std 1) leave A = r; streamrl gives 0 (nothing to compare with)
    assert verl_grpo(torch.tensor([2.0]), [0]).item() == pytest.approx(2.0, abs=1e-5)
    assert verl_rloo(torch.tensor([2.0]), [0]).item() == 2.0
    assert grpo(torch.tensor([[2.0]])).item() == 0.0 and rloo(torch.tensor([[2.0]])).item() == 0.0


def test_reinforce_pp_token_matches_verl_reinforce_plus_plus():
    torch.manual_seed(4)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 0, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.float)
    tr = terminal_rewards(mask, torch.tensor([1.0, -0.5, 2.0])) + 0.1 * torch.randn(3, 5) * mask
    ours, ret = reinforce_pp_token(tr, mask, gamma=0.9)
    ref, ref_ret = verl_reinforce_pp(tr, mask, 0.9)
    assert torch.allclose(ours, ref, atol=1e-6) and torch.allclose(ret, ref_ret, atol=1e-6)


def test_reinforce_pp_baseline_whitens_samples_where_verl_whitens_tokens():
    rewards = torch.tensor([[1.0, 0.0], [2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float)
    centred = (rewards - rewards.mean(-1, keepdim=True)).flatten()
    verl = masked_whiten(centred[:, None].expand(4, 4) * mask, mask) * mask
    ours = reinforce_pp_baseline(rewards).flatten()
    # equal lengths would agree up to the eps conventions; these lengths weight the long sample more
    assert not torch.allclose(verl[:, 0], ours, atol=1e-2)
    # centred [0.5, -0.5, 1, -1], unbiased std sqrt(2.5 / 3) = 0.912871: [+-0.547722, +-1.095445]
    assert ours.tolist() == pytest.approx([0.547722, -0.547722, 1.095445, -1.095445], abs=1e-5)


def test_remax_matches_verl_and_gae_matches_verl_before_its_whitening():
    r, b = torch.tensor([[1.0, 0.0, 0.5]]), torch.tensor([0.5])
    assert remax(r, baseline_rewards=b).tolist() == [[0.5, -0.5, 0.0]]  # verl: returns R - b per token
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    tr, v = torch.tensor([[0.1, 0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.9, 0.8]])
    adv, _ = gae(tr, v, mask, gamma=0.9, lam=0.8)
    nv, lastgae, rev = 0.0, 0.0, []
    for t in reversed(range(4)):  # verl: mask-0 tokens carry next value and running advantage through
        delta = tr[:, t] + 0.9 * nv - v[:, t]
        new = delta + 0.72 * lastgae
        nv = v[:, t] * mask[:, t] + (1 - mask[:, t]) * nv
        lastgae = new * mask[:, t] + (1 - mask[:, t]) * lastgae
        rev.append(lastgae)
    raw = torch.stack(rev[::-1], dim=1)
    assert torch.allclose(adv * mask, raw * mask, atol=1e-6)  # verl then whitens; streamrl returns it raw


# ---- policy losses --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dual", [3.0, 0.0])
def test_ppo_clip_and_its_metrics_match_verl_vanilla(dual):
    torch.manual_seed(1)
    logp = torch.randn(4, 6) * 0.5
    old = logp + torch.randn(4, 6) * 0.7  # ratios well outside the clip range
    old[0, 0] = logp[0, 0] - 30.0  # exercises the +-20 clamp
    adv = torch.randn(4, 1).expand(4, 6).contiguous()
    adv[1] = -2.0  # a negative-advantage row so dual clip can engage
    old[1, :3] = logp[1, :3] - 2.0  # r = e^2 = 7.4 > 3
    mask = (torch.rand(4, 6) > 0.25).float()
    mask[1, :3] = 1.0
    per_token, m = ppo_clip(LossTensors(logp, old, adv, mask), LossParams(0.2, 0.28, dual_clip=dual))
    ref, ref_kl, ref_lower = verl_vanilla_ppo(old, logp, adv, 0.2, 0.28)
    assert m["ppo_kl"] == pytest.approx(masked_mean(ref_kl, mask).item(), abs=1e-6)
    if dual:
        assert torch.allclose(per_token * mask, ref * mask, atol=1e-5)
        assert (
            m["pg_clipfrac_lower"] == pytest.approx(masked_mean(ref_lower, mask).item())
            and m["pg_clipfrac_lower"] > 0
        )
    else:  # verl always applies dual clip (c = 3); streamrl only when loss.dual_clip is set
        assert (per_token * mask).sum() > (ref * mask).sum() + 1e-3 and m["pg_clipfrac_lower"] == 0.0


def _grads(fn, base, *args):
    x = base.clone().requires_grad_(True)
    out = fn(x, *args)
    return out, x


def test_gspo_token_matches_verl_gspo_and_gspo_only_for_sequence_constant_advantages():
    torch.manual_seed(3)
    old = torch.randn(3, 5) * 0.1
    base = old + torch.randn(3, 5) * 0.05
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.float)
    eps_low, eps_high = 3e-4, 4e-4
    p = LossParams(eps_low, eps_high)
    norm = batch_normalizer("seq-mean-token-mean", [mask])
    agg = registry.AGGREGATIONS["seq-mean-token-mean"]
    constant = torch.tensor([[1.0], [-1.0], [0.5]]).expand(3, 5)
    varying = torch.randn(3, 5)  # GAE-like advantages
    for adv in (constant, varying):
        ref_x = base.clone().requires_grad_(True)
        ref = verl_agg(verl_gspo(old, ref_x, adv, mask, eps_low, eps_high), mask, "seq-mean-token-mean")
        ref.backward()
        for fn in (gspo_token, gspo):
            x = base.clone().requires_grad_(True)
            ours = agg(fn(LossTensors(x, old, adv, mask), p)[0], mask, norm)
            ours.backward()
            same = torch.allclose(x.grad, ref_x.grad, atol=1e-6) and abs(ours.item() - ref.item()) < 1e-6
            assert same is (fn is gspo_token or adv is constant), fn.__name__


def test_cispo_matches_verl():
    torch.manual_seed(5)
    logp, old = -torch.rand(2, 4) * 2, -torch.rand(2, 4) * 2
    adv = torch.randn(2, 4)
    ours, _ = cispo(LossTensors(logp, old, adv, torch.ones(2, 4)), LossParams(0.2, 0.28))
    ratio = torch.exp((logp - old).clamp(-20.0, 20.0))
    assert torch.allclose(ours, -ratio.clamp(0.8, 1.28) * adv * logp, atol=1e-6)


# ---- aggregation and KL ---------------------------------------------------------------------------------


def test_aggregations_match_verl_on_one_batch():
    torch.manual_seed(2)
    loss, mask = torch.randn(5, 7), (torch.rand(5, 7) > 0.3).float()
    mask[:, 0], mask[4] = 1.0, 0.0  # a row without loss tokens is not a sequence
    for mode in ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum"):
        ours = registry.AGGREGATIONS[mode](loss, mask, batch_normalizer(mode, [mask]))
        assert ours.item() == pytest.approx(verl_agg(loss, mask, mode).item(), abs=1e-5), mode
    # seq-mean-token-sum-norm: sum / (sequences x constant); streamrl's constant is max_new_tokens, verl's
    # its loss_scale_factor (by default the micro-batch's padded width, which changes with the batch)
    ours = registry.AGGREGATIONS["seq-mean-token-sum-norm"](
        loss, mask, batch_normalizer("seq-mean-token-sum-norm", [mask], horizon=16)
    )
    assert ours.item() == pytest.approx(verl_agg(loss, mask, "seq-mean-token-sum-norm", 16).item(), abs=1e-6)
    default = verl_agg(loss, mask, "seq-mean-token-sum-norm")  # / 7, the padded width
    assert ours.item() * 16 / 7 == pytest.approx(default.item(), abs=1e-5)


@pytest.mark.parametrize("name", ["k1", "abs", "k2", "k3", "k1+", "k3+"])
def test_kl_estimators_match_verl_values_and_gradients(name):
    logp = torch.tensor([0.0, -1.0, -3.0, -50.0, 0.0, -0.2])
    ref = torch.tensor([-0.5, -1.0, -0.1, 0.0, -50.0, -0.3])
    a, b = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    ours, theirs = registry.KL_ESTIMATORS[name](a, ref), verl_kl(b, ref, name)
    ours.sum().backward()
    theirs.sum().backward()
    assert torch.allclose(ours, theirs, atol=1e-6) and torch.allclose(a.grad, b.grad, atol=1e-6)
    assert torch.isfinite(a.grad).all()


def test_kl_reward_shaping_matches_verl_compute_rewards():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    old, ref = torch.randn(2, 4), torch.randn(2, 4)
    scores = terminal_rewards(mask, torch.tensor([1.0, -1.0]))
    verl = (scores - 0.05 * (old - ref)) * mask  # token_level_scores - kl * kl_ratio
    assert torch.allclose(
        kl_shaped_rewards(torch.tensor([1.0, -1.0]), mask, k1(old, ref), 0.05), verl, atol=1e-6
    )


# ---- rollout corrections --------------------------------------------------------------------------------


def _rc(name, log_ratio, mask, **kw):
    return (
        registry.CORRECTIONS[name].fn(log_ratio, mask, torch.zeros_like(mask), CorrectionParams(**kw)).weight
        * mask
    )


def test_rollout_corrections_match_verl():
    torch.manual_seed(6)
    log_ratio = torch.randn(6, 5) * 0.6  # log pi_old - log pi_rollout
    log_ratio[0, 0] = 40.0  # the +-20 safety bound
    mask = (torch.rand(6, 5) > 0.2).float()
    mask[:, 0] = 1.0
    assert torch.allclose(_rc("token_tis", log_ratio, mask), verl_is_weights(log_ratio, mask, "token", 2.0))
    assert torch.allclose(_rc("seq_tis", log_ratio, mask), verl_is_weights(log_ratio, mask, "sequence", 2.0))
    icepop = verl_is_weights(log_ratio, mask, "token", 2.0, lower=0.5)
    assert torch.allclose(_rc("icepop", log_ratio, mask), icepop) and (icepop == 0).any()
    token_mis = verl_is_weights(log_ratio, mask, "token", 2.0, lower=1e-30)  # IcePop without a lower bound
    assert torch.allclose(_rc("token_mis", log_ratio, mask), token_mis)
    # Seq-MIS: sequence IS weight x rejection on the sequence ratio; streamrl's has no lower bound
    seq_is = verl_is_weights(log_ratio, mask, "sequence", 2.0)
    seq_mis = _rc("seq_mis", log_ratio, mask)
    # (verl's k1 is log(pi_rollout / pi_old): a band [0.5, 1e30] on 1 / rho is rho <= 2)
    assert torch.allclose(seq_mis, seq_is * verl_rs_keep(log_ratio, mask, "seq_sum_k1", 0.5, 1e30))
    verl_default = seq_is * verl_rs_keep(log_ratio, mask, "seq_sum_k1", 0.5, 2.0)  # also drops rho < 0.5
    assert not torch.allclose(seq_mis, verl_default)
    # Geo-RS: the geometric mean of pi_rollout / pi_old within [1 - tol, 1 + tol]
    small = log_ratio * 0.002
    geo = verl_rs_keep(small, mask, "seq_mean_k1", 0.999, 1.001)
    assert torch.equal(_rc("geo_mask", small, mask, geo_tol=0.001), geo * mask) and 0 < geo[:, 0].sum() < 6
