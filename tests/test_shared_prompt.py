"""train.shared_prompt: one prompt forward per group gives the padded path's numbers with fewer tokens."""

import copy

import pytest
import torch
from trajectories import make_traj

from streamrl.config import load_config
from streamrl.models.head import check_head
from streamrl.trainer.batching import collate
from streamrl.trainer.logprobs import completion_forward
from streamrl.trainer.shared_prompt import collate_shared, shareable, split_shared
from streamrl.trainer.trainer import Trainer
from streamrl.types import TrainBatch


def _groups(n_groups: int, g_size: int, seed: int) -> TrainBatch:
    """n_groups prompts of 2..15 tokens, g_size ragged completions (1..12 tokens) each."""
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for _ in range(n_groups):
        p = torch.randint(3, 200, (int(torch.randint(2, 16, (1,), generator=g)),), generator=g).tolist()
        for _j in range(g_size):
            c = torch.randint(3, 200, (int(torch.randint(1, 13, (1,), generator=g)),), generator=g).tolist()
            trajs.append(make_traj(len(trajs), p, c, logprobs=(-torch.rand(len(c), generator=g)).tolist()))
    n = len(trajs)
    return TrainBatch(trajectories=trajs, advantages=torch.randn(n, generator=g).tolist())


def test_split_shared_keeps_groups_together_under_the_budget():
    a, b = (1, 2, 3, 4), (5, 6)
    prompts = [a, b, a, b, a]
    # order: b(c=1), b(c=2), a(c=3), a(c=3), a(c=5); cost = distinct prefixes x P' + rows x C
    assert split_shared(prompts, [3, 1, 3, 2, 5], budget=100) == [[1, 3, 0, 2, 4]]
    # budget 12: [b, b] costs 1*1 + 2*2 = 5; adding a (P'=3, C=3): 2*3 + 3*3 = 15 > 12 -> new batch;
    # [a, a] = 1*3 + 2*3 = 9; + a(c=5): 1*3 + 3*5 = 18 > 12 -> new batch
    assert split_shared(prompts, [3, 1, 3, 2, 5], budget=12) == [[1, 3], [0, 2], [4]]
    assert not shareable([make_traj(0, [1, 2], [3]), make_traj(1, [1, 3], [3])])  # nothing repeats
    assert not shareable([make_traj(0, [1], [3]), make_traj(1, [1], [3])])  # no prefix to cache


