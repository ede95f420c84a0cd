import copy

import pytest
import torch
from trajectories import make_traj

from streamrl.config import load_config
from streamrl.trainer.batching import collate, split_by_token_budget
from streamrl.trainer.logprobs import completion_logprobs
from streamrl.trainer.trainer import Trainer
from streamrl.types import TrainBatch


def _traj(i, prompt, completion, logprobs=None):
    return make_traj(i, prompt, completion, logprobs=logprobs)


def test_split_by_token_budget_covers_every_sample_once_within_budget():
    lengths = [(5, 3), (20, 10), (7, 1), (2, 2), (30, 30), (8, 8), (1, 1)]
    batches = split_by_token_budget(lengths, budget=64)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    for b in batches:
        padded = len(b) * (max(lengths[i][0] for i in b) + max(lengths[i][1] for i in b))
        assert padded <= 64


def test_an_empty_completion_is_padded_to_one_column():
    # collate gives every row at least one completion column: two 32-token prompts with empty
    # completions take 2 x 33 tokens, over a budget of 64, so they go into two micro-batches
    assert split_by_token_budget([(32, 0), (32, 0)], budget=64) == [[0], [1]]
    assert split_by_token_budget([(31, 0), (31, 0)], budget=64) == [[0, 1]]


def test_collate_layout():
    mb = collate([_traj(0, [5, 6, 7], [8, 9]), _traj(1, [4], [3, 2, 1])], [1.0, -1.0], pad_id=0)
    assert mb.prompt_width == 3
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 9, 0], [0, 0, 4, 3, 2, 1]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 4], [0, 0, 0, 1, 2, 3]]
    assert mb.loss_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert mb.advantages.tolist() == [[1, 1, 1], [-1, -1, -1]]


def test_padded_logprobs_equal_unpadded_forward(tiny):
    model, _ = tiny
    trajs = [_traj(0, [5, 6, 7, 8], [9, 10]), _traj(1, [11], [12, 13, 14, 15]), _traj(2, [3, 4], [20])]
    mb = collate(trajs, [0.0] * 3, pad_id=0)
    with torch.no_grad():
        lp, ent = completion_logprobs(model, mb, temperature=0.5, return_entropy=True)
        for i, t in enumerate(trajs):
            ids = torch.tensor([t.prompt_ids + t.completion_ids])
            logits = model(ids).logits[0, len(t.prompt_ids) - 1 : -1] / 0.5
            ref = (
                torch.log_softmax(logits, -1).gather(-1, torch.tensor(t.completion_ids)[:, None]).squeeze(-1)
            )
            assert torch.allclose(lp[i, : len(t.completion_ids)], ref, atol=1e-5)
    assert ent.shape == lp.shape and (ent >= 0).all()


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_step_moves_logprob_in_the_sign_of_the_advantage(tiny, advantage):
    model = copy.deepcopy(tiny[0])
    overrides = ["train.lr=1e-3", "rollout.temperature=1.0", "train.token_budget=8"]
    cfg = load_config(None, [*overrides, "train.shared_prompt=false"])  # the padded budget split
    trainer = Trainer.from_config(model, cfg, pad_id=0)
    trajs = [_traj(0, [5, 6, 7], [8, 9, 10]), _traj(1, [5, 6, 7], [8, 9, 10])]
    with torch.no_grad():  # on-policy: behaviour log-probs are the current ones
        for t in trajs:
            t.behaviour_logprobs = completion_logprobs(model, collate([t], [0.0], 0))[0][0].tolist()
    before = sum(trajs[0].behaviour_logprobs)
    m = trainer.step(TrainBatch(trajs, [advantage, advantage]))
    assert m["micro_batches"] == 2  # 2 rows x 6 tokens > 8: one micro-batch each
    assert trainer.version == 1
    with torch.no_grad():
        after = completion_logprobs(model, collate([trajs[0]], [0.0], 0))[0].sum().item()
    assert (after - before) * advantage > 0
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and m["grad_norm"] > 0


