"""PPO critic: value head positions, GAE advantages through the trainer, and the value head learning."""

import copy

import pytest
import torch
from trajectories import make_traj

from streamrl.algo.advantages_token import terminal_rewards
from streamrl.config import load_config
from streamrl.trainer.batching import collate
from streamrl.trainer.critic import ValueHead, clipped_value_loss, completion_values, gae_targets
from streamrl.trainer.logprobs import completion_logprobs
from streamrl.trainer.trainer import Trainer
from streamrl.types import TrainBatch

GAE = ["advantage.name=gae", "loss.name=ppo_clip", "loss.eps_high=0.2"]


def _traj(i, prompt, completion, reward=0.0, loss_mask=None):
    return make_traj(i, prompt, completion, reward=reward, loss_mask=loss_mask)


def _on_policy(model, trajs):
    with torch.no_grad():
        for t in trajs:
            t.behaviour_logprobs = completion_logprobs(model, collate([t], [0.0], 0))[0][0].tolist()


def test_terminal_rewards_on_last_loss_token():
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]], dtype=torch.float)
    out = terminal_rewards(mask, torch.tensor([2.0, -1.0, 5.0]))
    assert out.tolist() == [[0, 2, 0, 0], [0, 0, -1, 0], [0, 0, 0, 0]]


def test_clipped_value_loss_hand_values():
    v = torch.tensor([[0.5, 0.1]])
    loss, clipped = clipped_value_loss(v, torch.zeros(1, 2), torch.ones(1, 2), clip=0.2)
    # V=0.5 is clipped to 0.2: max((0.5-1)^2, (0.2-1)^2) = 0.64; V=0.1 is inside: (0.1-1)^2 = 0.81
    assert loss[0].tolist() == pytest.approx([0.32, 0.405])
    assert clipped.tolist() == [[1.0, 0.0]]


def test_gae_targets_hand_values_with_a_constant_value_head(tiny):
    head = ValueHead(tiny[0].config.hidden_size)
    torch.nn.init.constant_(head.linear.bias, 0.5)  # V = 0.5 on every token
    trajs = [_traj(0, [5, 6, 7], [8, 9, 10]), _traj(1, [5], [11, 12, 13, 14], loss_mask=[1, 0, 1, 0])]
    mb = collate(trajs, [0.0, 0.0], pad_id=0)
    tg = gae_targets(tiny[0], head, mb, terminal_rewards(mb.loss_mask, torch.tensor([1.0, -1.0])), 0.9, 0.5)
    # delta_t = r_t + 0.9 V_next - V_t, A_t = delta_t + 0.9 * 0.5 A_next (next: the next loss token)
    # row 0: A_2 = 1 - 0.5 = 0.5; A_1 = (0.45 - 0.5) + 0.45 * 0.5 = 0.175; A_0 = -0.05 + 0.45 * 0.175
    # row 1 (tokens 0 and 2 trained): A_2 = -1 - 0.5 = -1.5; A_0 = -0.05 + 0.45 * -1.5 = -0.725
    assert torch.allclose(tg.advantages, torch.tensor([[0.02875, 0.175, 0.5, 0.0], [-0.725, 0.0, -1.5, 0.0]]))
    # R = A + V_old on loss tokens, and R = V_old = 0 off the loss mask
    assert torch.allclose(tg.returns, torch.tensor([[0.52875, 0.675, 1.0, 0.0], [-0.225, 0.0, -1.0, 0.0]]))
    assert tg.old_values.tolist() == [[0.5, 0.5, 0.5, 0.0], [0.5, 0.0, 0.5, 0.0]]


def test_padded_values_equal_single_row_values(tiny):
    model, _ = tiny
    torch.manual_seed(0)
    head = ValueHead(model.config.hidden_size)
    torch.nn.init.normal_(head.linear.weight)
    torch.nn.init.normal_(head.linear.bias)
    trajs = [_traj(0, [5, 6, 7, 8], [9, 10]), _traj(1, [11], [12, 13, 14, 15])]
    with torch.no_grad():
        both = completion_values(model, head, collate(trajs, [0.0, 0.0], pad_id=0))
        assert both.shape == (2, 4)
        for i, t in enumerate(trajs):
            alone = completion_values(model, head, collate([t], [0.0], pad_id=0))[0]
            assert torch.allclose(both[i, : len(t.completion_ids)], alone, atol=1e-5)
            # the value of completion token j is read at position P - 1 + j of the unpadded sequence
            ids = torch.tensor([t.prompt_ids + t.completion_ids])
            h = model(ids, output_hidden_states=True).hidden_states[-1][0]
            p = len(t.prompt_ids)
            assert torch.allclose(alone, head(h[p - 1 : p - 1 + len(t.completion_ids)]), atol=1e-5)
    assert both[0].abs().sum() > 0


