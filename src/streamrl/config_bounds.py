"""The accepted range of every numeric config key: one table, checked before any work (validate) and
shown by `streamrl config`. A value outside it raises ConfigError naming the key, the value and the range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from streamrl.config_parse import ConfigError


@dataclass(frozen=True)
class Bound:
    """lo < v (or lo <= v) and v < hi (or v <= hi); `or_zero`: 0 is accepted too (it turns the thing off)."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    or_zero: bool = False
    zero: str = "off"  # what 0 means, where or_zero

    def accepts(self, v: float) -> bool:
        if self.or_zero and v == 0:
            return True
        if not math.isfinite(v):
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        return self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)

    def text(self) -> str:
        """'> 0', '>= 1', 'in (0, 1]', '0 (off) or > 1', 'finite'."""
        if self.lo is not None and self.hi is not None:
            lo, hi = _show(self.lo), _show(self.hi)
            out = f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"
        elif self.lo is not None:
            out = f"{'>' if self.lo_open else '>='} {_show(self.lo)}"
        elif self.hi is not None:
            out = f"{'<' if self.hi_open else '<='} {_show(self.hi)}"
        else:
            out = "finite"
        return f"0 ({self.zero}) or {out}" if self.or_zero else out


POSITIVE = Bound(0, lo_open=True)
NON_NEGATIVE = Bound(0)
AT_LEAST_1 = Bound(1)
UNIT = Bound(0, 1)  # a probability or a share
UNIT_OPEN = Bound(0, 1, lo_open=True, hi_open=True)
UNIT_NO_ZERO = Bound(0, 1, lo_open=True)
UNIT_NO_ONE = Bound(0, 1, hi_open=True)

