"""Tied weights: a LoRA on a tied LM head is refused, and every weight loader refuses a state whose tied
aliases hold different values (the engine would keep one of them and sample from neither policy)."""

import copy

import pytest
import torch

from streamrl.engine.hf import load_whole
from streamrl.models.lora import apply_lora, check_targets_on_meta, merged_state, merged_weights
from streamrl.models.tied import tied_groups
from streamrl.placement.shared_weights import SharedWeights
from streamrl.placement.weight_sync import copy_into

HEAD = "lm_head.weight"
EMBED = "model.embed_tokens.weight"
TIED = "config key 'train.lora_targets': 'lm_head' is the output embedding, which this model ties to"


def _untied_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def test_lora_on_a_tied_lm_head_is_refused_in_one_line(tiny):
    model, _ = tiny
    assert tied_groups(model) == [(EMBED, HEAD)]
    with pytest.raises(ValueError, match=TIED) as e:
        apply_lora(copy.deepcopy(model), 2, 8.0, ("q_proj", "lm_head"))
    assert "\n" not in str(e.value) and "untied embeddings" in str(e.value)
    with pytest.raises(ValueError, match=TIED):
        check_targets_on_meta(model.config, ("lm_head",))


def test_a_fresh_run_is_told_to_leave_the_tied_head_out(tiny):
    with pytest.raises(ValueError) as e:
        check_targets_on_meta(tiny[0].config, ("q_proj", "lm_head"))
    assert str(e.value) == (
        "config key 'train.lora_targets': 'lm_head' is the output embedding, which this model ties to its "
        "input embedding (tie_word_embeddings): the merged weights cannot hold both; leave it out of "
        "train.lora_targets, or train a model with untied embeddings"
    )


def _resume_refusal(run, start: str) -> str:
    return (
        f"resume: config key 'train.lora_targets' in {run}/config.yaml names 'lm_head', the output "
        "embedding, which this model ties to its input embedding (tie_word_embeddings): the merged weights "
        f"cannot hold both, and a resumed run keeps its targets; start a new run from {start} with "
        "'lm_head' left out of train.lora_targets"
    )


def _model_dir(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_a_resumed_run_on_a_tied_head_is_pointed_at_its_merged_weights(tiny, tmp_path):
    """A run that trained an adapter on a tied LM head (before that was refused) cannot resume, and
    train.lora_targets cannot change on resume: it starts over from its merged weights, the exported
    checkpoint/ or else its newest state's model/."""
    from streamrl.loop.state import STATE_DIR

    config = tiny[0].config
    with pytest.raises(ValueError) as e:
        check_targets_on_meta(config, ("q_proj", "lm_head"), tmp_path)
    assert str(e.value) == _resume_refusal(tmp_path, "its base model (the run saved no merged weights)")
    for step in (2, 999_999, 1_000_000):  # by number: step-1000000 sorts before step-999999 as text
        _model_dir(tmp_path / STATE_DIR / f"step-{step:06d}" / "model")
    (tmp_path / STATE_DIR / "step-1000001").mkdir()  # a state without a model
    assert merged_weights(tmp_path) == tmp_path / STATE_DIR / "step-1000000" / "model"
    with pytest.raises(ValueError) as e:
        check_targets_on_meta(config, ("q_proj", "lm_head"), tmp_path)
    assert str(e.value) == _resume_refusal(tmp_path, f"model={tmp_path}/state/step-1000000/model")
    _model_dir(tmp_path / "checkpoint")
    with pytest.raises(ValueError) as e:
        check_targets_on_meta(config, ("q_proj", "lm_head"), tmp_path)
    assert str(e.value) == _resume_refusal(tmp_path, f"model={tmp_path}/checkpoint")
    check_targets_on_meta(config, ("q_proj",), tmp_path)  # a run without the head resumes


def test_resuming_a_run_on_a_tied_head_is_refused_before_anything_loads(tmp_path, capsys):
    """`streamrl train resume=RUN` of such a run: the one line, naming its checkpoint."""
    from tiny_args import TINY

    from streamrl.cli import main
    from streamrl.config import config_yaml, load_config

    run = tmp_path / "run"
    run.mkdir()
    saved = load_config(
        None, [*TINY, "train.lora_rank=4", "train.lora_targets=[q_proj,lm_head]", f"run_dir={run}"]
    )
    (run / "config.yaml").write_text(config_yaml(saved))
    (run / "state" / "step-000001").mkdir(parents=True)  # a saved state's directory
    _model_dir(run / "checkpoint")
    assert main(["train", f"resume={run}"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"streamrl: error: {_resume_refusal(run, f'model={run}/checkpoint')}"
    )
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint", "config.yaml", "state"]


def test_lora_on_an_untied_lm_head_trains_and_merges():
    model = _untied_llama()
    check_targets_on_meta(model.config, ("lm_head",))
    lora = apply_lora(copy.deepcopy(model), 2, 8.0, ("lm_head",))
    for name, p in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p)
    plain = copy.deepcopy(model)
    load_whole(plain, merged_state(lora))
    ids = torch.tensor([[1, 7, 3, 9]])
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, lora(ids).logits, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(plain(ids).logits, model(ids).logits)


def _split_state(model):
    """The model's weights with the tied LM head given other values than the embedding it shares."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state[HEAD] += 0.5
    return state


def _load_shared(model, state):
    SharedWeights(state).load_into(model)


@pytest.mark.parametrize("load", [load_whole, copy_into, _load_shared], ids=["hf", "copy_into", "shm"])
def test_loaders_refuse_tied_aliases_with_different_values(tiny, load):
    model = copy.deepcopy(tiny[0])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = _split_state(model)
    state["model.norm.weight"] += 1.0  # an untied change: not copied either, the whole load is refused
    with pytest.raises(ValueError, match=f"new weights give {EMBED} and {HEAD} different values") as e:
        load(model, state)
    assert "\n" not in str(e.value)
    after = model.state_dict()
    assert [k for k in before if not torch.equal(before[k], after[k])] == []
    assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize("load", [load_whole, copy_into, _load_shared], ids=["hf", "copy_into", "shm"])
def test_loaders_take_tied_aliases_with_equal_values(tiny, load):
    model = copy.deepcopy(tiny[0])
    state = {k: v.clone() + 0.25 for k, v in model.state_dict().items()}
    state[HEAD] = state[EMBED].clone()  # two tensors, equal values (as a shared buffer holds them)
    load(model, state)
    torch.testing.assert_close(model.model.embed_tokens.weight, state[EMBED], rtol=0, atol=0)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    torch.testing.assert_close(model.model.norm.weight, state["model.norm.weight"], rtol=0, atol=0)
