"""Rollout corrections by hand: each mode's weights on one batch, the metrics, how the trainer combines a
correction with a loss, and a trainer step whose engine log-probs are off by a known factor."""

import copy
import math

import pytest
import torch
from trajectories import make_traj

import streamrl.algo  # noqa: F401  (registers every module)
from streamrl.algo import registry
from streamrl.algo.loss_inputs import LossParams
from streamrl.algo.rollout_correction import CorrectionParams, correction_counts, correction_metrics
from streamrl.config import load_config
from streamrl.trainer.batching import collate
from streamrl.trainer.logprobs import completion_logprobs
from streamrl.trainer.objective import accumulate, finish, policy_objective
from streamrl.trainer.trainer import Trainer
from streamrl.types import TrainBatch

# rho = pi_old / pi_behav per token: row 0 [3, 0.4, 1]; row 1 [1.5, 0.5] and a pad whose rho (100) is
# never counted. Sequence products: row 0 3 * 0.4 * 1 = 1.2, row 1 1.5 * 0.5 = 0.75;
# geometric means of 1 / rho: 1.2^(-1/3) = 0.941036 and 0.75^(-1/2) = 1.154701.
LOG_RHO = torch.tensor([[3.0, 0.4, 1.0], [1.5, 0.5, 100.0]]).log()
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADV = torch.tensor([[1.0], [-1.0]]).expand(2, 3)


def weights(name: str, adv: torch.Tensor = ADV, **kw: float) -> list[list[float]]:
    c = registry.CORRECTIONS[name].fn(LOG_RHO, MASK, adv, CorrectionParams(**kw))
    return (c.weight * MASK).tolist()  # the pad's weight is never read


def close(actual: list, want: list) -> None:
    torch.testing.assert_close(torch.tensor(actual), torch.tensor(want), atol=1e-5, rtol=0)