# key -> accepted range; a tuple-valued key (train.betas, eval.k) bounds each of its values.
BOUNDS: dict[str, Bound] = {
    "max_steps": NON_NEGATIVE,  # 0: evaluate only
    "max_time": NON_NEGATIVE,
    "max_staleness": NON_NEGATIVE,
    "seed": NON_NEGATIVE,
    "runtime.rollout_workers": POSITIVE,
    "runtime.rollout_threads": POSITIVE,
    "runtime.sync_timeout_s": POSITIVE,
    "runtime.max_restarts": NON_NEGATIVE,
    "runtime.worker_timeout_s": POSITIVE,
    "ray.num_cpus": NON_NEGATIVE,
    "ray.rollout_cpus": NON_NEGATIVE,
    "ray.rollout_gpus": NON_NEGATIVE,
    "ray.trainer_cpus": NON_NEGATIVE,
    "ray.trainer_gpus": NON_NEGATIVE,
    "ray.max_restarts": NON_NEGATIVE,
    "task_config.few_shot_n": NON_NEGATIVE,
    "task_config.shuffle_buffer": POSITIVE,
    "task_config.max_prompt_tokens": NON_NEGATIVE,  # 0: what fits the context and train.token_budget
    "rollout.prompts_per_step": POSITIVE,
    "rollout.samples_per_prompt": POSITIVE,
    "rollout.max_new_tokens": POSITIVE,
    # below 1e-4 a sample is the greedy one and its log-prob at T carries no gradient, but for top logits
    # that tie, where it grows as 1/T (inf near fp32's floor); 0 samples greedily, its log-probs at T = 1
    "rollout.temperature": Bound(1e-4, or_zero=True, zero="greedy"),
    "rollout.top_p": UNIT_NO_ZERO,
    "rollout.max_batch": POSITIVE,
    "rollout.spec_drafts": NON_NEGATIVE,  # 0: off
    "rollout.spec_prompts": POSITIVE,
    "rollout.spec_branch_min": POSITIVE,
    "rollout.spec_lenience": NON_NEGATIVE,  # 0: exact
    "rollout.dynamic_sampling_rounds": NON_NEGATIVE,
    "rollout.screen_samples": NON_NEGATIVE,  # 0: off
    "rollout.sampler_pool": POSITIVE,
    "rollout.sampler_target": UNIT_OPEN,
    "rollout.curriculum_threshold": UNIT_OPEN,
    "rollout.curriculum_window": POSITIVE,
    "rollout.replay_share": UNIT_NO_ONE,
    "rollout.replay_capacity": POSITIVE,
    "reward.format_weight": NON_NEGATIVE,
    "reward.overlong_buffer": NON_NEGATIVE,
    "reward.overlong_penalty": NON_NEGATIVE,
    "reward.length_penalty": NON_NEGATIVE,
    "reward.workers": POSITIVE,
    "reward.timeout_s": POSITIVE,
    "reward.step_budget_s": NON_NEGATIVE,  # 0: no limit
    "reward.cache_size": NON_NEGATIVE,
    "reward.judge_timeout_s": POSITIVE,
    "reward.judge_pass_threshold": UNIT,  # judge scores are in [0, 1]
    "loss.eps_low": NON_NEGATIVE,  # >= 1: no lower clip (CISPO)
    "loss.eps_high": NON_NEGATIVE,
    "loss.kl_coef": NON_NEGATIVE,
    "loss.entropy_coef": Bound(),  # < 0 penalises entropy
    "loss.entropy_top_q": UNIT_NO_ZERO,
    "loss.pos_weight": NON_NEGATIVE,
    "loss.neg_weight": NON_NEGATIVE,
    "loss.behav_weight_cap": NON_NEGATIVE,
    "loss.dual_clip": Bound(1, lo_open=True, or_zero=True),
    "loss.m2_threshold": POSITIVE,
    "loss.vf_coef": NON_NEGATIVE,
    "loss.value_clip": POSITIVE,
    "loss.rc_upper": POSITIVE,
    "loss.rc_lower": NON_NEGATIVE,
    "loss.rc_geo_tol": POSITIVE,
    "loss.rc_opsm_delta": NON_NEGATIVE,
    "advantage.gamma": UNIT,
    "advantage.lam": UNIT,
    "train.lr": POSITIVE,
    "train.weight_decay": NON_NEGATIVE,
    "train.betas": UNIT_NO_ONE,
    "train.grad_clip": POSITIVE,
    "train.warmup_steps": NON_NEGATIVE,
    "train.token_budget": POSITIVE,
    "train.mini_batches": POSITIVE,
    "train.threads": NON_NEGATIVE,
    "train.save_every": NON_NEGATIVE,
    "train.save_every_s": NON_NEGATIVE,
    "train.keep_states": POSITIVE,
    "checkpoint.every": NON_NEGATIVE,
    "checkpoint.keep": NON_NEGATIVE,
    "train.lora_rank": NON_NEGATIVE,
    "train.lora_alpha": POSITIVE,
    "train.world_size": POSITIVE,
    "train.dist_timeout_s": POSITIVE,
    "eval.size": NON_NEGATIVE,
    "eval.max_new_tokens": NON_NEGATIVE,  # 0: rollout.max_new_tokens
    "eval.every": NON_NEGATIVE,
    "eval.n": NON_NEGATIVE,
    "eval.k": AT_LEAST_1,
    "eval.temperature": NON_NEGATIVE,
    "env.max_turns": POSITIVE,
    "env.max_total_tokens": POSITIVE,
    "env.max_tokens_per_turn": POSITIVE,
    "env.top_k": POSITIVE,
    "env.max_observation_chars": POSITIVE,
    "env.code_timeout": POSITIVE,
    "env.agent_timeout_s": NON_NEGATIVE,
    "vllm.kv_cache_gib": POSITIVE,
    "vllm.gpu_memory_utilization": UNIT_NO_ZERO,
    "observe.report_every": NON_NEGATIVE,
}


def _show(v: Any) -> str:
    """A number as the user would type it: -10, 2e-05, 0.5 (an integral float without its '.0')."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return repr(v)


def _get(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check_bounds(cfg: Any) -> None:
    """ConfigError for the first key of BOUNDS whose value is outside its range."""
    for key, bound in BOUNDS.items():
        value = _get(cfg, key)
        values = value if isinstance(value, tuple) else (value,)
        if not all(bound.accepts(v) for v in values):
            each = " (each value)" if isinstance(value, tuple) else ""
            raise ConfigError(f"config key '{key}' must be {bound.text()}{each}, got {_show(value)}")
