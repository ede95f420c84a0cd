"""train.packing: packed rows give the padded path's log-probs, loss and gradients, with less padding."""

import copy

import pytest
import torch
from trajectories import make_traj, random_batch

from streamrl.config import load_config
from streamrl.trainer.batching import collate
from streamrl.trainer.logprobs import completion_forward
from streamrl.trainer.packing import collate_packed, pack_by_token_budget
from streamrl.trainer.trainer import Trainer
from streamrl.types import TrainBatch


def _ragged(n: int, seed: int) -> TrainBatch:
    """Prompts of 2..15 and completions of 1..19 tokens: padding-heavy when padded."""
    return random_batch(n, seed, prompt_lens=(2, 16), completion_lens=(1, 20))


def test_pack_by_token_budget_fills_rows_first_fit_decreasing():
    assert pack_by_token_budget([5, 3, 8, 2, 10], budget=10) == [[4], [2, 3], [0, 1]]
    lengths = [7, 1, 9, 4, 4, 3, 10, 2]
    bins = pack_by_token_budget(lengths, budget=10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    assert len(bins) == 4  # total 40 tokens in 4 full rows: no waste


def test_collate_packed_layout():
    mb = collate_packed(
        [make_traj(0, [5, 6, 7], [8, 9]), make_traj(1, [4], [3, 2, 1])], [1.0, -1.0], pad_id=0
    )
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 9, 4, 3, 2, 1]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
    assert mb.attention_mask is None
    assert mb.packed_index.tolist() == [[2, 3, 0], [5, 6, 7]]  # row position predicting each token
    assert mb.completion_ids.tolist() == [[8, 9, 0], [3, 2, 1]]
    assert mb.loss_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert mb.num_tokens == 9


def test_packed_logprobs_equal_padded_and_no_attention_crosses_sequences(tiny):
    model, _ = tiny
    batch = _ragged(6, 0)
    trajs = batch.trajectories
    padded = collate(trajs, [0.0] * 6, pad_id=0)
    packed = collate_packed(trajs, [0.0] * 6, pad_id=0)
    with torch.no_grad():
        lp_pad, ent_pad, h_pad = completion_forward(model, padded, 0.7, True, return_hidden=True)
        lp_pack, ent_pack, h_pack = completion_forward(model, packed, 0.7, True, return_hidden=True)
        mask = padded.loss_mask.bool()
        assert (lp_pack - lp_pad)[mask].abs().max() < 1e-5
        assert (ent_pack - ent_pad)[mask].abs().max() < 1e-5
        assert (h_pack - h_pad)[mask].abs().max() < 1e-5
        # control: the same row with positions running on (no restarts) is read as ONE sequence, and
        # later trajectories then attend to earlier ones: their log-probs change
        joined = copy.copy(packed)
        joined.position_ids = torch.arange(packed.input_ids.shape[1])[None]
        lp_joined, _, _ = completion_forward(model, joined, 0.7)
        assert (lp_joined - lp_pad)[1:][mask[1:]].abs().max() > 1e-3


def _snap_grads(trainer, store):
    trainer.optimizer.register_step_pre_hook(
        lambda opt, a, kw: store.append([p.grad.clone() for p in trainer.params])
    )


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_packed_step_equals_padded_step_with_less_padding(tiny, aggregation, capsys):
    batch = _ragged(12, 1)
    base = ["train.lr=1e-3", "train.token_budget=96", f"loss.aggregation={aggregation}"]
    base.append("train.precision=fp32")  # exact equivalence: fp32 (bf16 autocast rounds differently)
    padded = Trainer.from_config(copy.deepcopy(tiny[0]), load_config(None, base), pad_id=0)
    packed = Trainer.from_config(
        copy.deepcopy(tiny[0]), load_config(None, base + ["train.packing=true"]), pad_id=0
    )
    g_pad, g_pack = [], []
    _snap_grads(padded, g_pad)
    _snap_grads(packed, g_pack)
    m_pad, m_pack = padded.step(batch), packed.step(batch)
    for k in ("loss", "grad_norm", "entropy", "behav_logprob_gap", "clip_frac"):
        if k in m_pad:
            assert m_pack[k] == pytest.approx(m_pad[k], rel=1e-5, abs=1e-6), k
    grad_diff = max(float((a - b).abs().max()) for a, b in zip(g_pad[0], g_pack[0]))
    assert grad_diff < 1e-5
    assert m_pack["tokens_trained"] == m_pad["tokens_trained"]
    assert m_pack["padding_frac"] < 0.05 < m_pad["padding_frac"]
    with capsys.disabled():
        print(
            f"\n{aggregation}: padding fraction padded {m_pad['padding_frac']:.3f} "
            f"({m_pad['padded_tokens']} tokens, {m_pad['micro_batches']} micro-batches) -> packed "
            f"{m_pack['padding_frac']:.3f} ({m_pack['padded_tokens']} tokens, "
            f"{m_pack['micro_batches']} rows); "
            f"max grad diff {grad_diff:.2e}, loss {m_pad['loss']:.6g} vs {m_pack['loss']:.6g}"
        )
