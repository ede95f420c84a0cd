"""Loss parameters reach every loss: decoupled PPO equals the PPO clip for every parameter combination
when pi_prox = pi_behav, each LossSpec.reads is honest, config validation refuses what a loss ignores,
and no registered loss returns a non-finite loss or gradient for log-ratios in [-1e4, 1e4]."""

import itertools
import math
from dataclasses import fields, replace

import pytest
import torch

import streamrl.algo  # noqa: F401  (registers every module)
from streamrl.algo import registry
from streamrl.algo.loss_inputs import LossParams, LossTensors
from streamrl.algo.losses import decoupled_ppo, ppo_clip
from streamrl.config import LossConfig, load_config
from streamrl.config_algo import CORRECTION_KEYS, LOSS_KEYS
from streamrl.config_parse import ConfigError
from streamrl.presets import names
from streamrl.trainer.objective import loss_params

# Values of each LossParams field to combine (the first is the default). A field added to LossParams
# without an entry here fails test_every_field_has_values, so the grid below always covers all of them.
VALUES = {
    "eps_low": [0.2, 0.1],
    "eps_high": [0.28, 0.05],
    "dual_clip": [0.0, 1.5, 3.0],
    "behav_weight_cap": [0.0, 1.0, 2.0],
    "m2_threshold": [0.04, 1.0],
}
# A non-default value of each field that changes the output of every loss reading it (on BATCH below).
PROBE = {"eps_low": 0.05, "eps_high": 0.05, "dual_clip": 1.5, "behav_weight_cap": 1.2, "m2_threshold": 0.5}


def test_every_field_has_values():
    names = {f.name for f in fields(LossParams)}
    assert set(VALUES) == names and set(PROBE) == names
    assert all(VALUES[f.name][0] == f.default for f in fields(LossParams))
    assert names | {"prox"} == set(LOSS_KEYS)  # validation checks every parameter a loss may read
    assert set(LOSS_KEYS + CORRECTION_KEYS) <= {f.name for f in fields(LossConfig)}


def test_trainer_passes_every_config_key_to_the_params():
    for f in fields(LossParams):
        assert getattr(loss_params(LossConfig(**{f.name: PROBE[f.name]})), f.name) == PROBE[f.name]