def test_zero_advantages_leave_weights_unchanged(tiny):
    model, _ = tiny
    model = copy.deepcopy(model)
    w0 = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer.from_config(model, load_config(None, ["train.lr=1e-2"]), pad_id=0)
    trainer.step(TrainBatch([_traj(0, [5, 6], [7, 8])], [0.0]))
    assert all(torch.equal(a, b) for a, b in zip(w0, model.parameters()))


def _groups_of(seed: int, groups: int, size: int, max_prompt: int, max_completion: int) -> TrainBatch:
    """`groups` prompts of 2..max_prompt tokens, each with `size` completions of 0..max_completion."""
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for k in range(groups):
        p = torch.randint(3, 200, (int(torch.randint(2, max_prompt + 1, (1,), generator=g)),), generator=g)
        for j in range(size):
            n = int(torch.randint(0, max_completion + 1, (1,), generator=g))
            trajs.append(_traj(k * size + j, p.tolist(), torch.randint(3, 200, (n,), generator=g).tolist()))
    return TrainBatch(trajs, [1.0] * len(trajs))


@pytest.mark.parametrize(
    "layout", [["train.shared_prompt=false"], ["train.packing=true"], ["train.shared_prompt=true"]]
)
def test_no_micro_batch_exceeds_the_token_budget(tiny, layout):
    cfg = load_config(None, ["train.token_budget=64", *layout])
    trainer = Trainer.from_config(copy.deepcopy(tiny[0]), cfg, pad_id=0)
    for seed in range(20):  # samples of up to 40 + 23 tokens: each fits alone, many do not together
        batch = _groups_of(seed, groups=4, size=4, max_prompt=40, max_completion=23)
        mbs = trainer.prepare(batch)[0]
        assert max(mb.num_tokens for mb in mbs) <= 64
        assert sum(mb.completion_ids.shape[0] for mb in mbs) == len(batch.trajectories)
    # a group sharing a 60-token prompt (every layout applies, shared prompts included), one sample
    # of which is 60 + 5 tokens
    too_long = TrainBatch([_traj(i, list(range(3, 63)), [7] * n) for i, n in enumerate([3, 5])], [1.0, 1.0])
    with pytest.raises(ValueError) as e:
        trainer.prepare(too_long)[0]
    assert str(e.value) == (
        "a sample of 65 tokens (prompt + completion) is longer than train.token_budget=64, so no micro-batch "
        "can hold it: raise train.token_budget, or lower task_config.max_prompt_tokens or "
        "rollout.max_new_tokens"
    )


@pytest.mark.parametrize("prox", ["recompute", "behav"])
def test_the_boundary_runs_before_each_micro_batch_and_each_layers_forward_and_backward(tiny, prox):
    """Elastic cores re-size the trainer's threads at its boundaries: before every micro-batch, and
    before every decoder layer's forward (log-prob passes included) and backward."""
    cfg = load_config(None, ["train.token_budget=16", "train.shared_prompt=false", f"loss.prox={prox}"])
    trainer = Trainer.from_config(copy.deepcopy(tiny[0]), cfg, pad_id=0)
    layers = trainer.model.config.num_hidden_layers
    forwards: list[bool] = []  # one entry per model forward: with grad?
    trainer.model.register_forward_pre_hook(lambda m, a: forwards.append(torch.is_grad_enabled()))
    calls: list[int] = []
    trainer.set_boundary(lambda: calls.append(1))
    batch = TrainBatch([_traj(i, [5, 6, 7], [8 + i, 9, 10][: 1 + i % 3]) for i in range(6)], [1.0, -1.0] * 3)
    mbs = len(trainer.prepare(batch)[0])
    trainer.step(batch)
    backwards = sum(forwards)  # every forward with grad is followed by one backward
    assert mbs >= 2 and backwards == mbs
    assert len(calls) == mbs + layers * len(forwards) + layers * backwards
    trainer.set_boundary(None)  # removed: the hooks no longer call it
    calls.clear()
    trainer.step(batch)
    assert calls == []
