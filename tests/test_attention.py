import copy

import pytest
import torch
import torch.nn.functional as F

from streamrl.models import attention
from streamrl.models.attention import NAME, SHORT_QUERIES, matmul_attention
from streamrl.models.cache_kwarg import cache_kwargs


def test_matmul_attention_equals_sdpa_values_and_gradients():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 5, 8, generator=g, requires_grad=True)
    k = torch.randn(3, 4, 9, 8, generator=g, requires_grad=True)
    v = torch.randn(3, 4, 9, 8, generator=g, requires_grad=True)
    keep = torch.ones(3, 1, 5, 9, dtype=torch.bool).tril(4)
    keep[0, :, :, :3] = False  # row 0 left-padded by 3 keys
    for mask in (keep, None):
        ours = matmul_attention(q, k, v, mask, 8**-0.5)
        ref = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask if mask is not None else torch.ones(5, 9, dtype=torch.bool).tril(4)
        )
        assert torch.allclose(ours, ref, atol=1e-6)
        go, gr = torch.autograd.grad(ours.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))
        assert max((a - b).abs().max().item() for a, b in zip(go, gr)) < 1e-5


@pytest.mark.parametrize("per_head_mask", [False, True])
def test_grouped_query_heads_equal_sdpa_on_repeated_kv_heads(per_head_mask):
    # 6 query heads over 2 kv heads: heads 0-2 read kv head 0, heads 3-5 kv head 1 (repeat_kv's layout)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 6, 4, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 7, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 7, 8, generator=g, dtype=torch.float64, requires_grad=True)
    keep = torch.ones(2, 6 if per_head_mask else 1, 4, 7, dtype=torch.bool).tril(3)
    keep[1, :, :, :2] = False
    if per_head_mask:
        keep[0, 4, :, 0] = False  # a mask that differs between heads of one kv group
    ours = matmul_attention(q, k, v, keep, 0.3)
    rk, rv = k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1)
    ref = F.scaled_dot_product_attention(q, rk, rv, attn_mask=keep, scale=0.3)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    go, gr = torch.autograd.grad(ours.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))
    for a, b in zip(go, gr):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", [(2, 1, 1, 7), (2, 1, 4, 1), (4, 7)])
def test_masks_that_broadcast_over_queries_or_keys(shape):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 6, 4, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 7, 8, generator=g, dtype=torch.float64) for _ in range(2))
    keep = torch.rand(shape, generator=g) > 0.3
    keep[..., 0] = True  # every query sees at least one key
    ref = F.scaled_dot_product_attention(
        q, k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1), attn_mask=keep, scale=0.5
    )
    torch.testing.assert_close(matmul_attention(q, k, v, keep, 0.5), ref, rtol=0, atol=1e-12)


def test_a_mask_over_a_different_number_of_keys_is_an_error():
    q, k = torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 5, 4)
    with pytest.raises(ValueError, match="attention mask covers 6 keys, the keys are 5"):
        matmul_attention(q, k, k, torch.ones(1, 1, 3, 6, dtype=torch.bool), 1.0)


def test_bf16_gradients_stay_close_to_fp32():
    # the bf16 softmax's backward reads bf16 probabilities: gradients within bf16 rounding of fp32 ones
    g = torch.Generator().manual_seed(3)
    q32 = torch.randn(4, 9, 16, 64, generator=g)
    k32, v32 = (torch.randn(4, 3, 40, 64, generator=g) for _ in range(2))
    keep = torch.ones(16, 40, dtype=torch.bool).tril(24)[None, None]
    grads = []
    for dtype in (torch.float32, torch.bfloat16):
        leaves = [t.to(dtype, copy=True).requires_grad_(True) for t in (q32, k32, v32)]
        out = matmul_attention(*leaves, keep, 64**-0.5)
        (out.float() * torch.linspace(-1, 1, 64)).sum().backward()
        grads.append([t.grad.float() for t in leaves])
    for g32, g16 in zip(*grads):
        assert float((g16 - g32).norm() / g32.norm()) < 2e-2


