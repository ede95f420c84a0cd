"""Token selections over a whole mini-batch (trainer/mini_batch_cuts.py): the same update from one
micro-batch as from several; a sequence's statistics count all its tokens, trained on or not; the
learning-rate warmup counts optimizer steps."""

import copy

import pytest
from trajectories import random_batch

from streamrl.config import load_config
from streamrl.config_parse import ConfigError
from streamrl.trainer.trainer import Trainer
from streamrl.types import TrainBatch


def _batch(n: int, seed: int, spread: float = 4.0) -> TrainBatch:
    """n ragged trajectories: behaviour log-probs uniform in [-spread, 0] (the tiny model's are about
    -5.3)."""
    return random_batch(n, seed, completion_lens=(2, 8), logprob_spread=spread)


def _trainer(model, overrides):
    base = ["model=tiny-random", "train.lr=1e-3", "train.precision=fp32"]
    return Trainer.from_config(copy.deepcopy(model), load_config(None, base + overrides), pad_id=0)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["loss.entropy_top_q=0.3"], "entropy_mask_kept_frac"),
        (["loss.name=m2po", "loss.m2_threshold=5.0"], "m2_masked_frac"),
    ],
    ids=["entropy_top_q", "m2po"],
)
def test_one_micro_batch_or_several_select_the_same_tokens_and_train_alike(tiny, overrides, key):
    """train.token_budget splits a mini-batch into micro-batches sorted by length: the entropy
    quantile and M2PO's cut are still those of the whole mini-batch."""
    whole = _trainer(tiny[0], [*overrides, "train.token_budget=100000"])
    split = _trainer(tiny[0], [*overrides, "train.token_budget=40"])
    for seed in (0, 1):  # two steps: the second starts from weights the first changed
        batch = _batch(12, seed)
        m1, m2 = whole.step(batch), split.step(batch)
        assert m1["micro_batches"] == 1 and m2["micro_batches"] >= 3
        assert 0.05 < m1[key] < 0.95  # some tokens kept, some not
        assert m2[key] == pytest.approx(m1[key], abs=1e-6)
    s1, s2 = whole.policy_state(), split.policy_state()
    assert max(float((s1[n] - s2[n]).abs().max()) for n in s1) < 1e-5


def test_a_sequence_ratio_counts_the_tokens_entropy_top_q_leaves_out(tiny):
    """seq_tis weighs a sequence by the product of all its tokens' ratios, whichever of them the
    entropy selection trains on: its statistics are those of the run without the selection."""
    batch = _batch(6, 2, spread=12.0)  # sequence ratios on both sides of rc_upper
    out = [
        _trainer(tiny[0], ["loss.rollout_correction=seq_tis", f"loss.entropy_top_q={q}"]).step(batch)
        for q in (1.0, 0.3)
    ]
    assert out[1]["entropy_mask_kept_frac"] < 0.5
    for k in ("rc_ratio_mean", "rc_ratio_max", "rc_seq_truncated_frac", "rc_token_truncated_frac"):
        assert out[1][k] == pytest.approx(out[0][k], rel=1e-6), k
    assert 0 < out[0]["rc_seq_truncated_frac"] < 1


def test_the_warmup_counts_optimizer_steps(tiny):
    trainer = _trainer(tiny[0], ["train.warmup_steps=4", "train.mini_batches=2", "train.token_budget=40"])
    lrs = []
    trainer.optimizer.register_step_pre_hook(lambda opt, a, k: lrs.append(opt.param_groups[0]["lr"]))
    logged = []
    for seed in (0, 1):
        out = trainer.step(_batch(6, seed))
        assert out["optimizer_steps"] == 2
        logged.append(out["lr"])
    assert lrs == pytest.approx([0.25e-3, 0.5e-3, 0.75e-3, 1e-3])
    assert logged == pytest.approx([0.375e-3, 0.875e-3])  # each step's metric: the rates its updates used


def test_entropy_top_q_is_refused_with_a_sequence_ratio():
    """GSPO's ratio is one per sequence and its gradient reaches every token: a token selection would
    only weigh sequences. Refused in one line; gspo_token keeps per-token gradients."""
    with pytest.raises(ConfigError) as e:
        load_config(None, ["loss.name=gspo", "loss.entropy_top_q=0.2"])
    assert str(e.value) == (
        "config key 'loss.entropy_top_q' selects tokens, but loss.name=gspo trains on each sequence's "
        "ratio, whose gradient reaches all its tokens: use loss.name=gspo_token, or loss.entropy_top_q=1"
    )
    load_config(None, ["loss.name=gspo_token", "loss.entropy_top_q=0.2"])


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_a_token_selection_trains_the_policy_term_only_and_keeps_every_tokens_place(tiny, aggregation):
    """With entropy_top_q the policy term trains on the selected tokens; the entropy bonus still
    regularises every token, each in its place: with zero advantages (no policy term) the loss is
    -entropy_coef times the entropy aggregated over all tokens, whichever tokens are selected."""
    keys = [f"loss.aggregation={aggregation}", "loss.entropy_coef=0.01", "train.token_budget=4096"]
    batch = _batch(6, 3)
    batch.advantages = [0.0] * 6
    out = {q: _trainer(tiny[0], [*keys, f"loss.entropy_top_q={q}"]).step(batch) for q in (1.0, 0.3)}
    assert out[0.3]["entropy_mask_kept_frac"] < 0.5
    assert out[0.3]["loss"] == pytest.approx(out[1.0]["loss"], rel=1e-6, abs=1e-9)
    if aggregation == "token-mean":  # one micro-batch: the loss is -0.01 x the mean entropy
        assert out[0.3]["loss"] == pytest.approx(-0.01 * out[0.3]["entropy"], rel=1e-5)
    # with advantages and no entropy term, the unselected tokens' policy terms are left out (not 0 x)
    batch = _batch(6, 3)
    keys = [f"loss.aggregation={aggregation}", "train.token_budget=4096"]
    plain = {q: _trainer(tiny[0], [*keys, f"loss.entropy_top_q={q}"]).step(batch)["loss"] for q in (1.0, 0.3)}
    assert abs(plain[0.3] - plain[1.0]) > 1e-3 * abs(plain[1.0])
