"""Exported checkpoints: weights in checkpoint.dtype (exact casts of the fp32 master weights, which the
resume state keeps), a model card with the run's facts, and a reproduce command that reproduces."""

from __future__ import annotations

import json
import shlex

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from tiny_args import TINY

from streamrl.cli import main
from streamrl.config import load_config
from streamrl.loop import heldout, job
from streamrl.loop.state import latest_state, state_dirs
from streamrl.loop.train_clock import TrainClock
from streamrl.models.resolve import load_model
from streamrl.observe.model_card import Accuracy, model_card, reproduce_command

RUN = [
    *TINY,
    "runtime.mode=colocated",
    "max_staleness=0",
    "max_steps=2",
    "train.lr=1e-2",
    "train.save_every=1",  # a state per step: the fp32 weights behind checkpoints/step-1 too
    "eval.before=true",
    "eval.every=2",
    "checkpoint.save=true",
    "checkpoint.every=1",
]
# the held-out verdicts of the base, periodic (step 2) and final evaluations: distinct accuracies, so a
# card that mixes them up says so (a tiny random model gets every problem wrong)
VERDICTS = [[True, False, False, False], [True, True, False, False], [True, True, True, False]]


class FakeTime:
    """The training clock's time: 100 s per evaluation, state save and checkpoint export (all paused),
    1 s per step's groups.jsonl write (training)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def spend(self, seconds: float, fn):
        def wrapped(*args, **kw):
            self.t += seconds
            return fn(*args, **kw)

        return wrapped


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = tmp_path_factory.mktemp("export") / "run"
    verdicts = iter(VERDICTS)
    real = job.evaluate

    def evaluate(*args, **kw):
        res = real(*args, **kw)
        res.correct = next(verdicts)
        return res

    fake = FakeTime()

    class GroupLog(job.GroupLog):
        write = fake.spend(1.0, job.GroupLog.write)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(job, "evaluate", fake.spend(100.0, evaluate))  # base and final
        mp.setattr(heldout, "evaluate", fake.spend(100.0, evaluate))  # periodic (eval.every)
        mp.setattr(job, "save_state", fake.spend(100.0, job.save_state))
        mp.setattr(job, "export_checkpoint", fake.spend(100.0, job.export_checkpoint))
        mp.setattr(job, "GroupLog", GroupLog)
        mp.setattr(job, "TrainClock", lambda: TrainClock(now=fake))
        assert main(["train", *RUN, f"run_dir={run}"]) == 0
    return run


def test_train_elapsed_leaves_out_evaluation_state_saves_and_exports(run):
    # step 1 at 0 s; then 1 s of training (its groups.jsonl write) and a state save and an export
    # (paused); step 2 after its periodic evaluation (paused): 1 s. The loop ends after step 2's write
    # and export: 2 s. Without the pauses: 0, 301 and 402.
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["train_elapsed"] for r in rows] == [0.0, 1.0]
    assert json.loads((run / "summary.json").read_text())["timings"]["train_clock"] == 2.0


def _assert_exact_casts(ckpt, model_dir, dtype):
    exported = load_file(str(ckpt / "model.safetensors"))
    master = load_file(str(model_dir / "model.safetensors"))
    assert exported.keys() == master.keys()
    assert {t.dtype for t in master.values()} == {torch.float32}  # the resume state stays fp32
    for k, v in exported.items():
        assert v.dtype == dtype, k
        assert torch.equal(v, master[k].to(dtype)), f"{k}: not the trained weights cast to {dtype}"


def test_exported_weights_are_bf16_casts_of_the_trained_fp32_weights(run):
    assert [d.name for d in state_dirs(run)] == ["step-000001", "step-000002"]
    _assert_exact_casts(run / "checkpoint", latest_state(run) / "model", torch.bfloat16)
    _assert_exact_casts(run / "checkpoints" / "step-1", state_dirs(run)[0] / "model", torch.bfloat16)
    assert json.loads((run / "checkpoint" / "config.json").read_text())["dtype"] == "bfloat16"
    # `streamrl eval model=RUN_DIR/checkpoint` loads it in fp32: the same values
    model = load_model(run / "checkpoint")
    exported = load_file(str(run / "checkpoint" / "model.safetensors"))
    state = model.state_dict()
    assert all(
        state[k].dtype == torch.float32 and torch.equal(state[k], v.float()) for k, v in exported.items()
    )


def test_checkpoint_dtype_fp32_exports_the_master_weights_as_they_are(tmp_path):
    run = tmp_path / "run"
    args = [*TINY, "runtime.mode=colocated", "max_staleness=0", "max_steps=1", "train.lr=1e-2"]
    assert main(["train", *args, "checkpoint.save=true", "checkpoint.dtype=fp32", f"run_dir={run}"]) == 0
    _assert_exact_casts(run / "checkpoint", latest_state(run) / "model", torch.float32)
    assert json.loads((run / "checkpoint" / "config.json").read_text())["dtype"] == "float32"
    lines = (run / "checkpoint" / "README.md").read_text().splitlines()
    assert "- Weights: float32 (checkpoint.dtype=fp32)" in lines
    assert "- Held-out accuracy before training: not evaluated" in lines  # eval.before=false


def _line(label: str, summary: dict, source: str = "") -> str:
    where = f", {source}" if source else ""
    acc, correct, n = summary["accuracy"], summary["correct"], summary["n"]
    return f"- Held-out accuracy {label}: {acc:.3f} ({correct}/{n} problems, greedy{where})"


def test_the_card_states_steps_accuracies_base_model_and_command(run):
    ev = json.loads((run / "eval.json").read_text())
    base, final = ev["base"], ev["final"]
    assert (base["correct"], final["correct"], base["n"]) == (1, 3, 4)
    lines = (run / "checkpoint" / "README.md").read_text().splitlines()
    assert "- Steps trained: 2" in lines
    assert _line("before training", base) in lines
    assert _line("after training", final) in lines
    assert "- Base model: tiny-random" in lines
    assert "- Task: rg:chain_sum" in lines
    assert "- Algorithm: advantage `grpo`, loss `decoupled_ppo` with `token-mean` aggregation" in lines
    assert "- Weights: bfloat16 (checkpoint.dtype=bf16)" in lines
    assert f"streamrl train {run}/config.yaml run_dir={run}-again" in lines
    card = ModelCard.load(run / "checkpoint" / "README.md")
    assert card.data.library_name == "transformers"
    assert card.data.tags == ["streamrl", "reinforcement-learning", "grpo", "decoupled_ppo"]
    assert card.data.base_model is None  # tiny-random has no Hub id


def test_periodic_cards_say_which_evaluation_they_carry(run):
    base = json.loads((run / "eval.json").read_text())["base"]
    step1 = (run / "checkpoints" / "step-1" / "README.md").read_text().splitlines()
    step2 = (run / "checkpoints" / "step-2" / "README.md").read_text().splitlines()
    assert "- Steps trained: 1" in step1 and "- Steps trained: 2" in step2
    assert _line("before training", base) in step1 and _line("before training", base) in step2
    assert "- Held-out accuracy after training: not evaluated" in step1  # eval.every=2
    periodic = {"accuracy": 0.5, "correct": 2, "n": 4}
    assert _line("after training", periodic, "periodic evaluation at step 2") in step2


def test_the_card_command_trains_the_same_model_again(run):
    lines = (run / "checkpoint" / "README.md").read_text().splitlines()
    command = lines[lines.index("## Reproduce") + 3]
    argv = shlex.split(command)
    assert argv[:2] == ["streamrl", "train"]
    assert main(argv[1:]) == 0  # colocated and synchronous: bit for bit the same run
    again = run.parent / "run-again"
    a = load_file(str(run / "checkpoint" / "model.safetensors"))
    b = load_file(str(again / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_card_metadata_names_the_hub_base_model_and_lora():
    cfg = load_config(None, ["run_dir=runs/x", "train.lora_rank=8", "algo=dapo"])
    card = model_card(cfg, 5, Accuracy(0.125, 50, 400), None, "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert card.data.tags[-2:] == ["lora", "peft"]
    lines = card.text.splitlines()
    assert "- Base model: smollm2-135m-instruct (HuggingFaceTB/SmolLM2-135M-Instruct)" in lines
    assert lines[lines.index("- Steps trained: 5") - 1].startswith(
        "- LoRA: rank 8, alpha 32 on q_proj, k_proj"
    )
    assert "- Held-out accuracy before training: 0.125 (50/400 problems, greedy)" in lines
    assert "- Held-out accuracy after training: not evaluated" in lines
    assert lines[lines.index("## Training") + 4].startswith("- Algorithm (preset `dapo`): advantage")


def test_the_card_states_a_clip_range_only_for_a_loss_that_clips():
    def hyper(overrides: list[str]) -> str:
        card = model_card(load_config(None, ["run_dir=runs/x", *overrides]), 5, None, None, None)
        return next(x for x in card.text.splitlines() if x.startswith("- Hyper-parameters:"))

    assert "clip [0.2, 0.28], kl_coef 0" in hyper([])
    for algo in ("remax", "m2po"):  # REINFORCE and M2PO have no clip
        assert "clip" not in hyper([f"algo={algo}"]) and ", kl_coef " in hyper([f"algo={algo}"])


def test_a_resumed_runs_command_clears_resume():
    cfg = load_config(None, ["run_dir=runs/x/"])
    cfg.resume = "runs/x"
    assert reproduce_command(cfg) == "streamrl train runs/x/config.yaml run_dir=runs/x-again resume="


def test_an_adapter_trained_on_a_dequantized_gguf_names_the_converted_base(tmp_path, monkeypatch):
    """smollm2-135m-instruct is dequantized from a Q4_1 GGUF: its adapter applies to those weights, in the
    directory training loaded, not to the bf16 Hub original the card names as its lineage."""
    from streamrl.loop.export import _name_the_adapters_base

    monkeypatch.setenv("STREAMRL_CACHE", str(tmp_path / "cache"))
    adapter = tmp_path / "checkpoint" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "elsewhere", "r": 4}))
    _name_the_adapters_base(tmp_path / "checkpoint", "smollm2-135m-instruct")
    conf = json.loads((adapter / "adapter_config.json").read_text())
    converted = tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    assert conf == {"base_model_name_or_path": str(converted), "r": 4}
