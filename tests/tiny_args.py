"""Overrides that make a `streamrl train` run on tiny-random take seconds (tests/ is on sys.path)."""

TINY = [
    "model=tiny-random",
    "eval.size=4",
    "eval.before=false",
    "rollout.prompts_per_step=2",
    "rollout.samples_per_prompt=4",
    "rollout.max_new_tokens=8",
    "eval.max_new_tokens=8",
    "reward.extract=last_number",
    "checkpoint.save=false",
]