def test_query_heads_not_a_multiple_of_kv_heads_is_an_error():
    with pytest.raises(ValueError, match="5 query heads are not a multiple of 2 key/value heads"):
        matmul_attention(torch.zeros(1, 5, 2, 4), torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4), None, 1.0)


def test_a_fully_masked_query_row_stays_finite():
    q, k, v = (torch.randn(1, 1, 2, 4, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[[[False, False], [True, True]]]])  # query 0 sees nothing (a pad)
    out = matmul_attention(q, k, v, mask, 0.5)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()


@pytest.mark.parametrize("left_pad", [False, True])
def test_model_loaded_on_cpu_trains_with_the_same_logits_and_gradients_as_sdpa(tiny, left_pad):
    model, tok = tiny
    assert model.config._attn_implementation == NAME
    ref = copy.deepcopy(model)
    ref.set_attn_implementation("sdpa")
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    attn = torch.ones_like(ids)
    if left_pad:
        attn[1, :2] = 0
    outs = []
    for m in (model, ref):
        m.zero_grad()
        logits = m(input_ids=ids, attention_mask=attn).logits
        (logits * attn[..., None]).square().mean().backward()
        grads = torch.cat([p.grad.flatten() for p in m.parameters()])
        outs.append((logits * attn[..., None], grads))
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-5)
    assert (outs[0][1] - outs[1][1]).abs().max().item() < 1e-5
    long_ids = torch.arange(5, 5 + SHORT_QUERIES + 1)[None]
    with torch.no_grad():  # no grad past SHORT_QUERIES queries: the SDPA path itself
        assert torch.equal(model(input_ids=long_ids).logits, ref(input_ids=long_ids).logits)
        # no grad on few queries (a decode step): the matmul path, the same logits up to rounding
        assert torch.allclose(model(input_ids=ids).logits, ref(input_ids=ids).logits, atol=1e-5)


@pytest.mark.parametrize("queries", [1, 8])
def test_no_grad_short_queries_on_kv_cache_views_equal_sdpa(queries):
    # the engine's keys and values are views of a buffer with spare columns (engine/kv_cache.py); under
    # no_grad the scores are computed as (key @ q^T)^T: the same values as SDPA's
    g = torch.Generator().manual_seed(4)
    B, K = 3, 11
    q = torch.randn(B, 6, queries, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, 2, K + 5, 8, generator=g, dtype=torch.float64)[:, :, :K] for _ in range(2))
    keep = torch.ones(queries, K, dtype=torch.bool).tril(K - queries).expand(B, 1, queries, K).clone()
    keep[1, :, :, :3] = False  # row 1 left-padded by 3 keys
    with torch.no_grad():
        ours = matmul_attention(q, k, v, keep, 0.4)
    ref = F.scaled_dot_product_attention(
        q, k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1), attn_mask=keep, scale=0.4
    )
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)


def test_decode_steps_take_the_matmul_path_and_long_no_grad_passes_sdpa(tiny, monkeypatch):
    model, _ = tiny
    calls: list[int] = []
    real = attention.sdpa_attention_forward

    def counted(module, query, *args, **kwargs):
        calls.append(query.shape[2])
        return real(module, query, *args, **kwargs)

    monkeypatch.setattr(attention, "sdpa_attention_forward", counted)
    layers = model.config.num_hidden_layers
    prompt = torch.arange(5, 5 + SHORT_QUERIES + 1)[None]
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)  # a prefill of SHORT_QUERIES + 1 tokens: SDPA
        assert calls == [SHORT_QUERIES + 1] * layers
        model(input_ids=torch.tensor([[7]]), **cache_kwargs(model, out.past_key_values), use_cache=True)
        model(input_ids=prompt[:, :SHORT_QUERIES])
    assert calls == [SHORT_QUERIES + 1] * layers  # the decode step and the short pass: matmuls