def test_collate_shared_layout():
    mb = collate_shared(
        [make_traj(0, [5, 6, 7], [8, 9]), make_traj(1, [4, 3], [2]), make_traj(2, [5, 6, 7], [1])],
        [1.0, -1.0, 0.5],
        pad_id=0,
    )
    assert mb.prefix_ids.tolist() == [[5, 6], [0, 4]] and mb.prefix_mask.tolist() == [[1, 1], [0, 1]]
    assert mb.prompt_rows.tolist() == [0, 1, 0]
    assert mb.input_ids.tolist() == [[7, 8], [3, 0], [7, 0]]  # last prompt token, completion[:-1]
    assert mb.position_ids.tolist() == [[2, 3], [1, 2], [2, 3]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1], [0, 1, 1, 0], [1, 1, 1, 0]]
    assert mb.completion_ids.tolist() == [[8, 9], [2, 0], [1, 0]]
    assert mb.num_tokens == 2 * 2 + 3 * 2  # prefixes + completion rows
    assert mb.real_positions == 3 + 4  # the prefixes' tokens, each row's tokens (padding left out)
    padded = collate([make_traj(0, [5, 6, 7], [8, 9]), make_traj(1, [4, 3], [2])], [1.0, -1.0], pad_id=0)
    assert (padded.num_tokens, padded.real_positions) == (2 * 5, 5 + 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shared_logprobs_entropy_and_hidden_equal_the_padded_path(tiny, dtype):
    model = copy.deepcopy(tiny[0]).to(dtype)
    batch = _groups(3, 4, seed=0)
    trajs, adv = batch.trajectories, batch.advantages
    with torch.no_grad():
        padded, shared = collate(trajs, adv, 0), collate_shared(trajs, adv, 0)
        lp1, ent1, h1 = completion_forward(model, padded, 0.7, True, return_hidden=True)
        lp2, ent2, h2 = completion_forward(model, shared, 0.7, True, return_hidden=True)
    mask = collate(trajs, adv, 0).loss_mask.bool()
    assert lp2.dtype == ent2.dtype == dtype  # fp64 logits keep fp64 log-probs
    for a, b in ((lp1, lp2), (ent1, ent2)):
        assert float((a - b)[mask].abs().max()) < 1e-5
    assert float((h1 - h2)[mask].abs().max()) < 1e-5


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-sum-norm"])
def test_shared_step_equals_padded_step_with_fewer_tokens(tiny, aggregation, capsys):
    batch = _groups(4, 8, seed=1)  # 4 groups x 8 samples: the GRPO shape
    base = ["train.lr=1e-3", "train.token_budget=200", f"loss.aggregation={aggregation}"]
    base.append("train.precision=fp32")  # exact equivalence: fp32 (bf16 autocast rounds differently)
    padded = Trainer.from_config(
        copy.deepcopy(tiny[0]), load_config(None, base + ["train.shared_prompt=false"]), 0
    )
    shared = Trainer.from_config(copy.deepcopy(tiny[0]), load_config(None, base), 0)
    grads: list[list[torch.Tensor]] = []
    for t in (padded, shared):
        t.optimizer.register_step_pre_hook(
            lambda opt, a, kw, t=t: grads.append([p.grad.clone() for p in t.params])
        )
    m1, m2 = padded.step(batch), shared.step(batch)
    assert m2["loss"] == pytest.approx(m1["loss"], rel=1e-5, abs=1e-7)
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
    assert m2["entropy"] == pytest.approx(m1["entropy"], rel=1e-5)
    gd = max(float((a - b).abs().max()) for a, b in zip(*grads))
    assert gd < 1e-6
    assert m2["padded_tokens"] < 0.75 * m1["padded_tokens"]  # prompts run once per group
    # the share of forwarded positions that are padding, in either layout
    trajs = batch.trajectories
    real = sum(len(t.completion_ids) for t in trajs)  # + each micro-batch's prefixes once
    prompts, completions = [tuple(t.prompt_ids) for t in trajs], [len(t.completion_ids) for t in trajs]
    for idx in split_shared(prompts, completions, 200):
        real += sum(len(p) - 1 for p in {tuple(trajs[i].prompt_ids) for i in idx})
    assert m2["padding_frac"] == pytest.approx(1 - real / m2["padded_tokens"])
    assert m1["padding_frac"] == pytest.approx(1 - m1["tokens_trained"] / m1["padded_tokens"])
    with capsys.disabled():
        print(
            f"\n{aggregation}: forward tokens padded {m1['padded_tokens']} -> shared "
            f"{m2['padded_tokens']}, max grad diff {gd:.2e}, loss {m1['loss']:.8f} vs {m2['loss']:.8f}"
        )


def test_split_shared_separates_long_tails_when_padding_costs_more_than_a_micro_batch():
    a, b = tuple(range(10)), tuple(range(20, 30))  # P' = 9
    prompts = [a] * 4 + [b] * 4
    completions = [1, 2, 1, 40, 2, 1, 2, 40]
    # one batch: 2 * 9 + 8 * 40 = 338 (+ 64); split [six short] [two long]: (18 + 6 * 2) + (18 + 2 * 40)
    # = 128 (+ 128): 256 < 402
    got = split_shared(prompts, completions, budget=4096, overhead=64)
    assert sorted(map(sorted, got)) == [[0, 1, 2, 4, 5, 6], [3, 7]]
    # a large overhead keeps one batch: 338 + 1000 < 128 + 2000
    assert len(split_shared(prompts, completions, budget=4096, overhead=1000)) == 1
    # every index exactly once, whatever the split
    many = split_shared([a, b] * 50, [(7 * i) % 45 + 1 for i in range(100)], budget=300)
    flat = sorted(i for mb in many for i in mb)
    assert flat == list(range(100))
    assert all(
        len({[a, b][i % 2] for i in mb}) * 9 + len(mb) * max((7 * i) % 45 + 1 for i in mb) <= 300
        for mb in many
        if len(mb) > 1
    )


def _with_repeats(seed: int) -> TrainBatch:
    """4 groups x 8 samples where most samples repeat one of their group's 3 completions (a confident
    policy's short answers), each row with its own advantage and behaviour log-probs. Every group's
    first answer is the same completion (under different prompts: different samples)."""
    g = torch.Generator().manual_seed(seed)
    trajs = []
    common = torch.randint(3, 200, (5,), generator=g).tolist()
    for _ in range(4):
        p = torch.randint(3, 200, (int(torch.randint(2, 16, (1,), generator=g)),), generator=g).tolist()
        answers = [common] + [
            torch.randint(3, 200, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
            for _ in range(2)
        ]
        for j in range(8):
            c = answers[min(j, int(torch.randint(3, (1,), generator=g)))]
            lp = (-torch.rand(len(c), generator=g)).tolist()
            trajs.append(make_traj(len(trajs), p, c, logprobs=lp))
    return TrainBatch(trajectories=trajs, advantages=torch.randn(len(trajs), generator=g).tolist())


def test_repeated_samples_run_their_completion_once_and_train_as_the_padded_path(tiny):
    batch = _with_repeats(seed=4)
    trajs, adv = batch.trajectories, batch.advantages
    distinct = {(tuple(t.prompt_ids), tuple(t.completion_ids)) for t in trajs}
    assert len(distinct) <= 12 < len(trajs)
    mb = collate_shared(trajs, adv, 0)
    assert mb.distinct_rows is not None and mb.sample_rows is not None
    assert len(mb.distinct_rows) == len(distinct)
    for i, t in enumerate(trajs):  # each row points at a row holding the same sample
        j = int(mb.distinct_rows[mb.sample_rows[i]])
        assert (trajs[j].prompt_ids, trajs[j].completion_ids) == (t.prompt_ids, t.completion_ids)
    assert mb.num_tokens == mb.prefix_ids.numel() + len(distinct) * mb.input_ids.shape[1]
    prefixes = {tuple(t.prompt_ids) for t in trajs}
    assert mb.real_positions == sum(len(p) - 1 for p in prefixes) + sum(len(c) for _, c in distinct)
    model = tiny[0]
    check_head(model, "cpu", "train.shared_prompt", "the shared-prompt forward", "fix")  # done once per model
    rows: list[int] = []
    hook = model.get_decoder().register_forward_pre_hook(
        lambda m, a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        with torch.no_grad():
            lp2, ent2, h2 = completion_forward(model, mb, 0.7, True, return_hidden=True)
    finally:
        hook.remove()
    assert rows == [4, len(distinct)]  # 4 prefixes, then the distinct completions only
    with torch.no_grad():
        lp1, ent1, h1 = completion_forward(model, collate(trajs, adv, 0), 0.7, True, return_hidden=True)
    mask = collate(trajs, adv, 0).loss_mask.bool()
    for a, b in ((lp1, lp2), (ent1, ent2), (h1, h2)):
        assert float((a - b)[mask].abs().max()) < 1e-5
    # the training step: the same loss, gradient and entropy as the padded layout
    base = ["train.lr=1e-3", "train.precision=fp32"]
    trainers = [
        Trainer.from_config(copy.deepcopy(model), load_config(None, base + extra), 0)
        for extra in (["train.shared_prompt=false"], [])
    ]
    grads: list[list[torch.Tensor]] = []
    for t in trainers:
        t.optimizer.register_step_pre_hook(
            lambda opt, a, kw, t=t: grads.append([p.grad.clone() for p in t.params])
        )
    m1, m2 = (t.step(batch) for t in trainers)
    assert m2["loss"] == pytest.approx(m1["loss"], rel=1e-5, abs=1e-7)
    assert m2["entropy"] == pytest.approx(m1["entropy"], rel=1e-5)
    assert max(float((a - b).abs().max()) for a, b in zip(*grads)) < 1e-6


def test_a_model_whose_logits_the_shared_forward_cannot_reproduce_is_refused_in_one_line(tiny):
    """The shared-prompt forward applies the LM head itself (models/head.py): a config attribute the
    model's forward ignores (soft-capping on a Llama) makes the two differ, and the first shared forward
    refuses with the key to change instead of training on other log-probs."""
    model = copy.deepcopy(tiny[0])
    model._streamrl_head_checked = False
    model.config.final_logit_softcapping = 0.5
    batch = _groups(2, 3, seed=1)
    shared = collate_shared(batch.trajectories, batch.advantages, 0)
    with pytest.raises(ValueError) as err:
        completion_forward(model, shared, 1.0)
    assert str(err.value) == (
        "train.shared_prompt: LlamaForCausalLM computes its logits from the decoder's output in a way the "
        "shared-prompt forward cannot reproduce; set train.shared_prompt=false"
    )
    assert model.training == tiny[0].training  # the check's eval mode was undone
