import torch
from transformers import DynamicCache

from streamrl.engine.kv_cache import growing_cache


def _decode(model, cache, ids, attn, steps, drop_at):
    """Greedy decode with `cache`; after step `drop_at` keep rows 0 and 2 only. Returns the logits [R, V]
    of every step."""
    out = []
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=cache).logits[
            :, -1
        ]
        nxt = pos[:, -1:] + 1
        for step in range(steps):
            out.append(logits)
            tok = logits.argmax(-1, keepdim=True)
            if step == drop_at:
                keep = torch.tensor([0, 2])
                cache.batch_select_indices(keep)
                attn, nxt, tok = attn[keep], nxt[keep], tok[keep]
            attn = torch.cat([attn, torch.ones_like(tok)], dim=1)
            logits = model(
                input_ids=tok, attention_mask=attn, position_ids=nxt, past_key_values=cache
            ).logits[:, -1]
            nxt = nxt + 1
    return out


def test_growing_cache_decodes_exactly_like_dynamic_cache_across_growth_and_compaction(tiny):
    model, tok = tiny
    model = model.float().eval()
    rows = [tok(s).input_ids for s in ["hi", "a longer prompt here", "1+1="]]
    width = max(map(len, rows))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
    attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    # initial room of 2 columns past the prompt: the buffer doubles several times in 12 steps
    cache = growing_cache(initial=width + 2, limit=width + 12)
    ref = _decode(model, DynamicCache(), ids, attn, 12, drop_at=4)
    got = _decode(model, cache, ids, attn, 12, drop_at=4)
    assert [g.shape for g in got] == [r.shape for r in ref]
    assert max((g - r).abs().max().item() for g, r in zip(got, ref)) == 0.0
    layer = cache.layers[0]
    assert layer.get_seq_length() == width + 12 and layer.keys.shape[0] == 2
    assert layer._k.shape[-2] == width + 12  # grew to the limit, not past it
