"""The chunked log-prob/entropy function against plain autograd on log_softmax (values and gradients)."""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.algo.loss_inputs import LossParams, LossTensors
from streamrl.algo.registry import KL_ESTIMATORS, POLICY_LOSSES
from streamrl.engine.sampling import MIN_LOGPROB, floored_temperature, sample_next, sampling_probs
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


# 1e-46 rounds to 0 in fp32; 1e-39 is below fp32's smallest normal; 1e-37 and 1e-30 overflow logits / T
TINY_AND_ORDINARY = [1e-46, 1e-39, 1e-37, 1e-30, 1e-3, 1.0]


def _engine_logits() -> torch.Tensor:
    """fp32 [4, 50]; the last row has a three-way tie at the top."""
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 5
    logits[3, [7, 9]] = logits[3].max()
    return logits


def _tempered_reference(x: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """d (log-probs + entropies).sum() / d x by fp64 autograd, tempered as the engine samples."""
    z = x.detach().double().requires_grad_()
    scaled = (z - z.amax(-1, keepdim=True).detach()) / floored_temperature(temperature)
    logp = torch.log_softmax(scaled if temperature != 1.0 else z, dim=-1)
    ent = -(logp.exp() * logp.clamp(min=torch.finfo(logp.dtype).min)).sum(-1)
    (logp.gather(-1, tokens[:, None]).sum() + ent.sum()).backward()
    assert z.grad is not None
    return z.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("temperature", TINY_AND_ORDINARY)
def test_logprobs_and_gradients_agree_with_the_engine_at_any_temperature(
    temperature: float, dtype: torch.dtype
) -> None:
    """The tokens the engine samples get the log-probs it recorded (at a tiny temperature exactly: 0 for
    the top token, log(1/3) for a three-way tie); values and gradients are finite and the gradients are
    the fp64 reference's with the engine's temperature floor."""
    logits = _engine_logits()
    tokens, engine_lp = sample_next(logits, temperature, 1.0, torch.Generator().manual_seed(1))
    x = logits.to(dtype).requires_grad_()
    lp, ent = token_logprobs_entropy(x, tokens, temperature)
    assert ent is not None and torch.isfinite(lp).all() and torch.isfinite(ent).all()
    if temperature <= 1e-30:
        assert engine_lp.tolist() == [0.0, 0.0, 0.0, pytest.approx(-math.log(3.0), abs=1e-7)]
        assert lp[:3].tolist() == [0.0, 0.0, 0.0]
        if dtype == torch.float32:
            assert torch.equal(lp, engine_lp)
    torch.testing.assert_close(lp.float(), engine_lp, rtol=0, atol=2e-6)
    (lp.sum() + ent.sum()).backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    ref = _tempered_reference(logits, tokens, temperature)
    scale = float(ref.abs().max())
    torch.testing.assert_close(x.grad.double(), ref, rtol=1e-5, atol=1e-6 * scale)


def test_the_trainer_takes_the_engines_temperature_floor() -> None:
    """At T = 1e-39 (below fp32's smallest normal) both divide by floored_temperature(T), not by T: a
    gap of 1e-38 is 0.85 floored temperatures (1/T would make it 10)."""
    logits = torch.tensor([[0.0, -1e-38]], dtype=torch.float64)
    t = floored_temperature(1e-39)
    assert t == torch.finfo(torch.float32).tiny
    expected = torch.log_softmax(logits / t, dim=-1)[0, 1].item()
    assert expected == pytest.approx(-1.2064, abs=1e-4)
    lp, _ = token_logprobs_entropy(logits, torch.tensor([1]), 1e-39)
    assert lp.item() == pytest.approx(expected, abs=1e-12)
    probs = sampling_probs(logits, 1e-39, 1.0)
    assert probs[0, 1].log().item() == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_token_the_engine_cannot_sample_is_floored_with_no_gradient(dtype: torch.dtype) -> None:
    """Below the top at T = 1e-39 a token's log-prob is -inf in fp32 (and ~-1e38 in fp64): both become
    MIN_LOGPROB, the least the engine can record (log of fp32's smallest positive), with zero gradient."""
    assert MIN_LOGPROB == math.log(2.0**-149)
    assert torch.tensor(2.0**-149).log().item() == pytest.approx(MIN_LOGPROB, abs=1e-5)
    x = torch.tensor([[0.0, -1.0, 2.0], [0.0, -1.0, 2.0]], dtype=dtype, requires_grad=True)
    lp, ent = token_logprobs_entropy(x, torch.tensor([0, 2]), 1e-39)
    assert lp.tolist() == [torch.tensor(MIN_LOGPROB, dtype=dtype).item(), 0.0]
    assert ent is not None and ent.tolist() == [0.0, 0.0]
    (lp.sum() + ent.sum()).backward()
    assert x.grad is not None and x.grad.tolist() == [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize("loss", sorted(POLICY_LOSSES))
@pytest.mark.parametrize("estimator", sorted(KL_ESTIMATORS))
def test_every_loss_and_kl_stays_finite_on_tiny_temperature_logprobs(loss: str, estimator: str) -> None:
    """Log-probs at T = 1e-39 under a policy whose top token moved: a sampled token (row 0) and a padding
    token (row 1, masked) are below the top, a reference's top token differs too. Each policy loss and KL
    estimator, with the padding masked, gives a finite loss and finite gradients."""
    logits = torch.tensor([[[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]], [[0.0, 3.0, 1.0], [2.0, 0.0, 5.0]]])
    tokens = torch.tensor([[1, 0], [1, 1]])
    x = logits.clone().requires_grad_()
    lp, _ = token_logprobs_entropy(x, tokens, 1e-39)
    ref_lp, _ = token_logprobs_entropy(logits.flip(-1), tokens, 1e-39)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    t = LossTensors(lp, torch.zeros(2, 2), torch.tensor([[1.0, 1.0], [-1.0, -1.0]]), mask)
    per_token, _ = POLICY_LOSSES[loss].fn(t, LossParams())
    per_token = per_token + 0.1 * KL_ESTIMATORS[estimator](lp, ref_lp)
    total = (per_token * mask).sum()
    total.backward()
    assert torch.isfinite(total) and x.grad is not None and torch.isfinite(x.grad).all()