def test_zero_head_gae_advantage_is_the_reward_on_every_loss_token(tiny):
    model = copy.deepcopy(tiny[0])
    cfg = load_config(None, [*GAE, "train.token_budget=12"])
    trainer = Trainer.from_config(model, cfg, pad_id=0)
    trajs = [
        _traj(0, [5, 6, 7], [8, 9, 10], reward=1.0),
        _traj(1, [5, 6], [11, 12, 13, 14], reward=-0.5, loss_mask=[1, 0, 1, 0]),
        _traj(2, [4], [20], reward=2.0),
    ]
    batch = TrainBatch(trajs, [9.0, 9.0, 9.0])  # per-trajectory advantages are ignored with gae
    mbs, targets = trainer.prepare(batch)
    assert len(mbs) == 2
    expected = {
        (8, 9, 10): [1.0, 1.0, 1.0],
        (11, 12, 13, 14): [-0.5, 0.0, -0.5, 0.0],
        (20,): [2.0],
    }
    seen = 0
    for mb, tg in zip(mbs, targets):
        assert tg is not None and (tg.old_values == 0).all()
        for row in range(mb.advantages.shape[0]):
            n = int((mb.completion_ids[row] != 0).sum())
            key = tuple(mb.completion_ids[row, :n].tolist())
            want = expected[key] + [0.0] * (mb.advantages.shape[1] - n)  # 0 on padding
            assert mb.advantages[row].tolist() == pytest.approx(want)
            assert tg.returns[row].tolist() == pytest.approx(want)  # R = A + V_old, V_old = 0
            seen += 1
    assert seen == 3
    # the same advantages reach the loss in step(): token mean (3 * 1 - 2 * 0.5 + 2) / 6 loss tokens
    m = trainer.step(batch)
    assert m["gae_advantage_mean"] == pytest.approx(4.0 / 6.0)
    assert m["value_mean"] == pytest.approx(0.0, abs=1e-6)
    assert m["return_mean"] == pytest.approx(4.0 / 6.0)
    # value loss 0.5 * R^2 per loss token: (3 * 0.5 + 2 * 0.125 + 2.0) / 6
    assert m["value_loss"] == pytest.approx(3.75 / 6.0)
    # batch.rewards (e.g. after a KL penalty) take precedence over the trajectories' own rewards
    # (one token, gamma = lam = 1: A = R - V_old)
    mbs, targets = trainer.prepare(TrainBatch(trajs[2:], [0.0], rewards=[3.0]))
    assert targets[0].old_values[0, 0].item() != 0  # the head moved in the step
    assert mbs[0].advantages[0, 0].item() + targets[0].old_values[0, 0].item() == pytest.approx(3.0)


def test_value_head_learns(tiny):
    model = copy.deepcopy(tiny[0])
    cfg = load_config(None, [*GAE, "train.lr=1e-2"])
    trainer = Trainer.from_config(model, cfg, pad_id=0)
    trajs = [_traj(0, [5, 6, 7], [8, 9, 10, 11], reward=1.0), _traj(1, [5, 6, 7], [12, 13, 14], reward=0.0)]
    losses = []
    for _ in range(25):
        _on_policy(model, trajs)
        losses.append(trainer.step(TrainBatch(trajs, [0.0, 0.0]))["value_loss"])
    assert losses[0] == pytest.approx(0.5 * 4 / 7)  # V = 0: 0.5 * R^2 on 4 of the 7 loss tokens
    assert losses[-1] < 0.5 * losses[0]


def test_value_head_saved_and_restored(tiny, tmp_path):
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    trainer = Trainer.from_config(model, load_config(None, GAE), pad_id=0)
    assert trainer.value_head is not None
    torch.nn.init.normal_(trainer.value_head.linear.weight)
    trainer.save(str(tmp_path), tok)
    other = Trainer.from_config(copy.deepcopy(tiny[0]), load_config(None, GAE), pad_id=0)
    other.load_value_head(tmp_path)
    assert torch.equal(other.value_head.linear.weight, trainer.value_head.linear.weight)
    assert Trainer.from_config(copy.deepcopy(tiny[0]), load_config(None), pad_id=0).value_head is None