def _batch(seed: int = 0) -> LossTensors:
    """4 rows x 5 tokens: log-ratios around row offsets -1, -0.15, 0.15, 1 (sequence ratios inside and
    outside every clip range), advantages of both signs varying inside rows, pi_prox != pi_behav, one
    masked token."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(4, 5, generator=g) * 2 - 0.5
    offsets = torch.tensor([[-1.0], [-0.15], [0.15], [1.0]])
    log_r = offsets + 0.2 * (torch.rand(4, 5, generator=g) - 0.5)
    adv = torch.tensor([[1.0, -0.5, 2.0, -1.5, 0.7], [-1.0, -2.0, 0.5, -0.3, -1.2]]).repeat(2, 1)
    mask = torch.ones(4, 5)
    mask[1, 4] = 0.0
    prox = old + 0.5 * (torch.rand(4, 5, generator=g) - 0.2)
    return LossTensors(old + log_r, old, adv, mask, prox_logprobs=prox)


def _run(fn, t: LossTensors, p: LossParams):
    logp = t.logprobs.clone().requires_grad_(True)
    loss, metrics = fn(replace(t, logprobs=logp), p)
    (loss * t.mask).sum().backward()
    return loss.detach(), logp.grad, metrics


def test_a_dual_clip_reaches_decoupled_ppo():
    # one token: log r = 3 (r = 20.0855), A = -0.8, dual clip 3, pi_prox = pi_behav:
    # max(-A r, -A clip(r)) = 0.8 * 20.0855 = 16.0684, bounded by -c A = 2.4 under both losses
    t = LossTensors(torch.tensor([[3.0]]), torch.zeros(1, 1), torch.tensor([[-0.8]]), torch.ones(1, 1))
    p = LossParams(dual_clip=3.0)
    assert ppo_clip(t, p)[0].item() == pytest.approx(2.4)
    assert decoupled_ppo(replace(t, prox_logprobs=torch.zeros(1, 1)), p)[0].item() == pytest.approx(2.4)
    assert decoupled_ppo(replace(t, prox_logprobs=torch.zeros(1, 1)), LossParams())[0].item() == (
        pytest.approx(0.8 * math.exp(3.0), rel=1e-6)
    )


@pytest.mark.parametrize("combo", list(itertools.product(*VALUES.values())))
def test_decoupled_equals_ppo_clip_for_every_parameter_combination(combo):
    p = LossParams(**dict(zip(VALUES, combo)))
    t = _batch()
    t = replace(t, prox_logprobs=t.old_logprobs.clone())
    loss_a, grad_a, m_a = _run(ppo_clip, t, p)
    loss_b, grad_b, m_b = _run(decoupled_ppo, t, p)
    assert torch.equal(loss_a, loss_b) and torch.equal(grad_a, grad_b)
    assert {k: m_b[k] for k in m_a} == m_a and m_b["behav_weight_mean"] == 1.0


@pytest.mark.parametrize("name", sorted(registry.POLICY_LOSSES))
def test_each_loss_reads_exactly_the_params_its_spec_lists(name):
    spec = registry.POLICY_LOSSES[name]
    assert spec.reads <= {f.name for f in fields(LossParams)} | {"prox"}
    base, _, _ = _run(spec.fn, _batch(), LossParams())
    for f in fields(LossParams):
        out, _, _ = _run(spec.fn, _batch(), LossParams(**{f.name: PROBE[f.name]}))
        assert torch.equal(out, base) is (f.name not in spec.reads), (name, f.name)


SWEEP = [-1e4, -1e3, -100.0, -20.5, -10.5, -1.0, 0.0, 1.0, 10.5, 20.5, 100.0, 1e3, 1e4]


@pytest.mark.parametrize("name", sorted(registry.POLICY_LOSSES))
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_no_loss_is_non_finite_for_extreme_log_ratios(name, sign):
    n = len(SWEEP)
    log_r = torch.tensor(SWEEP)[:, None].expand(n, 4).clone()  # one row per value (a sequence ratio too)
    log_r = torch.cat([log_r, torch.tensor([[1e4, -1e4, 0.0, 50.0]])])  # and a mixed row
    old = torch.full_like(log_r, -1.0)
    adv = torch.full_like(log_r, sign)
    adv[:, 1] = -sign  # both signs inside each row
    prox = old + log_r.flip(0)  # pi_prox / pi_behav spans the sweep too
    t = LossTensors(old + log_r, old, adv, torch.ones_like(log_r), prox_logprobs=prox)
    for p in (LossParams(), LossParams(dual_clip=3.0, behav_weight_cap=2.0, m2_threshold=1e9)):
        loss, grad, metrics = _run(registry.POLICY_LOSSES[name].fn, t, p)
        assert torch.isfinite(loss).all() and torch.isfinite(grad).all(), (name, p)
        assert all(math.isfinite(v) for v in metrics.values()), (name, metrics)


@pytest.mark.parametrize("name", sorted(registry.KL_ESTIMATORS))
def test_no_kl_estimator_is_non_finite_for_extreme_log_ratios(name):
    logp = torch.tensor(SWEEP, requires_grad=True)
    kl = registry.KL_ESTIMATORS[name](logp, torch.zeros(len(SWEEP)))
    kl.sum().backward()
    assert torch.isfinite(kl).all() and torch.isfinite(logp.grad).all()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["loss.name=gspo", "loss.dual_clip=3"],
            "config key 'loss.dual_clip'=3.0 is not read by loss.name=gspo (it reads loss.eps_high, "
            "loss.eps_low): remove it, or choose a loss.name that reads it",
        ),
        (
            ["loss.name=reinforce", "loss.eps_high=0.3"],
            "config key 'loss.eps_high'=0.3 is not read by loss.name=reinforce (it reads none of them)",
        ),
        (
            ["loss.name=ppo_clip", "loss.prox=behav"],
            "config key 'loss.prox'=behav is not read by loss.name=ppo_clip",
        ),
        (
            ["loss.rollout_correction=token_tis", "loss.prox=behav"],
            "config key 'loss.prox'=behav is not read by loss.name=decoupled_ppo with "
            "loss.rollout_correction=token_tis",
        ),
        (
            ["loss.rc_lower=0.3"],
            "config key 'loss.rc_lower'=0.3 is not read by loss.rollout_correction=none (it reads none of "
            "them): remove it, or choose a loss.rollout_correction that reads it",
        ),
        (
            ["loss.rollout_correction=token_tis", "loss.rc_geo_tol=0.01"],
            "config key 'loss.rc_geo_tol'=0.01 is not read by loss.rollout_correction=token_tis "
            "(it reads loss.rc_upper)",
        ),
        (["advantage.gamma=0.9"], "config key 'advantage.gamma'=0.9 is not read by advantage.name=grpo"),
        (
            ["loss.behav_weight_cap=0.5"],
            "config key 'loss.behav_weight_cap' must be 0 (off) or >= 1, got 0.5",
        ),
        (
            ["loss.rollout_correction=icepop", "loss.rc_lower=2", "loss.rc_upper=1.5"],
            "config keys 'loss.rc_lower' and 'loss.rc_upper' must satisfy 0 <= rc_lower < rc_upper",
        ),
        (["loss.rollout_correction=nope"], "config key 'loss.rollout_correction' must be one of geo_mask"),
        (["loss.kl_estimator=k4"], "config key 'loss.kl_estimator' must be one of abs, k1, k1+, k2, k3, k3+"),
        (
            ["loss.kl_in=token_reward", "loss.kl_coef=0.1"],
            "loss.kl_in=token_reward shapes per-token rewards: it needs loss.kl_coef > 0 and a token-level "
            "advantage (advantage.name=gae or reinforce_pp_token), got grpo with kl_coef=0.1",
        ),
        (  # the ratio's old policy is then pi_prox itself: the behaviour weight is 1
            ["loss.behav_weight_cap=2", "loss.rollout_correction=token_tis"],
            "config key 'loss.behav_weight_cap'=2.0 caps pi_prox / pi_behav, which is 1 with "
            "loss.name=decoupled_ppo with loss.rollout_correction=token_tis: remove it, or use "
            "loss.prox=recompute without a rollout correction",
        ),
        (
            ["loss.behav_weight_cap=2", "loss.prox=behav"],
            "config key 'loss.behav_weight_cap'=2.0 caps pi_prox / pi_behav, which is 1 with "
            "loss.prox=behav: remove it, or use loss.prox=recompute without a rollout correction",
        ),
        (
            ["loss.vf_coef=1"],
            "config key 'loss.vf_coef'=1.0 is not read: advantage.name=grpo has no value head "
            "(advantage.name=gae); remove it",
        ),
        (
            ["advantage.name=rloo", "loss.value_clip=0.5"],
            "config key 'loss.value_clip'=0.5 is not read: advantage.name=rloo has no value head",
        ),
        (
            ["loss.kl_estimator=k1"],
            "config key 'loss.kl_estimator'=k1 is not read: loss.kl_coef=0 has no KL term (set loss.kl_coef "
            "> 0); remove it",
        ),
        (["loss.kl_in=reward"], "config key 'loss.kl_in'=reward is not read: loss.kl_coef=0 has no KL term"),
        (
            ["advantage.name=reinforce_pp", "rollout.screen_samples=2"],
            "rollout.screen_samples > 0 drops the groups whose first samples agree as having zero advantage; "
            "advantage.name=reinforce_pp gives them one",
        ),
    ],
)
def test_validation_refuses_keys_the_chosen_pieces_ignore(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert message in str(e.value)


def test_validation_accepts_keys_the_chosen_pieces_read():
    load_config(None, ["loss.name=ppo_clip", "loss.dual_clip=3"])
    load_config(None, ["loss.rollout_correction=icepop", "loss.rc_lower=0.3", "loss.rc_upper=4"])
    load_config(None, ["advantage.name=reinforce_pp_token", "advantage.gamma=0.9"])
    load_config(None, ["loss.behav_weight_cap=2"])  # decoupled_ppo against a recomputed pi_prox
    load_config(None, ["loss.kl_coef=0.1", "loss.kl_estimator=k1", "loss.kl_in=reward"])
    load_config(None, ["advantage.name=gae", "loss.name=ppo_clip", "loss.vf_coef=1", "loss.value_clip=0.5"])
    load_config(None, ["advantage.name=remax", "rollout.screen_samples=2"])  # its baseline is the group's
    load_config(
        None, ["advantage.name=gae", "loss.kl_in=token_reward", "loss.kl_coef=0.1", "loss.name=ppo_clip"]
    )
    for preset in names():  # every preset's own combination is accepted
        load_config(None, [f"algo={preset}"])


def test_a_name_registered_twice_is_refused_and_the_first_stays():
    with pytest.raises(ValueError, match="'ppo_clip' is registered twice"):
        registry.policy_loss("ppo_clip", reads=())(lambda t, p: None)
    assert registry.POLICY_LOSSES["ppo_clip"].fn is ppo_clip


def test_a_steps_ratio_extremes_are_its_micro_batches_extremes():
    """Micro-batches of 10 and 90 tokens, ratio_max 25 and 1.1: the step's ratio_max is 25 (a token-weighted
    mean of the two, 3.49, hid the explosion the diagnostics rule looks for); a micro-batch without loss
    tokens has no extreme; means stay token-weighted."""
    from streamrl.trainer.objective import HI, LO, accumulate, finish

    totals: dict = {}
    accumulate(totals, {f"{HI}ratio_max": 25.0, f"{LO}ratio_min": 0.5, "ratio_mean": 1.2}, 10)
    accumulate(totals, {f"{HI}ratio_max": 1.1, f"{LO}ratio_min": 0.9, "ratio_mean": 1.0}, 90)
    accumulate(totals, {f"{HI}ratio_max": 99.0, f"{LO}ratio_min": 0.01, "ratio_mean": 5.0}, 0)
    out = finish(totals, 100)
    assert out["ratio_max"] == 25.0 and out["ratio_min"] == 0.5
    assert out["ratio_mean"] == pytest.approx((1.2 * 10 + 1.0 * 90) / 100)


def test_a_micro_batch_without_loss_tokens_does_not_raise_the_corrections_ratio_max():
    """rho 0.90 and 0.95 in one micro-batch, none in another (every sample masked, as
    loss.mask_truncated does to the longest, which length-sorted micro-batches put together): the step's
    rc_ratio_max is 0.95, not the 1.0 an empty micro-batch used to stand for."""
    from streamrl.algo.rollout_correction import CorrectionParams
    from streamrl.trainer.objective import accumulate, finish, loss_params, policy_objective

    params = loss_params(load_config(None, []).loss)
    totals: dict = {}
    for log_rho, mask in (([math.log(0.9), math.log(0.95)], [1.0, 1.0]), ([0.0, 0.0], [0.0, 0.0])):
        lp = torch.tensor([[-1.0, -2.0]])
        _, metrics = policy_objective(
            registry.POLICY_LOSSES["decoupled_ppo"],
            registry.CORRECTIONS["none"],
            params,
            CorrectionParams(),
            logprobs=lp,
            behav=lp - torch.tensor([log_rho]),
            trainer_old=lp,
            advantages=torch.tensor([[1.0, 1.0]]),
            mask=torch.tensor([mask]),
            prox_mode="trainer",
        )
        accumulate(totals, metrics, sum(mask))
    assert finish(totals, 2)["rc_ratio_max"] == pytest.approx(0.95)


def test_the_policy_objective_reports_extremes_under_the_extreme_prefixes():
    from streamrl.algo.rollout_correction import CorrectionParams
    from streamrl.trainer.objective import HI, LO, loss_params, policy_objective

    lp = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]])
    _, metrics = policy_objective(
        registry.POLICY_LOSSES["decoupled_ppo"],
        registry.CORRECTIONS["none"],
        loss_params(load_config(None, []).loss),
        CorrectionParams(),
        logprobs=lp,
        behav=lp - torch.tensor([[0.1, -0.2], [0.0, 0.3]]),
        trainer_old=None,
        advantages=torch.ones(2, 2),
        mask=torch.ones(2, 2),
        prox_mode="behav",
    )
    assert metrics[f"{HI}ratio_max"] == pytest.approx(torch.exp(torch.tensor(0.3)).item())
    assert metrics[f"{LO}ratio_min"] == pytest.approx(torch.exp(torch.tensor(-0.2)).item())
    assert f"{HI}behav_weight_max" in metrics and "ratio_mean" in metrics
