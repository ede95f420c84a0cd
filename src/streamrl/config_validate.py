"""Cross-field checks of a Config that the field types alone cannot express."""

from __future__ import annotations

from typing import Any

from streamrl.config_parse import ConfigError


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"config key '{name}' must be > 0, got {value}")


def _validate_distributed(cfg: Any) -> None:
    t = cfg.train
    _positive("train.world_size", t.world_size)
    _positive("train.dist_timeout_s", t.dist_timeout_s)
    if t.strategy == "single" and t.world_size != 1:
        raise ConfigError(
            f"config key 'train.world_size'={t.world_size} needs train.strategy=ddp or fsdp2 "
            "(single is 1 rank)"
        )
    if t.strategy == "single":
        return
    from streamrl.algo import advantage_spec

    if advantage_spec(cfg.advantage.name).token_level:
        raise ConfigError(
            f"train.strategy={t.strategy} does not train a value head yet: use train.strategy=single"
        )
    if t.strategy == "fsdp2" and t.lora_rank:
        raise ConfigError("train.strategy=fsdp2 with train.lora_rank > 0 is not supported: use ddp")
    if t.strategy == "fsdp2" and cfg.resume:
        raise ConfigError("resume with train.strategy=fsdp2 is not supported (sharded optimizer): use ddp")
    if t.dist_backend == "nccl" and not cfg.device.startswith("cuda"):
        raise ConfigError(f"train.dist_backend=nccl needs device=cuda, got {cfg.device}: use gloo or auto")


def _validate_vllm(cfg: Any) -> None:
    import importlib.util

    _positive("vllm.kv_cache_gib", cfg.vllm.kv_cache_gib)
    if not 0 < cfg.vllm.gpu_memory_utilization <= 1:
        raise ConfigError(
            "config key 'vllm.gpu_memory_utilization' must be in (0, 1], got "
            f"{cfg.vllm.gpu_memory_utilization}"
        )
    if cfg.runtime.mode == "colocated":
        raise ConfigError(
            "engine=vllm runs in the async rollout workers only: set runtime.mode=async (colocated shares "
            "the trainer's module with the engine; vLLM holds its own weights and pins its OpenMP threads)"
        )
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("engine=vllm needs vLLM: pip install 'streamrl[vllm]' (GPU: pip install vllm)")


def validate(cfg: Any) -> None:
    """Cross-field checks that types alone cannot express."""
    from streamrl.algo import registry  # late import: algo imports nothing from config

    for key, value, reg in (
        ("loss.name", cfg.loss.name, registry.POLICY_LOSSES),
        ("loss.aggregation", cfg.loss.aggregation, registry.AGGREGATIONS),
        ("advantage.name", cfg.advantage.name, registry.ADVANTAGES),
    ):
        if value not in reg:
            raise ConfigError(f"config key '{key}' must be one of {', '.join(sorted(reg))}, got {value!r}")
    token_level = registry.ADVANTAGES[cfg.advantage.name].token_level  # a value head (GAE)
    _positive("max_steps", cfg.max_steps + 1)  # 0 steps is allowed (eval only)
    _positive("rollout.prompts_per_step", cfg.rollout.prompts_per_step)
    _positive("rollout.samples_per_prompt", cfg.rollout.samples_per_prompt)
    _positive("rollout.max_new_tokens", cfg.rollout.max_new_tokens)
    _positive("train.lr", cfg.train.lr)
    _positive("reward.workers", cfg.reward.workers)
    if cfg.train.lora_rank < 0 or (cfg.train.lora_rank and not cfg.train.lora_targets):
        raise ConfigError("config key 'train.lora_rank' must be >= 0, with train.lora_targets non-empty")
    _positive("reward.timeout_s", cfg.reward.timeout_s)
    _positive("reward.judge_timeout_s", cfg.reward.judge_timeout_s)
    _positive("train.token_budget", cfg.train.token_budget)
    if cfg.train.save_every < 0 or cfg.train.save_every_s < 0:
        raise ConfigError(
            f"config keys 'train.save_every' and 'train.save_every_s' must be >= 0 (0 = off), got "
            f"{cfg.train.save_every} and {cfg.train.save_every_s}"
        )
    _positive("train.keep_states", cfg.train.keep_states)
    if cfg.checkpoint.every < 0:
        raise ConfigError(f"config key 'checkpoint.every' must be >= 0 (0 = off), got {cfg.checkpoint.every}")
    _positive("runtime.worker_timeout_s", cfg.runtime.worker_timeout_s)
    if cfg.runtime.max_restarts < 0:
        raise ConfigError(f"config key 'runtime.max_restarts' must be >= 0, got {cfg.runtime.max_restarts}")
    _validate_distributed(cfg)
    _positive("train.mini_batches", cfg.train.mini_batches)
    _positive("runtime.rollout_workers", cfg.runtime.rollout_workers)
    _positive("runtime.rollout_threads", cfg.runtime.rollout_threads)
    r = cfg.rollout
    _positive("rollout.sampler_pool", r.sampler_pool)
    _positive("rollout.curriculum_window", r.curriculum_window)
    _positive("rollout.replay_capacity", r.replay_capacity)
    for key, value in (
        ("sampler_target", r.sampler_target),
        ("curriculum_threshold", r.curriculum_threshold),
    ):
        if not 0 < value < 1:
            raise ConfigError(f"config key 'rollout.{key}' must be in (0, 1), got {value}")
    if not 0 <= r.replay_share < 1:
        raise ConfigError(f"config key 'rollout.replay_share' must be in [0, 1), got {r.replay_share}")
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
    _positive("task_config.shuffle_buffer", tc.shuffle_buffer)
    if not tc.split:
        raise ConfigError("config key 'task_config.split' must name a split, e.g. train")
    if tc.eval_split and tc.eval_data:
        raise ConfigError(
            "config keys 'task_config.eval_split' and 'task_config.eval_data': set one, not both"
        )
    if cfg.task_config.few_shot_n < 0:
        raise ConfigError(
            f"config key 'task_config.few_shot_n' must be >= 0, got {cfg.task_config.few_shot_n}"
        )
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
    if cfg.eval.n < 0 or cfg.eval.every < 0:
        raise ConfigError(
            f"config keys 'eval.n' and 'eval.every' must be >= 0, got {cfg.eval.n}, {cfg.eval.every}"
        )
    bad_k = [k for k in cfg.eval.k if not 1 <= k <= max(cfg.eval.n, 1)]
    if bad_k:
        raise ConfigError(f"config key 'eval.k' values must be in 1..eval.n={cfg.eval.n}, got {bad_k}")
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
    if cfg.task.startswith("agent:"):  # the agent function itself is imported with the task
        import importlib.util

        if importlib.util.find_spec("openai") is None:
            raise ConfigError("task=agent:... gives agents an openai client: pip install openai")
        spec = registry.ADVANTAGES[cfg.advantage.name]
        if spec.token_level or spec.greedy_baseline or cfg.loss.kl_in == "reward":
            raise ConfigError(
                "task=agent:... needs an outcome advantage without a value head or greedy baseline "
                f"(not {cfg.advantage.name}) and loss.kl_in=loss"
            )
    _validate_backend(cfg)
    if cfg.engine == "vllm":
        _validate_vllm(cfg)
    if cfg.observe.report_every < 0:
        raise ConfigError(f"config key 'observe.report_every' must be >= 0, got {cfg.observe.report_every}")
    if cfg.observe.wandb:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            raise ConfigError("observe.wandb=true needs the wandb package: pip install 'streamrl[wandb]'")
    _validate_reward_fns(cfg.reward)
    own_only = (cfg.reward.fn or cfg.reward.fns) and all(e.get("fn") != "task" for e in cfg.reward.fns)
    if "answer" in cfg.task_config.columns and cfg.task_config.columns["answer"] is None and not own_only:
        raise ConfigError(
            "config key 'task_config.columns.answer' is null (no reference answers), but the task's verifier "
            "scores the rewards: score with your own reward.fn / reward.fns (without fn: task)"
        )


