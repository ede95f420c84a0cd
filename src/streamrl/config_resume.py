"""What a resumed run keeps from its saved state: the keys an override may not change (RESUME_FIXED), and
the one line that refuses a change, whichever way it came (a `key=value` override, a keyword of
`streamrl.train`, or a Config changed after it was made): config.refuse_changes_a_resume_would_ignore.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamrl.config_parse import ConfigError

# the held-out evaluations a resumed run's later ones are compared with
HELD_OUT = (
    "the base model's evaluation in eval.json and the periodic ones so far were measured with the saved value"
)

# what a resumed run takes from its saved state, so an override would be ignored, would corrupt it or
# would make its evaluations measure something else than the ones made before it
RESUME_FIXED = {
    "model": "the weights are the saved state's",
    "algo": "its preset was applied to the loss and advantage keys when the run started",
    "seed": "the data order and the random generators continue the saved ones",
    "task": "the data position is the saved stream's",
    "task_config.args": "the data position is the saved stream's",
    "task_config.columns": "the data position is the saved stream's",
    "task_config.split": "the data position is the saved stream's",
    "task_config.sources": "the data position is the saved stream's",
    "task_config.streaming": "the data position is the saved stream's",
    "task_config.shuffle_buffer": "the data position is the saved stream's",
    "task_config.eval_split": "the held-out set, and so the training stream, are the saved ones",
    "task_config.eval_data": "the held-out set, and so the training stream, are the saved ones",
    "task_config.few_shot": "the few-shot examples are excluded from the saved training stream",
    "task_config.few_shot_n": "the few-shot examples are excluded from the saved training stream",
    "eval.size": "the held-out set, and so the training stream, are the saved ones",
    "runtime.mode": "the groups one loop carries over are not read by the other",
    "rollout.sampler": "the saved data position and feedback are that sampler's",
    "advantage.name": "whether it has a critic: the saved optimizer state holds a value head's parameters "
    "with a critic's estimator (gae) and none without; switch only between estimators without one",
    "train.lr": "the optimizer and scheduler states restore the saved learning rate",
    "train.weight_decay": "the optimizer state restores the saved value",
    "train.betas": "the optimizer state restores the saved values",
    "train.lora_rank": "the saved adapters and optimizer state are that rank's (0: the full model's)",
    "train.lora_alpha": "it scales the saved adapters: another value would change the trained model",
    "train.lora_targets": "the saved adapters and optimizer state are those modules'",
    # what the held-out evaluations read: the base model's, kept in eval.json, and the periodic ones
    # already logged are compared with the final and later ones, measured the same way
    "task_config.system_prompt": HELD_OUT,
    "task_config.instruction": HELD_OUT,
    "task_config.chat_template": HELD_OUT,
    "reward.extract": HELD_OUT,
    "eval.max_new_tokens": HELD_OUT,
    "eval.temperature": "the periodic evaluations' pass@k, maj@k and avg@n were sampled at the saved value",
    "env.max_turns": HELD_OUT,
    "env.max_total_tokens": HELD_OUT,
    "env.max_tokens_per_turn": HELD_OUT,
    "env.top_k": HELD_OUT,
    "env.max_observation_chars": HELD_OUT,
    "env.code_timeout": HELD_OUT,
    "env.agent_timeout_s": HELD_OUT,
}


def refuse_a_fixed_change(saved: Any, cfg: Any, resume: str) -> None:
    """One line for the first RESUME_FIXED key whose value in `cfg` is not the one `saved` (the run's
    config.yaml, read as the run read it) holds."""
    for key, why in RESUME_FIXED.items():
        old, new = saved, cfg
        for part in key.split("."):
            old, new = getattr(old, part), getattr(new, part)
        if not _same_setting(key, old, new):
            raise ConfigError(
                f"resume: config key '{key}' is {old!r} in {resume}/config.yaml, not {new!r}: a resumed run "
                f"keeps it ({why}); drop the override, or start a new run from its checkpoint"
            )


def _same_setting(key: str, old: Any, new: Any) -> bool:
    """Equal values; a chat template file is recorded absolute, so the same file named relative is too;
    two advantage estimators alike in having a critic (a value head) or not."""
    if key == "advantage.name":  # late: the config layer imports no torch until it must
        from streamrl.algo import ADVANTAGES, advantage_spec

        if old not in ADVANTAGES or new not in ADVANTAGES:  # validate names the estimators there are
            return True
        return advantage_spec(old).critic == advantage_spec(new).critic
    if key == "task_config.chat_template" and old and new:
        return bool(Path(old).expanduser().resolve() == Path(new).expanduser().resolve())
    return bool(old == new)
