"""One forward for the inputs of several DecodeBatches: a decode step and a prefill share the weights' pass.

A decode step streams every weight of the model whatever its row count (about 49 ms fixed against
2.3 ms per row for SmolLM2 on one core, benchmarks/thread_scaling.py), and so does a prefill. When new
requests join a running batch, their prefill and the running rows' decode step are therefore run as
one forward: each batch's input is a rectangle (rows x columns, its own padding), the rectangles'
tokens are laid end to end as one sequence for the layers' matrix products, and attention alone is
split back into the rectangles, each reading and extending its own KV cache under its own mask
(`Segment`). Every token's hidden state is the one its batch's own forward computes (up to the
rounding of differently shaped matrix products). The joining rows sample their first token in the
next step (its logits come out of this forward), a step later than when their prefill ran alone before
the step: one forward fewer per join, one step more per group (benchmarks/spec_continuous.py
--unpacked-too measures both ways).

Attention on packed inputs is the `streamrl` attention's (models/attention.py: `SegmentedMask`), the
CPU one; elsewhere each batch runs its own forward.

The layers are run here, not by the decoder's forward (which builds one mask and one cache for one
rectangle): `packable` checks once per model, on a few tokens, that this loop computes what the
decoder does, and the engine runs the batches' forwards apart for a model where it does not (or whose
layers slide).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from streamrl.models.attention import SegmentedMask, rectangles, unpack_rows
from streamrl.models.cache_kwarg import cache_kwarg_of


@dataclass
class Segment:
    """ids, positions [R, C]: the tokens a batch forwards; mask [R, 1, C, K] bool: the KV-cache columns
    each query sees once these C are written (K = the cache's length after the forward); cache: the
    batch's DynamicCache (its layers' update appends the C columns)."""

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    cache: Any

    @property
    def tokens(self) -> int:
        return self.ids.numel()


class _SegmentedCache:
    """What the layers see as their KV cache: update() splits the new keys and values by segment and
    appends each part to its segment's own cache; attention (SegmentedMask) reads the parts back."""

    def __init__(self, segments: list[Segment]) -> None:
        self.segments = segments

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        keys, values = [], []
        for seg, (r, c, part) in zip(self.segments, rectangles([s.ids.shape for s in self.segments])):
            k, v = unpack_rows(key[0], r, c, part), unpack_rows(value[0], r, c, part)  # [R, Hkv, C, D]
            k_all, v_all = seg.cache.update(k, v, layer_idx)
            keys.append(k_all)
            values.append(v_all)
        return keys, values


def packed_hidden(model: Any, segments: list[Segment], device: Any) -> list[torch.Tensor]:
    """The decoder's output (after its final norm) for every segment's tokens -> [R, C, H] per segment,
    each segment's KV cache extended by its C columns."""
    decoder = model.get_decoder()
    ids = torch.cat([s.ids.reshape(-1) for s in segments])[None].to(device)
    pos = torch.cat([s.positions.reshape(-1) for s in segments])[None].to(device)
    hidden = decoder.embed_tokens(ids)
    rotary = decoder.rotary_emb(hidden, pos)
    mask = SegmentedMask([s.ids.shape for s in segments], [s.mask.to(device) for s in segments])
    layers = decoder.layers[: decoder.config.num_hidden_layers]
    kwargs = {cache_kwarg_of(type(layers[0])): _SegmentedCache(segments)}
    for layer in layers:
        out = layer(
            hidden,
            attention_mask=mask,
            position_embeddings=rotary,
            position_ids=pos,
            use_cache=True,
            **kwargs,
        )
        hidden = out[0] if isinstance(out, tuple) else out  # older transformers return (hidden, ...)
    hidden = decoder.norm(hidden)[0]
    return [hidden[part].view(r, c, -1) for r, c, part in rectangles([s.ids.shape for s in segments])]


@torch.no_grad()
def packable(model: Any, device: Any, pad_id: int) -> bool:
    """Once per model: whether packed_hidden computes, on two small segments (two left-padded rows of
    four tokens; one row of two tokens after a cached column), what the decoder's own forward computes
    for each. False for a model whose decoder does more than the loop above (an embedding scale, its
    own mask rules) or whose layers take other arguments."""
    known = getattr(model, "_streamrl_packable", None)
    if known is not None:
        return bool(known)
    from streamrl.engine.kv_cache import growing_cache
    from streamrl.models.attention import NAME
    from streamrl.models.head import check_head

    ok = False
    training = model.training
    model.eval()
    try:
        decoder = model.get_decoder()
        if getattr(model.config, "_attn_implementation", None) != NAME:
            raise TypeError("packing needs the streamrl attention")
        check_head(model, device, "packed forwards", "the engine", "")  # the logits come from head_logits
        vocab = model.get_input_embeddings().num_embeddings
        ids_a = torch.tensor([[pad_id, 5, 6, 7], [8, 9, 10, 11]]) % vocab
        attn_a = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
        mask_a = torch.ones(4, 4, dtype=torch.bool).tril()[None, None] & attn_a.bool()[:, None, None, :]
        pos_a = (attn_a.cumsum(-1) - 1).clamp(min=0)
        ids_b, pos_b = torch.tensor([[12, 13]]) % vocab, torch.tensor([[1, 2]])
        mask_b = torch.ones(2, 3, dtype=torch.bool).tril(1)[None, None]

        def seeded() -> Any:  # a cache holding one column (the token 4 at position 0)
            cache = growing_cache(8, 8)
            decoder(
                input_ids=(torch.tensor([[4]]) % vocab).to(device),
                position_ids=torch.tensor([[0]]).to(device),
                use_cache=True,
                **{cache_kwarg_of(type(decoder)): cache},
            )
            return cache

        own = []
        for ids, pos, mask, cache in (
            (ids_a, pos_a, mask_a, growing_cache(8, 8)),
            (ids_b, pos_b, mask_b, seeded()),
        ):
            out = decoder(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                position_ids=pos.to(device),
                use_cache=True,
                **{cache_kwarg_of(type(decoder)): cache},
            )
            own.append(out.last_hidden_state)
        ours = packed_hidden(
            model,
            [Segment(ids_a, pos_a, mask_a, growing_cache(8, 8)), Segment(ids_b, pos_b, mask_b, seeded())],
            device,
        )
        tol = 1e-4 if next(model.parameters()).dtype == torch.float32 else 3e-2
        ok = all(
            float((a[attn] - b[attn]).abs().max()) <= tol * float(a.abs().max()) + 1e-6
            for a, b, attn in ((own[0], ours[0], attn_a.bool()), (own[1], ours[1], torch.ones(1, 2).bool()))
        )
    except Exception:  # whatever a layer of another architecture raises here: it runs unpacked
        ok = False
    finally:
        model.train(training)
    model._streamrl_packable = ok
    return ok
