"""Sliding-window attention in the engine: a token's window counts positions, never cache columns.

The engine's KV cache has columns that are not tokens: left padding, the padding between a cached prompt
prefix and the rest, holes left when finished rows are dropped or batches join, a draft tree's dropped
nodes. A model whose layers see only the last `sliding_window` positions must see exactly those, as in
a full forward of the sequence alone (what the trainer computes). Tiny random models whose responses
run well past their window: Mistral (every layer sliding), Qwen2 with one full and one sliding layer,
Gemma2 (alternating, logit soft-capping). The trainer's layouts (padded, packed, shared prompts) give
the same log-probs as the full forward too."""

import pytest
import torch
from trajectories import make_traj
from transformers import AutoModelForCausalLM, Gemma2Config, MistralConfig, Qwen2Config

from streamrl.engine.base import Draft, GenRequest
from streamrl.engine.continuous import ContinuousDecoder
from streamrl.engine.hf import HFEngine
from streamrl.models.attention import register
from streamrl.trainer.batching import collate
from streamrl.trainer.logprobs import completion_forward
from streamrl.trainer.packing import collate_packed
from streamrl.trainer.shared_prompt import collate_shared

WINDOW = 6
COMMON = dict(
    vocab_size=259,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    sliding_window=WINDOW,
)
CONFIGS = {
    "mistral": lambda: MistralConfig(**COMMON),
    "qwen2-mixed": lambda: Qwen2Config(**COMMON, use_sliding_window=True, max_window_layers=1),
    "gemma2": lambda: Gemma2Config(**COMMON, final_logit_softcapping=3.0, attn_logit_softcapping=None),
}


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[name](), attn_implementation=register())
    with torch.no_grad():  # a visible window: large weights make far tokens matter to the logits
        for p in model.parameters():
            p.mul_(8.0) if p.dim() > 1 else None
    return model.double().eval()


def _reference(model, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def _prompts() -> list[list[int]]:
    shared = list(range(10, 30))  # a prefix every prompt starts with: the prefix cache takes it
    return [shared + [40 + k] * (1 + 3 * k) for k in range(4)]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_window_is_the_same_as_in_a_full_forward(tiny, name):
    _, tok = tiny
    model = _model(name)
    assert model.model.config.sliding_window == WINDOW
    eng = HFEngine(model, tok, max_batch=3, seed=1)  # batches of 3 out of 8 rows: joins and holes
    reqs = [GenRequest(p, max_new_tokens=18, temperature=1.0) for p in _prompts() for _ in range(2)]
    results = eng.generate(reqs)
    assert max(len(r.token_ids) for r in results) > 2 * WINDOW
    for r in results:
        ref = _reference(model, r.request.prompt_ids, r.token_ids, 1.0)
        assert torch.allclose(ref, torch.tensor(r.logprobs, dtype=ref.dtype), atol=1e-6), name


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_requests_joining_a_running_batch_keep_the_window(tiny, name):
    """Continuous batching: requests arriving while others decode join them (never in a packed
    forward: its masks have no window) and every token still sees exactly its window."""
    _, tok = tiny
    model = _model(name)
    eng = HFEngine(model, tok, max_batch=64, seed=3)
    assert not eng.packs()
    dec = ContinuousDecoder(eng)
    out = []
    for step in range(60):
        if step < 8 and step % 2 == 0:
            dec.add([GenRequest(_prompts()[step // 2], max_new_tokens=14, temperature=1.0) for _ in range(2)])
        out += dec.step()
        if dec.idle:
            break
    assert len(out) == 8 and max(len(r.token_ids) for r in out) > 2 * WINDOW
    for r in out:
        ref = _reference(model, r.request.prompt_ids, r.token_ids, 1.0)
        assert torch.allclose(ref, torch.tensor(r.logprobs, dtype=ref.dtype), atol=1e-6), name


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_drafts_longer_than_the_window_are_verified_with_it(tiny, name):
    _, tok = tiny
    model = _model(name)
    eng = HFEngine(model, tok, max_batch=64, seed=2)
    prompts, t = _prompts()[:2], 0.1  # a peaked policy: its earlier responses are often taken again
    first = eng.generate([GenRequest(p, max_new_tokens=16, temperature=t) for p in prompts * 6])
    drafts: dict[tuple[int, ...], list[Draft]] = {tuple(p): [] for p in prompts}
    for r in first:
        drafts[tuple(r.request.prompt_ids)].append(Draft(tuple(r.token_ids), tuple(r.logprobs)))
    reqs = [
        GenRequest(p, max_new_tokens=16, temperature=t, drafts=tuple(drafts[tuple(p)]))
        for p in prompts
        for _ in range(8)
    ]
    results = eng.generate(reqs)
    # the tree was walked (every node's query sees the prompt, which is longer than the window)
    assert sum(r.tree_tokens for r in results) >= 2 * len(results), [r.tree_tokens for r in results]
    for r in results:
        ref = _reference(model, r.request.prompt_ids, r.token_ids, t)
        assert torch.allclose(ref, torch.tensor(r.logprobs, dtype=ref.dtype), atol=1e-6), name


@pytest.mark.parametrize("layout", ["padded", "packed", "shared"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_trainers_layouts_see_the_same_window(name, layout):
    """Prompts of 2 lengths, 3 ragged completions each, all longer than the window: the trainer's
    log-probs of every layout equal those of each sequence's own full forward."""
    model = _model(name)
    g = torch.Generator().manual_seed(0)
    trajs = []
    for length in (9, 14):
        prompt = torch.randint(3, 250, (length,), generator=g).tolist()
        for n in (8, 13, 17):
            trajs.append(make_traj(len(trajs), prompt, torch.randint(3, 250, (n,), generator=g).tolist()))
    collate_fn = {"padded": collate, "packed": collate_packed, "shared": collate_shared}[layout]
    mb = collate_fn(trajs, [0.0] * len(trajs), 0)
    with torch.no_grad():
        lp, _, _ = completion_forward(model, mb, 0.7)
    for i, t in enumerate(trajs):
        ref = _reference(model, t.prompt_ids, t.completion_ids, 0.7)
        assert torch.allclose(lp[i, : len(t.completion_ids)], ref, atol=1e-6), (name, layout, i)
