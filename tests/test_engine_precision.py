"""rollout.precision=bf16: the engine decodes with its own bf16 copy and takes the trainer's weights."""

import copy

import pytest
import torch

from streamrl.config import load_config
from streamrl.engine.base import GenRequest
from streamrl.engine.hf import HFEngine
from streamrl.placement.colocated import push_policy
from streamrl.trainer.trainer import Trainer


def test_bf16_engine_keeps_its_own_copy_and_takes_pushed_weights(tiny):
    model, tok = copy.deepcopy(tiny[0]), tiny[1]  # the weights are changed below: not the shared fixture
    cfg = load_config(overrides=["train.lr=0.1"])
    trainer = Trainer.from_config(model, cfg, pad_id=int(tok.pad_token_id))
    eng = HFEngine(model, tok, max_batch=4, dtype=torch.bfloat16)
    assert eng.owns_weights and eng.model is not model
    assert next(eng.model.parameters()).dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32  # the trainer's module is untouched
    with torch.no_grad():  # a new policy: every trainer weight moves
        for p in model.parameters():
            p.add_(0.05)
    trainer.version = 3
    with pytest.raises(RuntimeError, match="pass the new state"):
        eng.update_weights(None, 3)  # a bf16 copy cannot silently keep the old weights
    push_policy(eng, trainer)
    assert eng.version == 3
    for name, p in eng.model.state_dict().items():
        torch.testing.assert_close(p, model.state_dict()[name].to(torch.bfloat16), rtol=0, atol=0)


def test_an_engine_refuses_weights_that_leave_out_or_add_a_parameter(tiny):
    """A state missing a weight would leave the engine sampling with the old one, silently."""
    model, tok = tiny
    eng = HFEngine(model, tok, max_batch=4, dtype=torch.bfloat16)
    state = {k: v.clone() + 0.01 for k, v in model.state_dict().items()}
    assert model.config.tie_word_embeddings and "lm_head.weight" in state
    del state["lm_head.weight"]  # tied to the embedding, which is given: accepted
    eng.update_weights(state, 1)
    head = eng.model.get_output_embeddings().weight
    torch.testing.assert_close(head, state["model.embed_tokens.weight"].to(torch.bfloat16), rtol=0, atol=0)
    name = next(k for k in state if k.endswith("mlp.down_proj.weight"))
    short = {k: v + 1 for k, v in state.items() if k != name}  # other values: a partial copy would show
    with pytest.raises(ValueError, match=rf"1 missing \(\['{name}'\]\), 0 unknown") as missing:
        eng.update_weights(short, 2)
    with pytest.raises(ValueError, match=r"0 missing \(\[\]\), 1 unknown \(\['extra.weight'\]\)"):
        eng.update_weights({**short, name: state[name] + 1, "extra.weight": torch.zeros(1)}, 2)
    assert "do not match the engine's model" in str(missing.value) and eng.version == 1
    for k, v in eng.model.state_dict().items():  # a refused update copied nothing
        torch.testing.assert_close(v, state[k if k in state else "model.embed_tokens.weight"].to(v.dtype))


def test_same_dtype_engine_shares_the_module(tiny):
    model, tok = tiny
    eng = HFEngine(model, tok, dtype=torch.float32)
    assert not eng.owns_weights and eng.model is model


def test_bf16_logprobs_are_close_to_fp32(tiny):
    """Greedy decode in bf16 and fp32: the bf16 log-probs of the same tokens differ only by rounding."""
    model, tok = tiny
    prompt = tok("<|im_start|>user\n12+7<|im_end|>\n").input_ids
    r32 = HFEngine(model, tok).generate([GenRequest(prompt, 6, temperature=0.0)])[0]
    r16 = HFEngine(model, tok, dtype=torch.bfloat16).generate([GenRequest(prompt, 6, temperature=0.0)])[0]
    n = 0
    for a, b, la, lb in zip(r32.token_ids, r16.token_ids, r32.logprobs, r16.logprobs):
        if a != b:
            break
        assert abs(la - lb) < 0.05
        n += 1
    assert n >= 1
