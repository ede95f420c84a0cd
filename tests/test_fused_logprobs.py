"""The chunked log-prob/entropy function against plain autograd on log_softmax (values and gradients)."""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.trainer import fused_logprobs
from streamrl.trainer.fused_logprobs import token_logprobs_entropy


def reference(x: torch.Tensor, tokens: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(x.double() / temperature, dim=-1)
    return logp.gather(-1, tokens[..., None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_gradcheck_logprob_and_entropy(temperature: float) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 37, 11, dtype=torch.float64, requires_grad=True)  # 37 rows: 2 full chunks + a tail
    tokens = torch.randint(0, 11, (2, 37))
    assert torch.autograd.gradcheck(lambda x: token_logprobs_entropy(x, tokens, temperature), (x,))
    assert torch.autograd.gradcheck(lambda x: token_logprobs_entropy(x, tokens, temperature)[0], (x,))
    assert torch.autograd.gradcheck(lambda x: token_logprobs_entropy(x, tokens, temperature)[1], (x,))


def test_values_match_log_softmax_on_strided_and_flat_input() -> None:
    torch.manual_seed(1)
    full = torch.randn(3, 21, 50, dtype=torch.float64)
    x = full[:, :-1, :]  # the view completion_forward passes: not contiguous across rows
    tokens = torch.randint(0, 50, (3, 20))
    lp, ent = token_logprobs_entropy(x, tokens, 1.3)
    ref_lp, ref_ent = reference(x, tokens, 1.3)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-12)
    assert ent is not None
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-12)
    flat_lp, flat_ent = token_logprobs_entropy(x[1], tokens[1], 1.3)
    assert flat_lp.shape == (20,)
    torch.testing.assert_close(flat_lp, ref_lp[1], rtol=0, atol=1e-12)
    assert flat_ent is not None
    torch.testing.assert_close(flat_ent, ref_ent[1], rtol=0, atol=1e-12)


def test_hand_computed_two_token_vocabulary() -> None:
    # logits (0, ln 3): p = (1/4, 3/4); token 1: log p = ln 3/4; entropy = -(1/4 ln 1/4 + 3/4 ln 3/4)
    x = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64, requires_grad=True)
    lp, ent = token_logprobs_entropy(x, torch.tensor([1]))
    assert lp.item() == pytest.approx(math.log(0.75), abs=1e-15)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert ent is not None and ent.item() == pytest.approx(h, abs=1e-15)
    lp.sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, torch.tensor([[-0.25, 0.25]], dtype=torch.float64))  # onehot - p


def test_bf16_logits_give_fp32_outputs_and_bf16_grads_close_to_reference() -> None:
    torch.manual_seed(2)
    x = torch.randn(2, 40, 300).to(torch.bfloat16).requires_grad_(True)
    tokens = torch.randint(0, 300, (2, 40))
    weights = torch.randn(2, 40)
    lp, ent = token_logprobs_entropy(x, tokens, 0.9)
    assert lp.dtype == torch.float32 and ent is not None and ent.dtype == torch.float32
    (lp * weights).sum().backward()
    ref = x.detach().clone().requires_grad_(True)
    ref_lp, ref_ent = reference(ref, tokens, 0.9)
    (ref_lp * weights).sum().backward()
    torch.testing.assert_close(lp.double(), ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=0, atol=1e-5)
    assert x.grad is not None and x.grad.dtype == torch.bfloat16
    assert ref.grad is not None
    torch.testing.assert_close(x.grad.double(), ref.grad.double(), rtol=0, atol=8e-3)  # bf16 rounding


def test_without_entropy_and_chunk_size_does_not_change_results(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(3)
    x = torch.randn(2, 9, 13, dtype=torch.float64)
    tokens = torch.randint(0, 13, (2, 9))
    lp, ent = token_logprobs_entropy(x, tokens, with_entropy=False)
    assert ent is None
    monkeypatch.setattr(fused_logprobs, "CHUNK_ELEMENTS", 4 * 13)  # 4 rows per chunk
    lp4, _ = token_logprobs_entropy(x, tokens, with_entropy=False)
    assert torch.equal(lp, lp4)


def test_shape_mismatch_names_both_shapes() -> None:
    with pytest.raises(ValueError, match=r"logits \(2, 3, 5\) do not match tokens \(2, 4\)"):
        token_logprobs_entropy(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_gradient_through_a_strided_view_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # completion_forward passes logits[:, :-1]: cut per batch row, several chunks per row
    monkeypatch.setattr(fused_logprobs, "CHUNK_ELEMENTS", 3 * 7)  # 3 rows per chunk
    torch.manual_seed(4)
    full = torch.randn(2, 9, 7, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 7, (2, 8))
    assert torch.autograd.gradcheck(lambda f: token_logprobs_entropy(f[:, :-1], tokens, 0.8), (full,))
    lp, _ = token_logprobs_entropy(full[:, :-1], tokens, 0.8)
    torch.testing.assert_close(lp, reference(full[:, :-1], tokens, 0.8)[0], rtol=0, atol=1e-12)


def test_a_masked_token_adds_nothing_to_the_entropy_or_its_gradient() -> None:
    """A logit of -inf (a token a logits processor masks) has p = 0: the entropy and the gradients are
    those of the other tokens, finite (0 * log 0 = 0), and the masked logit's gradient is 0."""
    x = torch.tensor([[0.0, math.log(3.0), -math.inf]], dtype=torch.float64, requires_grad=True)
    lp, ent = token_logprobs_entropy(x, torch.tensor([1]))
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert lp.item() == pytest.approx(math.log(0.75), abs=1e-15)
    assert ent is not None and ent.item() == pytest.approx(h, abs=1e-15)
    (lp + ent).sum().backward()
    finite = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64, requires_grad=True)
    lp2, ent2 = token_logprobs_entropy(finite, torch.tensor([1]))
    assert ent2 is not None
    (lp2 + ent2).sum().backward()
    assert x.grad is not None and finite.grad is not None
    torch.testing.assert_close(x.grad[:, :2], finite.grad, rtol=0, atol=1e-15)
    assert x.grad[0, 2].item() == 0.0
