"""LoRA: only adapters train; engines and checkpoints get W + (alpha/r) B A with the plain model's keys."""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file
from tiny_args import TINY
from trajectories import make_traj

from streamrl.cli import main
from streamrl.config import load_config
from streamrl.loop.state import latest_state
from streamrl.models import load_model, resolve_model_dir
from streamrl.models.lora import apply_lora, merged_state
from streamrl.trainer.trainer import Trainer
from streamrl.types import TrainBatch

TARGETS = ("q_proj", "v_proj")


def _adapted(model, targets, std=1.0):
    """A copy of `model` with rank-2 adapters (alpha 8) on `targets`, their B drawn from N(0, std^2):
    B starts at zero, and the update needs something to add."""
    lora = apply_lora(copy.deepcopy(model), rank=2, alpha=8.0, targets=targets)
    for name, p in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=std)
    return lora


def _assert_computes(model, reference, base, ids):
    """`model` computes the logits `reference` does on `ids`, and `base` other ones (the update counts)."""
    with torch.no_grad():
        want = reference(ids).logits
        torch.testing.assert_close(model(ids).logits, want, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(base(ids).logits, want, rtol=1e-3, atol=1e-3)


def test_merged_state_is_the_plain_models_weights_plus_the_low_rank_update(tiny):
    model, _ = tiny
    plain = copy.deepcopy(model)
    lora = _adapted(model, TARGETS)
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
    args = ["train", *TINY, "checkpoint.save=true", "train.lr=1e-2", "train.lora_rank=4", "max_steps=2"]
    args.append(f"run_dir={run}")
    assert main(args) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2]
    ckpt = AutoModelForCausalLM.from_pretrained(run / "checkpoint")  # a plain model: adapters merged
    assert not any("lora" in k for k in ckpt.state_dict())
    assert (run / "checkpoint" / "adapter" / "adapter_model.safetensors").is_file()
    init = AutoModelForCausalLM.from_pretrained(resolve_model_dir("tiny-random", seed=0)).state_dict()
    key = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(ckpt.state_dict()[key], init[key])  # the trained update is merged in
    key = "model.layers.0.input_layernorm.weight"
    assert torch.equal(ckpt.state_dict()[key], init[key])  # not a LoRA target: frozen


SYNC = [*TINY, "runtime.mode=colocated", "max_staleness=0", "train.lr=1e-2", "train.lora_rank=4"]
SYNC += ["train.save_every=1", "checkpoint.save=true"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("lora") / "run"
    assert main(["train", *SYNC, "max_steps=2", f"run_dir={run}"]) == 0
    return run


def test_the_checkpoint_adapter_is_peft_format_and_reproduces_the_trained_model(lora_run):
    from peft import PeftModel

    adapter = lora_run / "checkpoint" / "adapter"
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    conf = json.loads((adapter / "adapter_config.json").read_text())
    base_dir = resolve_model_dir("tiny-random", seed=0)
    assert (conf["peft_type"], conf["task_type"], conf["r"]) == ("LORA", "CAUSAL_LM", 4)
    assert conf["base_model_name_or_path"] == str(base_dir)
    peft = PeftModel.from_pretrained(load_model(base_dir), adapter).eval()
    trained = load_model(latest_state(lora_run) / "model").eval()  # the trained policy, merged, fp32
    base = load_model(base_dir).eval()  # training changed it
    _assert_computes(peft, trained, base, torch.tensor([[1, 17, 5, 42, 9, 3, 28]]))


def test_a_lora_run_resumes_exactly(lora_run, tmp_path):
    split = tmp_path / "split"
    assert main(["train", *SYNC, "max_steps=1", f"run_dir={split}"]) == 0
    assert main(["train", f"resume={split}", "max_steps=2"]) == 0
    for rel in ("model/model.safetensors", "model/adapter/adapter_model.safetensors"):
        a = load_file(str(latest_state(lora_run) / rel))
        b = load_file(str(latest_state(split) / rel))
        assert a.keys() == b.keys()
        assert [k for k in a if not torch.equal(a[k], b[k])] == [], rel


@pytest.mark.parametrize(
    ("override", "key", "old", "new"),
    [
        ("train.lora_alpha=64", "train.lora_alpha", 32.0, 64.0),
        ("train.lora_rank=8", "train.lora_rank", 4, 8),
        ("train.lora_rank=0", "train.lora_rank", 4, 0),
        ("train.lora_targets=[q_proj]", "train.lora_targets", ("q_proj", "v_proj"), ("q_proj",)),
    ],
)
def test_a_lora_resume_keeps_the_adapters_shape_and_scale(tmp_path, override, key, old, new):
    """alpha scales the saved adapters (another value changed the trained model silently); another rank
    or target list does not fit the saved adapters or optimizer state: each refused in one line."""
    from streamrl.config import RESUME_FIXED, ConfigError, config_yaml

    saved = load_config(None, ["train.lora_rank=4", f"train.lora_targets={list(TARGETS)}"])
    (tmp_path / "config.yaml").write_text(config_yaml(saved))
    (tmp_path / "metrics.jsonl").touch()  # a run's, beside its config.yaml
    same = ["train.lora_rank=4", "train.lora_alpha=32", f"train.lora_targets={list(TARGETS)}"]
    assert load_config(None, [f"resume={tmp_path}", *same]).train.lora_targets == TARGETS
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"resume={tmp_path}", override])
    assert str(e.value) == (
        f"resume: config key '{key}' is {old!r} in {tmp_path}/config.yaml, not {new!r}: a resumed run keeps "
        f"it ({RESUME_FIXED[key]}); drop the override, or start a new run from its checkpoint"
    )


def test_lora_on_gpt2_conv1d_layers_merges_into_their_transposed_weights():
    """GPT-2's attention and MLP are transformers' Conv1D (weight [in, out]): accepted as targets, and
    the merged plain model computes what the adapted one does."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40, n_positions=16)
    config.bos_token_id = config.eos_token_id = 0
    model = GPT2LMHeadModel(config).eval()
    with pytest.raises(ValueError, match=r"its linear layers are \['c_attn', 'c_fc', 'c_proj', 'lm_head'\]"):
        apply_lora(copy.deepcopy(model), 2, 8.0, ("q_proj",))
    lora = _adapted(model, ("c_attn", "c_proj"), std=0.5)
    assert lora.peft_config["default"].fan_in_fan_out  # saved so, as PEFT's own GPT-2 adapters are
    plain = copy.deepcopy(model)
    plain.load_state_dict(merged_state(lora))
    _assert_computes(plain, lora, model, torch.tensor([[1, 7, 3, 9, 2]]))  # the adapters count


def test_evaluating_a_checkpoints_adapter_points_at_the_merged_model(tmp_path, capsys):
    """RUN/checkpoint/adapter is the PEFT adapter alone: `streamrl eval` names the merged model beside it."""
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "adapter").mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "adapter" / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    assert main(["eval", f"model={checkpoint}/adapter"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"streamrl: error: model '{checkpoint}/adapter': a PEFT adapter (adapter_config.json), not a model; "
        f"the merged model it was saved with is model={checkpoint}"
    )
    (checkpoint / "config.json").unlink()  # an adapter alone: merge it into its base first
    with pytest.raises(ValueError, match=r"PEFT adapter \(adapter_config.json\), not a model: give its base"):
        resolve_model_dir(str(checkpoint / "adapter"))
