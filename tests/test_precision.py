"""cast_params: bf16 weights for the engines with RoPE's inv_freq kept in fp32."""

import copy

import torch

from streamrl.engine.hf import HFEngine
from streamrl.models.precision import cast_params


def test_cast_params_casts_weights_only_and_keeps_ties(tiny):
    model = cast_params(copy.deepcopy(tiny[0]), torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    buffers = dict(model.named_buffers())
    assert buffers["model.rotary_emb.inv_freq"].dtype == torch.float32
    torch.testing.assert_close(buffers["model.rotary_emb.inv_freq"], tiny[0].model.rotary_emb.inv_freq)
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight


def test_bf16_engine_keeps_fp32_rope(tiny):
    eng = HFEngine(tiny[0], tiny[1], dtype=torch.bfloat16)
    assert eng.model.model.rotary_emb.inv_freq.dtype == torch.float32