def test_registered_modes():
    assert set(registry.CORRECTIONS) == {
        "none", "token_tis", "seq_tis", "token_mis", "seq_mis", "geo_mask", "icepop", "opsm"
    }  # fmt: skip
    close(weights("none"), [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_token_tis_caps_each_token_ratio():
    # min(rho, 2): 3 -> 2, the rest unchanged
    close(weights("token_tis", upper=2.0), [[2.0, 0.4, 1.0], [1.5, 0.5, 0.0]])


def test_seq_tis_caps_the_sequence_product():
    close(weights("seq_tis", upper=2.0), [[1.2, 1.2, 1.2], [0.75, 0.75, 0.0]])
    close(weights("seq_tis", upper=1.0), [[1.0, 1.0, 1.0], [0.75, 0.75, 0.0]])  # 1.2 capped at 1


def test_token_mis_drops_tokens_above_the_bound():
    close(weights("token_mis", upper=2.0), [[0.0, 0.4, 1.0], [1.5, 0.5, 0.0]])  # 3 > 2: dropped


def test_seq_mis_drops_sequences_above_the_bound():
    close(weights("seq_mis", upper=1.0), [[0.0, 0.0, 0.0], [0.75, 0.75, 0.0]])  # 1.2 > 1: dropped
    close(weights("seq_mis", upper=2.0), [[1.2, 1.2, 1.2], [0.75, 0.75, 0.0]])


def test_geo_mask_keeps_sequences_whose_geometric_mean_is_near_one():
    # tol 0.1: 0.941036 in [0.9, 1.1] kept with weight 1; 1.154701 dropped; tol 0.05: both out
    close(weights("geo_mask", geo_tol=0.1), [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    close(weights("geo_mask", geo_tol=0.05), [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_icepop_keeps_the_ratio_inside_the_band_and_drops_the_rest():
    # band [0.5, 2]: 3 and 0.4 dropped, 1, 1.5 and 0.5 (the bound itself) kept with their ratio
    close(weights("icepop", lower=0.5, upper=2.0), [[0.0, 0.0, 1.0], [1.5, 0.5, 0.0]])


def test_opsm_drops_negative_sequences_the_trainer_finds_unlikely():
    # mean log(pi_behav / pi_old): row 0 -(ln 3 + ln 0.4) / 3 = -0.060774; row 1 -(ln 1.5 + ln 0.5) / 2
    # = 0.143841 > delta 0.1 and A < 0: dropped. Row 0 stays even with A < 0 (-0.06 < 0.1).
    close(weights("opsm", opsm_delta=0.1), [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    close(weights("opsm", -ADV.abs(), opsm_delta=0.1), [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    close(weights("opsm", ADV.abs(), opsm_delta=0.1), [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # A > 0: kept
    close(weights("opsm", opsm_delta=0.2), [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_metrics_count_loss_tokens_and_sequences_only():
    c = registry.CORRECTIONS["token_tis"].fn(LOG_RHO, MASK, ADV, CorrectionParams(upper=2.0))
    counts = correction_counts(c, LOG_RHO, MASK)
    assert counts == pytest.approx(
        {
            "tokens": 5.0,
            "seqs": 2.0,
            "tokens_dropped": 0.0,
            "seqs_dropped": 0.0,
            "tokens_truncated": 1.0,  # the pad's 100 > 2 is not counted
            "seqs_truncated": 1.0,
            "ratio_sum": 6.4,  # 3 + 0.4 + 1 + 1.5 + 0.5
            "ratio_max": 3.0,
        }
    )
    c = registry.CORRECTIONS["icepop"].fn(LOG_RHO, MASK, ADV, CorrectionParams())
    m = correction_metrics(correction_counts(c, LOG_RHO, MASK))
    assert m == pytest.approx(
        {
            "rc_token_masked_frac": 2 / 5,
            "rc_seq_masked_frac": 1 / 2,
            "rc_token_truncated_frac": 0.0,
            "rc_seq_truncated_frac": 0.0,
            "rc_ratio_mean": 1.28,
            "rc_ratio_max": 3.0,
        }
    )


def test_counts_add_up_across_micro_batches_and_maxima_stay_maxima():
    totals: dict[str, float] = {}
    for rows in (slice(0, 1), slice(1, 2)):
        c = registry.CORRECTIONS["icepop"].fn(LOG_RHO[rows], MASK[rows], ADV[rows], CorrectionParams())
        counts = correction_counts(c, LOG_RHO[rows], MASK[rows])
        accumulate(
            totals, {("_max/" if k == "ratio_max" else "_sum/") + k: v for k, v in counts.items()}, 1.0
        )
    m = finish(totals, 5.0)
    assert m["rc_token_masked_frac"] == pytest.approx(0.4) and m["rc_seq_masked_frac"] == 0.5
    assert m["rc_ratio_max"] == pytest.approx(3.0) and m["rc_ratio_mean"] == pytest.approx(1.28)


def _objective(correction: str, loss: str = "ppo_clip", **kw):
    """logprobs = trainer_old + log 1.1 (r = 1.1, inside the clip), A = +1, behav = trainer_old - LOG_RHO."""
    old = torch.full((2, 3), -1.0)
    return policy_objective(
        registry.POLICY_LOSSES[loss],
        registry.CORRECTIONS[correction],
        LossParams(),
        CorrectionParams(**kw),
        logprobs=old + math.log(1.1),
        behav=old - LOG_RHO,
        trainer_old=old,
        advantages=torch.ones(2, 3),
        mask=MASK,
        prox_mode="recompute",
    )


def test_with_a_correction_the_loss_ratio_is_against_the_trainer_and_the_weight_multiplies():
    # token_tis: ppo_clip of r = 1.1 gives -1.1 per token, times min(rho, 2)
    per_token, metrics = _objective("token_tis", upper=2.0)
    close((per_token * MASK).tolist(), [[-2.2, -0.44, -1.1], [-1.65, -0.55, 0.0]])
    assert metrics["_sum/tokens_truncated"] == 1.0 and metrics["_max/ratio_max"] == pytest.approx(3.0)
    # decoupled PPO: its proximal policy is pi_old too, so its own weight is 1 and the correction's stands in
    dec, _ = _objective("token_tis", "decoupled_ppo", upper=2.0)
    assert torch.equal(dec * MASK, per_token * MASK)
    # without a correction the ratio is against pi_behav: r = 1.1 * rho, clipped at 1.28 above
    plain, metrics = _objective("none")
    ratio = (1.1 * LOG_RHO.exp()).clamp(max=1.28)
    close((plain * MASK).tolist(), (-ratio * MASK).tolist())
    assert metrics["_sum/ratio_sum"] == pytest.approx(6.4)  # the ratio statistics are still reported


def _trainer_step(overrides: list[str], model) -> tuple[dict[str, float], list[torch.Tensor]]:
    cfg = load_config(None, ["train.lr=1e-2", "train.precision=fp32", "rollout.temperature=1.0", *overrides])
    trainer = Trainer.from_config(model, cfg, pad_id=0)
    trajs = [make_traj(0, [5, 6, 7], [8, 9, 10]), make_traj(1, [5, 6], [11, 12])]
    with torch.no_grad():  # the engine's log-probs: the trainer's divided by 3 (rho = 3 on every token)
        for t in trajs:
            lp = completion_logprobs(model, collate([t], [0.0], 0), temperature=1.0)[0][0]
            t.behaviour_logprobs = (lp - math.log(3.0)).tolist()
    before = [p.detach().clone() for p in model.parameters()]
    return trainer.step(TrainBatch(trajs, [1.0, -1.0])), before


@pytest.mark.parametrize("mini_batches", [1, 2])
def test_trainer_icepop_drops_every_token_when_the_engine_is_off_by_three(tiny, mini_batches):
    model = copy.deepcopy(tiny[0])
    extra = [f"train.mini_batches={mini_batches}", "train.token_budget=8", "train.shared_prompt=false"]
    m, before = _trainer_step(["loss.rollout_correction=icepop", *extra], model)
    assert m["rc_token_masked_frac"] == 1.0 and m["rc_seq_masked_frac"] == 1.0
    assert m["rc_ratio_mean"] == pytest.approx(3.0, rel=1e-4) and m["rc_ratio_max"] == pytest.approx(
        3.0, rel=1e-4
    )
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # nothing was trained


def test_trainer_token_tis_truncates_and_still_trains(tiny):
    model = copy.deepcopy(tiny[0])
    m, before = _trainer_step(["loss.rollout_correction=token_tis"], model)
    assert m["rc_token_truncated_frac"] == 1.0 and m["rc_token_masked_frac"] == 0.0
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # the loss's ratio is against the trainer's
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_trainer_default_reports_ratio_statistics_ppo_kl_and_pg_clipfrac_lower(tiny):
    model = copy.deepcopy(tiny[0])
    m, _ = _trainer_step([], model)
    assert m["rc_ratio_mean"] == pytest.approx(3.0, rel=1e-4) and m["rc_token_masked_frac"] == 0.0
    assert m["behav_weight_mean"] == pytest.approx(3.0, rel=1e-4)  # decoupled PPO's own weight, unchanged
    assert m["ppo_kl"] == pytest.approx(0.0, abs=1e-6) and m["pg_clipfrac_lower"] == 0.0


def test_opsm_masks_against_the_policy_being_trained_not_the_one_before_the_step():
    """DeepSeek-V3.2's OPSM compares the engine's policy with pi_theta. Here the trainer's policy before
    the step equals the engine's (rho = 1: nothing off-policy), but after a first mini-batch pi_theta finds
    every token e^-0.5 as likely: mean log(pi_behav / pi_theta) = 0.5 > delta, so the negative sequence is
    dropped and the positive one kept; against pi_old it would have been kept."""
    old = torch.full((2, 3), -1.0)
    per_token, metrics = policy_objective(
        registry.POLICY_LOSSES["ppo_clip"],
        registry.CORRECTIONS["opsm"],
        LossParams(),
        CorrectionParams(opsm_delta=0.1),
        logprobs=old - 0.5,
        behav=old,
        trainer_old=old,
        advantages=ADV,
        mask=MASK,
        prox_mode="recompute",
    )
    assert (per_token[1] * MASK[1]).abs().sum() == 0 and (per_token[0] != 0).all()
    assert metrics["_sum/seqs_dropped"] == 1.0


def test_the_engine_gap_is_measured_on_the_weights_before_the_step_in_every_mini_batch(tiny):
    """Every engine log-prob is the trainer's minus log 3. With two mini-batches the second runs after an
    optimizer step: the gap is still log 3 (against the weights that computed the batch), not the gap
    plus the trainer's own update."""
    extra = ["train.mini_batches=2", "train.token_budget=8", "train.shared_prompt=false"]
    for loss in ([], ["loss.name=ppo_clip"]):  # the weights before the step recomputed, or not needed
        model = copy.deepcopy(tiny[0])
        m, before = _trainer_step([*extra, *loss], model)
        assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # it did train
        assert m["behav_logprob_gap"] == pytest.approx(math.log(3.0), abs=1e-5), loss
