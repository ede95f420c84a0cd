"""Run configuration: dataclasses, a YAML file and `key=value` overrides, validated before any work.

Every key is a dataclass field; nested sections are addressed with dots (`train.lr=1e-5`). An unknown
key, a value of the wrong type or a value outside its choices raises ConfigError with one line that
names the key and what is accepted.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """Bad configuration; the message is one line naming the key and the fix."""


@dataclass
class RolloutConfig:
    prompts_per_step: int = 8
    samples_per_prompt: int = 8
    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    max_batch: int = 128  # sequences decoded together by the engine
    # DAPO dynamic sampling: drop groups whose rewards are all equal and sample more until the batch
    # is full (at most dynamic_sampling_rounds * B dropped per step). On by default: in async mode the
    # extra rollouts use engine time that would otherwise idle while the trainer trains.
    dynamic_sampling: bool = True
    dynamic_sampling_rounds: int = 8


@dataclass
class RewardConfig:
    extract: Literal["answer_is", "boxed", "last_number"] = "answer_is"
    format_weight: float = 0.1  # added to the correctness reward (0/1) when the answer format is followed
    overlong_buffer: int = 0  # DAPO overlong shaping: penalty ramps over the last N tokens; 0 = off
    overlong_penalty: float = 1.0


@dataclass
class LossConfig:
    name: str = "decoupled_ppo"
    eps_low: float = 0.2
    eps_high: float = 0.28
    aggregation: str = "token-mean"
    kl_coef: float = 0.0  # > 0 loads a frozen reference model and penalises the KL to it
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    kl_in: Literal["loss", "reward"] = "loss"  # reward: subtract kl_coef * sum_t KL_t from each reward
    entropy_coef: float = 0.0  # entropy bonus: loss -= entropy_coef * entropy
    entropy_top_q: float = 1.0  # train on the top-q share of tokens by entropy only (0.2: "80/20")
    pos_weight: float = 1.0  # multiplies positive advantages (W-REINFORCE ~0.1; 0 = NSR)
    neg_weight: float = 1.0  # multiplies negative advantages
    # decoupled_ppo's proximal policy: "recompute" = the trainer's weights before this step (free with
    # train.mini_batches=1: the same forward, detached); "behav" = the sampling policy (no extra pass)
    prox: Literal["recompute", "behav"] = "recompute"
    behav_weight_cap: float = 0.0  # cap on pi_prox / pi_behav; 0 = no cap
    dual_clip: float = 0.0  # PPO dual clip c > 1 for A < 0 tokens (3.0 in the paper); 0 = off
    m2_threshold: float = 0.04  # M2PO bound on the masked mean of (log r)^2
    mask_truncated: bool = False  # DAPO: responses cut at max_new_tokens get no loss
    vf_coef: float = 0.5  # advantage.name=gae: loss += vf_coef * value loss
    value_clip: float = 0.2  # advantage.name=gae: values clipped to V_old +- value_clip in the value loss


@dataclass
class AdvantageConfig:
    name: str = "grpo"
    std_normalize: bool = True
    gamma: float = 1.0  # gae: discount (Open-Reasoner-Zero: gamma = lam = 1)
    lam: float = 1.0  # gae: GAE lambda


@dataclass
class TrainConfig:
    lr: float = 2e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0
    warmup_steps: int = 0
    token_budget: int = 4096  # max padded tokens per micro-batch
    mini_batches: int = 1  # optimizer steps per batch (PPO mini-batches); the policy version bumps once
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16 = fp32 weights with bf16 autocast
    threads: int = 0  # trainer torch threads; 0 = the cores not given to rollout workers (at least 1)
    save_checkpoint: bool = True


@dataclass
class EvalConfig:
    size: int = 400  # held-out problems, never trained on
    max_new_tokens: int = 48
    before: bool = True
    after: bool = True


@dataclass
class TaskConfig:
    system_prompt: str = "You are a calculator. Reply in the form 'The answer is <number>.'"
    instruction: str = ""  # appended to each question on its own line
    args: dict[str, Any] = field(default_factory=dict)  # passed to the task's generator


@dataclass
class EnvConfig:
    """Multi-turn environments (task=env:NAME). Token limits count completion tokens (model + observation)."""

    max_turns: int = 4  # model turns per episode
    max_total_tokens: int = 256  # completion tokens per episode; a longer episode ends with "length"
    max_tokens_per_turn: int = 64  # new tokens per model turn (a cut turn is closed and the env steps)
    top_k: int = 3  # env:search: passages per search
    max_observation_chars: int = 400  # tool output / passages are truncated to this many characters
    code_timeout: float = 5.0  # env:python_tool: seconds per program


@dataclass
class RuntimeConfig:
    # async: rollout worker processes generate while the trainer trains; colocated: one process
    # alternates generate and train with all cores (synchronous, needs max_staleness=0)
    mode: Literal["async", "colocated"] = "async"
    rollout_workers: int = 1
    rollout_threads: int = 1  # torch threads per rollout worker
    weight_update: Literal["inflight", "interrupt"] = "inflight"


@dataclass
class Config:
    model: str = "smollm2-135m-instruct"
    task: str = "rg:chain_sum"
    algo: str = ""  # a preset from streamrl/presets (grpo, dapo, ...) layered under these settings
    max_steps: int = 20
    max_time: float = (
        0.0  # stop training after this many seconds (0 = no limit); for equal-budget comparisons
    )
    max_staleness: int = 1  # eta: tokens at most this many policy versions old; 0 = synchronous
    run_dir: str = ""  # empty: runs/<timestamp>
    resume: str = ""  # a run directory to continue from
    seed: int = 0
    device: str = "cpu"
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    task_config: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    env: EnvConfig = field(default_factory=EnvConfig)


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _describe(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "a section with keys " + ", ".join(_field_types(tp))
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against type `tp` (converting lossless cases such as int -> float)."""
    origin = typing.get_origin(tp)
    bad = ConfigError(f"config key '{key}' expects {_describe(tp)}, got {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise bad
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(key, value, arg)
            except ConfigError:
                continue
        raise bad
    if tp is type(None):
        if value is not None:
            raise bad
        return None
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise bad
        return tuple(_coerce(f"{key}[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise bad
        return dict(value)
    raise bad


def _apply(obj: Any, key: str, value: Any, prefix: str = "") -> None:
    """Set dotted `key` on dataclass `obj`; dict values update nested sections key by key."""
    head, _, rest = key.partition(".")
    fields = _field_types(type(obj))
    full = f"{prefix}{head}"
    if head not in fields:
        hint = difflib.get_close_matches(head, fields, n=1)
        where = f"section '{prefix[:-1]}'" if prefix else "the top level"
        suggestion = f" (did you mean '{prefix}{hint[0]}'?)" if hint else ""
        raise ConfigError(
            f"unknown config key '{full}'{suggestion}; valid keys at {where}: {', '.join(fields)}"
        )
    tp = fields[head]
    if dataclasses.is_dataclass(tp):
        section = getattr(obj, head)
        if rest:
            _apply(section, rest, value, f"{full}.")
        elif isinstance(value, dict):
            for k, v in value.items():
                _apply(section, str(k), v, f"{full}.")
        else:
            raise ConfigError(f"config key '{full}' is {_describe(tp)}; set e.g. '{full}.<key>=value'")
        return
    if rest:
        if typing.get_origin(tp) is dict or tp is dict:
            getattr(obj, head)[rest] = value
            return
        raise ConfigError(f"config key '{full}' is not a section; use '{full}=value'")
    setattr(obj, head, _coerce(full, value, tp))


def parse_override(text: str) -> tuple[str, Any]:
    """'train.lr=1e-5' -> ('train.lr', 1e-05); values are parsed as YAML scalars/lists/dicts."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key=value (for example max_steps=10)")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    # YAML reads 1e-5 as a string (it wants 1.0e-5); accept the usual float spelling.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value.lower() for c in ".e") else value
        except ValueError:
            pass
    return key.strip(), value


def from_dict(data: dict[str, Any]) -> Config:
    """A Config from a plain dict (e.g. a run directory's config.yaml), validated."""
    cfg = Config()
    for k, v in data.items():
        _apply(cfg, str(k), v)
    validate(cfg)
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults <- YAML file <- overrides, then validate."""
    cfg = Config()
    parsed = [parse_override(o) for o in overrides]
    resume = next((str(v) for k, v in parsed if k == "resume"), "")
    if resume:  # continue a run: its resolved config is the base, the overrides still apply
        if path is not None:
            raise ConfigError(
                "resume=RUN_DIR takes its config from RUN_DIR/config.yaml; drop the config file"
            )
        path = Path(resume) / "config.yaml"
        if not path.is_file():
            raise ConfigError(f"resume: '{resume}' is not a run directory (no config.yaml)")
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file '{path}' not found")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file '{path}' must hold a mapping of keys to values")
    algo = next((str(v) for k, v in reversed(parsed) if k == "algo"), str(data.get("algo", "")))
    if algo and not resume:  # a resumed run's config.yaml already holds the resolved preset
        from streamrl.presets import load_preset

        try:
            preset = load_preset(algo)
        except ValueError as e:
            raise ConfigError(f"config key 'algo': {e}") from e
        for k, v in preset.items():
            _apply(cfg, str(k), v)
    for k, v in data.items():
        _apply(cfg, str(k), v)
    for k, v in parsed:
        _apply(cfg, k, v)
    if resume:
        cfg.run_dir = resume
    validate(cfg)
    return cfg


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"config key '{name}' must be > 0, got {value}")


def validate(cfg: Config) -> None:
    """Cross-field checks that types alone cannot express."""
    from streamrl.algo import registry  # late import: algo imports nothing from config

    _positive("max_steps", cfg.max_steps + 1)  # 0 steps is allowed (eval only)
    _positive("rollout.prompts_per_step", cfg.rollout.prompts_per_step)
    _positive("rollout.samples_per_prompt", cfg.rollout.samples_per_prompt)
    _positive("rollout.max_new_tokens", cfg.rollout.max_new_tokens)
    _positive("train.lr", cfg.train.lr)
    _positive("train.token_budget", cfg.train.token_budget)
    _positive("train.mini_batches", cfg.train.mini_batches)
    _positive("runtime.rollout_workers", cfg.runtime.rollout_workers)
    _positive("runtime.rollout_threads", cfg.runtime.rollout_threads)
    if cfg.max_staleness < 0:
        raise ConfigError(f"config key 'max_staleness' must be >= 0, got {cfg.max_staleness}")
    if cfg.runtime.mode == "colocated" and cfg.max_staleness != 0:
        raise ConfigError(
            "runtime.mode=colocated is synchronous: set max_staleness=0, or runtime.mode=async for eta > 0"
        )
    _positive("eval.max_new_tokens", cfg.eval.max_new_tokens)
    _positive("rollout.max_batch", cfg.rollout.max_batch)
    if not 0 < cfg.loss.entropy_top_q <= 1:
        raise ConfigError(f"config key 'loss.entropy_top_q' must be in (0, 1], got {cfg.loss.entropy_top_q}")
    if cfg.loss.dual_clip and cfg.loss.dual_clip <= 1:
        raise ConfigError(f"config key 'loss.dual_clip' must be 0 (off) or > 1, got {cfg.loss.dual_clip}")
    if cfg.rollout.temperature < 0:
        raise ConfigError(f"config key 'rollout.temperature' must be >= 0, got {cfg.rollout.temperature}")
    if not 0 < cfg.rollout.top_p <= 1:
        raise ConfigError(f"config key 'rollout.top_p' must be in (0, 1], got {cfg.rollout.top_p}")
    if cfg.eval.size < 0:
        raise ConfigError(f"config key 'eval.size' must be >= 0, got {cfg.eval.size}")
    if not (0 <= cfg.advantage.gamma <= 1 and 0 <= cfg.advantage.lam <= 1):
        raise ConfigError(
            f"config keys 'advantage.gamma' and 'advantage.lam' must be in [0, 1], got "
            f"{cfg.advantage.gamma} and {cfg.advantage.lam}"
        )
    if cfg.loss.vf_coef < 0 or cfg.loss.value_clip <= 0:
        raise ConfigError(
            f"config keys 'loss.vf_coef' must be >= 0 and 'loss.value_clip' > 0, got "
            f"{cfg.loss.vf_coef} and {cfg.loss.value_clip}"
        )
    for key in ("max_turns", "max_total_tokens", "max_tokens_per_turn", "top_k", "max_observation_chars"):
        _positive(f"env.{key}", getattr(cfg.env, key))
    _positive("env.code_timeout", cfg.env.code_timeout)
    for key, value, reg in (
        ("loss.name", cfg.loss.name, registry.POLICY_LOSSES),
        ("loss.aggregation", cfg.loss.aggregation, registry.AGGREGATIONS),
        ("advantage.name", cfg.advantage.name, registry.ADVANTAGES),
    ):
        if value not in reg:
            raise ConfigError(f"config key '{key}' must be one of {', '.join(sorted(reg))}, got {value!r}")


def to_dict(cfg: Config) -> dict[str, Any]:
    def plain(x: Any) -> Any:
        if isinstance(x, tuple):
            return list(x)
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x

    return {k: plain(v) for k, v in dataclasses.asdict(cfg).items()}


def dump_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
