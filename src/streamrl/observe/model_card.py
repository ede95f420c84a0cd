"""The model card (README.md) of an exported checkpoint: huggingface_hub's ModelCard, written offline.

Its metadata says what the Hub indexes (base model, library, tags); its text says how the model was
made: base model, task, algorithm and key hyper-parameters, steps trained, held-out accuracy before
and after, and the command that trains it again from the run's recorded config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from streamrl.config import Config


@dataclass(frozen=True)
class Accuracy:
    """A held-out greedy accuracy and where it comes from."""

    accuracy: float
    correct: int
    n: int
    source: str = ""  # e.g. "periodic evaluation at step 4"; empty: the run's before/after evaluation

    @classmethod
    def from_summary(cls, summary: dict[str, Any] | None) -> Accuracy | None:
        """From an eval.json entry ("base" or "final": accuracy, correct, n); None stays None."""
        if not summary:
            return None
        return cls(float(summary["accuracy"]), int(summary["correct"]), int(summary["n"]))

    def describe(self) -> str:
        where = f", {self.source}" if self.source else ""
        return f"{self.accuracy:.3f} ({self.correct}/{self.n} problems, greedy{where})"


def _describe(acc: Accuracy | None) -> str:
    return acc.describe() if acc is not None else "not evaluated"


def reproduce_command(cfg: Config) -> str:
    """The command that trains the same model again from the run's config.yaml, into a new directory."""
    run_dir = cfg.run_dir.rstrip("/")
    resume = " resume=" if cfg.resume else ""  # a resumed run's config.yaml names the run it resumed
    return f"streamrl train {run_dir}/config.yaml run_dir={run_dir}-again{resume}"


def _algorithm(cfg: Config) -> list[str]:
    import streamrl.algo  # noqa: F401  (registers every loss)
    from streamrl.algo.registry import POLICY_LOSSES

    a, loss, r, t = cfg.advantage, cfg.loss, cfg.rollout, cfg.train
    preset = f" (preset `{cfg.algo}`)" if cfg.algo else ""
    spec = POLICY_LOSSES.get(loss.name)
    clips = spec is not None and "eps_low" in spec.reads  # REINFORCE, M2PO: no clip to state
    clip = f"clip [{loss.eps_low:g}, {loss.eps_high:g}], " if clips else ""
    lines = [
        f"- Algorithm{preset}: advantage `{a.name}`, loss `{loss.name}` "
        f"with `{loss.aggregation}` aggregation",
        f"- Hyper-parameters: lr {t.lr:g}, {r.prompts_per_step} prompts x {r.samples_per_prompt} samples "
        f"per step, temperature {r.temperature:g}, max_new_tokens {r.max_new_tokens}, {clip}"
        f"kl_coef {loss.kl_coef:g}, max_staleness {cfg.max_staleness} ({cfg.runtime.mode}), seed {cfg.seed}",
    ]
    if t.lora_rank:
        lines.append(
            f"- LoRA: rank {t.lora_rank}, alpha {t.lora_alpha:g} on {', '.join(t.lora_targets)}; the "
            "weights here have the adapters merged in, `adapter/` holds the adapters alone (PEFT format)"
        )
    return lines


def model_card(
    cfg: Config,
    steps: int,
    before: Accuracy | None,
    after: Accuracy | None,
    base_model_id: str | None = None,
) -> ModelCard:
    """The card of a checkpoint trained for `steps` steps by the run `cfg` describes.

    before/after: held-out accuracy of the base model and of these weights (None: "not evaluated");
    base_model_id: the base model's Hub id, for the metadata (None: a model that has none)."""
    tags = ["streamrl", "reinforcement-learning", cfg.advantage.name, cfg.loss.name]
    if cfg.train.lora_rank:
        tags += ["lora", "peft"]
    data = ModelCardData(
        base_model=base_model_id,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=tags,
    )
    base = f"{cfg.model} ({base_model_id})" if base_model_id else cfg.model
    weights = {"bf16": "bfloat16", "fp32": "float32"}[cfg.checkpoint.dtype]
    body = [
        f"# {Path(cfg.run_dir).name}: {cfg.model} trained with RL on {cfg.task}",
        "",
        f"`{cfg.model}` post-trained with reinforcement learning by streamrl.",
        "",
        "## Training",
        "",
        f"- Base model: {base}",
        f"- Task: {cfg.task}",
        *_algorithm(cfg),
        f"- Steps trained: {steps}",
        f"- Weights: {weights} (checkpoint.dtype={cfg.checkpoint.dtype})",
        "",
        "## Held-out evaluation",
        "",
        f"- Held-out accuracy before training: {_describe(before)}",
        f"- Held-out accuracy after training: {_describe(after)}",
        "",
        "## Reproduce",
        "",
        "```",
        reproduce_command(cfg),
        "```",
        "",
    ]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body))
