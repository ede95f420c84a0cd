import copy

import pytest
import torch
from trajectories import make_traj

from streamrl.algo.token_weights import entropy_top_q_mask, quantile, sign_weights
from streamrl.config import load_config
from streamrl.trainer.batching import collate
from streamrl.trainer.logprobs import completion_logprobs
from streamrl.trainer.trainer import Trainer
from streamrl.types import TrainBatch


def test_entropy_top_q_keeps_the_highest_entropy_loss_tokens():
    ent = torch.tensor([[0.1, 2.0, 0.5, 9.0], [1.0, 3.0, 0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float)
    # loss-token entropies 0.1, 2.0, 0.5, 1.0, 3.0, 0.2, 0.0 (7 of them); their 0.8 quantile is
    # 1.0 + 0.8 * (2.0 - 1.0) = 1.8 (linear interpolation at rank 4.8): kept 2.0 and 3.0 only;
    # the masked 9.0 never counts
    assert entropy_top_q_mask(ent, mask, 0.2).tolist() == [[0, 1, 0, 0], [0, 1, 0, 0]]
    assert entropy_top_q_mask(ent, mask, 1.0).tolist() == mask.tolist()


def test_the_quantile_of_a_mini_batch_is_not_its_micro_batches():
    # two micro-batches of 4 loss tokens; q = 0.5 over all 8: sorted .1 .2 .3 .4 1 2 3 4, the 0.5
    # quantile at rank 3.5 is 0.4 + 0.5 * (1 - 0.4) = 0.7 (the first micro-batch alone: 0.25)
    low, high = torch.tensor([[0.1, 0.2, 0.3, 0.4]]), torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert quantile(torch.cat([low, high], 1), 0.5) == pytest.approx(0.7)
    assert entropy_top_q_mask(low, torch.ones(1, 4), 0.5).tolist() == [[0, 0, 1, 1]]
    assert quantile(torch.tensor([3.0, 1.0, 2.0]), 0.25) == pytest.approx(1.5)
    assert quantile(torch.tensor([5.0]), 0.8) == 5.0


def test_sign_weights():
    adv = torch.tensor([2.0, -1.0, 0.0])
    assert sign_weights(adv, 0.1, 1.0).tolist() == pytest.approx([0.2, -1.0, 0.0])
    assert sign_weights(adv, 0.0, 2.0).tolist() == [0.0, -2.0, 0.0]  # NSR: negatives only


def _traj(i, completion):
    return make_traj(i, [5, 6, 7], completion, logprobs=[-1.0] * len(completion))


def test_kl_in_reward_is_zero_at_the_reference_and_grows_away_from_it(tiny):
    model = copy.deepcopy(tiny[0])
    overrides = ["loss.kl_coef=0.5", "loss.kl_in=reward", "loss.kl_estimator=k1", "train.precision=fp32"]
    cfg = load_config(None, overrides)
    trainer = Trainer.from_config(model, cfg, pad_id=0)
    batch = TrainBatch([_traj(0, [8, 9]), _traj(1, [10, 11, 12])], [])
    with torch.no_grad():  # behaviour log-probs = the reference's: k1 sums to exactly 0
        for t in batch.trajectories:
            t.behaviour_logprobs = completion_logprobs(model, collate([t], [0.0], 0))[0][0].tolist()
    assert trainer.kl_reward_penalty(batch) == pytest.approx([0.0, 0.0], abs=1e-5)
    for t in batch.trajectories:  # behaviour 0.3 nats more likely per token than the reference
        t.behaviour_logprobs = [lp + 0.3 for lp in t.behaviour_logprobs]
    assert trainer.kl_reward_penalty(batch) == pytest.approx([0.5 * 0.3 * 2, 0.5 * 0.3 * 3], abs=1e-5)


@pytest.mark.parametrize("coef", [1.0, -1.0])
def test_entropy_bonus_raises_entropy_and_a_negative_one_lowers_it(tiny, coef):
    model = copy.deepcopy(tiny[0])
    cfg = load_config(None, [f"loss.entropy_coef={coef}", "train.lr=1e-4", "loss.name=ppo_clip"])
    trainer = Trainer.from_config(model, cfg, pad_id=0)
    t = _traj(0, [8, 9, 10])
    mb = collate([t], [0.0], 0)
    with torch.no_grad():
        before = completion_logprobs(model, mb, return_entropy=True)[1].mean().item()
        t.behaviour_logprobs = completion_logprobs(model, mb)[0][0].tolist()
    trainer.step(TrainBatch([t], [0.0]))  # zero advantage: only the entropy term pushes
    with torch.no_grad():
        after = completion_logprobs(model, mb, return_entropy=True)[1].mean().item()
    assert (after - before) * coef > 0
