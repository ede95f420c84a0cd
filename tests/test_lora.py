"""LoRA: only adapters train; engines and checkpoints get W + (alpha/r) B A with the plain model's keys."""

import copy
import json

import pytest
import torch
from tiny_args import TINY
from trajectories import make_traj

from streamrl.cli import main
from streamrl.config import load_config
from streamrl.models.lora import apply_lora, merged_state
from streamrl.trainer.trainer import Trainer
from streamrl.types import TrainBatch

TARGETS = ("q_proj", "v_proj")


def test_merged_state_is_the_plain_models_weights_plus_the_low_rank_update(tiny):
    model, _ = tiny
    plain = copy.deepcopy(model)
    lora = apply_lora(copy.deepcopy(model), rank=2, alpha=8.0, targets=TARGETS)
    for name, p in lora.named_parameters():  # B starts at zero: give the update something to add
        if "lora_B" in name:
            torch.nn.init.normal_(p)
    state = merged_state(lora)
    assert set(state) == set(plain.state_dict())
    mod = lora.model.layers[0].self_attn.q_proj
    a, b = mod.lora_A["default"].weight, mod.lora_B["default"].weight
    expected = mod.base_layer.weight + (8.0 / 2) * b @ a
    torch.testing.assert_close(state["model.layers.0.self_attn.q_proj.weight"], expected)
    plain.load_state_dict(state)
    ids = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(plain(ids).logits, lora(ids).logits, atol=1e-5, rtol=1e-5)


def test_only_adapters_train(tiny):
    model, _ = tiny
    model = copy.deepcopy(model)
    cfg = load_config(None, ["train.lora_rank=2", "train.lr=1e-2", f"train.lora_targets={list(TARGETS)}"])
    base_before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer.from_config(model, cfg, pad_id=0)
    assert trainer.params and all(
        any(t in n for t in ("lora_A", "lora_B")) for n, p in model.named_parameters() if p.requires_grad
    )
    # distinct completions: identical ones with advantages +1, -1, +1, -1 would have an exactly zero gradient
    trajs = [make_traj(i, [1, 2, 3], [4 + i, 5, 6], reward=float(i % 2)) for i in range(4)]
    trainer.step(TrainBatch(trajs, [1.0, -1.0, 1.0, -1.0]))
    after = model.state_dict()
    for k, v in base_before.items():
        key = k.replace("q_proj.weight", "q_proj.base_layer.weight").replace(
            "v_proj.weight", "v_proj.base_layer.weight"
        )
        torch.testing.assert_close(after[key], v)  # the base never moves
    assert any(after[k].abs().sum() > 0 for k in after if "lora_B" in k)  # B moved off its zero init


def test_lora_bad_target_names_the_layers(tiny):
    model, _ = tiny
    with pytest.raises(ValueError, match="no linear layer named \\['qkv'\\]"):
        apply_lora(copy.deepcopy(model), 2, 8.0, ("qkv",))


def test_lora_trains_async_end_to_end_and_saves_a_plain_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    args = ["train", *TINY, "train.save_checkpoint=true", "train.lr=1e-2", "train.lora_rank=4", "max_steps=2"]
    args.append(f"run_dir={run}")
    assert main(args) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2]
    ckpt = AutoModelForCausalLM.from_pretrained(run / "checkpoint")  # a plain model: adapters merged
    assert not any("lora" in k for k in ckpt.state_dict())
    assert (run / "checkpoint" / "adapter_state.pt").is_file()
    from streamrl.models import resolve_model_dir

    init = AutoModelForCausalLM.from_pretrained(resolve_model_dir("tiny-random", seed=0)).state_dict()
    key = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(ckpt.state_dict()[key], init[key])  # the trained update is merged in
    key = "model.layers.0.input_layernorm.weight"
    assert torch.equal(ckpt.state_dict()[key], init[key])  # not a LoRA target: frozen
