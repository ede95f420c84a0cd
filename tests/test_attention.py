import copy

import pytest
import torch
import torch.nn.functional as F

from streamrl.models.attention import NAME, matmul_attention


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
    with torch.no_grad():  # no grad: the SDPA path itself
        assert torch.equal(model(input_ids=ids).logits, ref(input_ids=ids).logits)