FN_KEYS = ("fn", "weight", "name")


def _validate_reward_fns(rc: Any) -> None:
    """reward.fn / reward.fns: their shape here; the functions are imported by preflight."""
    if rc.fn and rc.fns:
        raise ConfigError(
            "config keys 'reward.fn' and 'reward.fns' exclude each other: list every function in reward.fns"
        )
    specs = [("reward.fn", rc.fn)] if rc.fn else []
    names = []
    for i, entry in enumerate(rc.fns):
        key = f"reward.fns[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("fn"), str) or not entry["fn"]:
            raise ConfigError(
                f"config key '{key}' must be a mapping with fn (e.g. {{fn: my_rewards.py:brevity, "
                f"weight: 0.5}}), got {entry!r}"
            )
        if unknown := sorted(set(entry) - set(FN_KEYS)):
            raise ConfigError(
                f"config key '{key}': unknown field(s) {', '.join(unknown)}; valid: {', '.join(FN_KEYS)}"
            )
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight != weight:
            raise ConfigError(f"config key '{key}.weight' must be a number, got {weight!r}")
        names.append(str(entry.get("name") or entry["fn"].rpartition(":")[2]))
        if entry["fn"] != "task":
            specs.append((f"{key}.fn", entry["fn"]))
    for key, spec in specs:
        where, _, attr = spec.rpartition(":")
        if not where or not attr.isidentifier():
            raise ConfigError(
                f"config key '{key}' must be package.module:function or path/to/file.py:function, "
                f"got {spec!r}"
            )
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError(
            f"config key 'reward.fns': two functions are named {dup[0]}: give one a name (name: ...)"
        )


def resolved_weight_sync(cfg: Any) -> str:
    """runtime.weight_sync with `auto` resolved: shm for the local backend, object_store for ray."""
    ws = cfg.runtime.weight_sync
    if ws != "auto":
        return ws
    return "object_store" if cfg.runtime.backend == "ray" else "shm"


def _validate_backend(cfg: Any) -> None:
    rt, ray = cfg.runtime, cfg.ray
    _positive("runtime.sync_timeout_s", rt.sync_timeout_s)
    for key in ("num_cpus", "rollout_cpus", "rollout_gpus", "trainer_cpus", "trainer_gpus", "max_restarts"):
        if getattr(ray, key) < 0:
            raise ConfigError(f"config key 'ray.{key}' must be >= 0, got {getattr(ray, key)}")
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
