"""streamrl Config -> GRPOConfig fields of the same job, and what cannot be matched (benchmarks/vs_trl.py).

Pure: neither trl nor torch is imported, so the mapping is tested without them (tests/test_vs_trl.py).

One optimizer step of streamrl sees B = rollout.prompts_per_step prompts x G = samples_per_prompt samples,
split into micro-batches of at most train.token_budget padded tokens, with the loss normalised over all
tokens of the step (token-mean). The TRL job that matches it:

    num_generations = G,  generation_batch_size = B * G  (one generation per optimizer step)
    per_device_train_batch_size = m,  gradient_accumulation_steps = B * G / m
    (steps_per_generation defaults to gradient_accumulation_steps, so generation and optimizer step align,
     TRL skips the old-log-prob pass and the ratio is exactly 1: on-policy)
    loss_type = "dapo": the token sum over the global accumulated batch / its token count = token-mean
"""

from __future__ import annotations

from typing import Any

from streamrl.loop.dynamic_sampling import applies
from streamrl.models.precision import resolve_precision

# fields of GRPOConfig that switch off what streamrl's job does not do, whatever the config says
FIXED_FIELDS: dict[str, Any] = {
    "use_cpu": True,  # no GPU here; the benchmark compares the CPU stacks
    "use_vllm": False,  # TRL generates with transformers `generate`
    "bf16": False,  # set from streamrl's train.precision below (GRPOConfig's own default is True)
    "fp16": False,
    # GRPOConfig defaults gradient_checkpointing=True; streamrl's trainer does not checkpoint. transformers 5
    # renamed it activation_checkpointing (the old name only warns); run_trl drops the new one if unknown
    "gradient_checkpointing": False,
    "activation_checkpointing": False,
    "num_iterations": 1,  # one optimizer step per generated batch
    "beta": 0.0,  # no KL term and no reference model (check_supported requires loss.kl_coef=0)
    "importance_sampling_level": "token",
    "scale_rewards": "group",  # GRPO: (r - mean) / (std + eps) within each prompt's group
    "adam_epsilon": 1e-8,  # torch AdamW's default, which streamrl's trainer uses
    "shuffle_dataset": False,  # the dataset is already streamrl's training stream, in its order
    "top_k": 0,  # streamrl samples from the full distribution (temperature, top_p only)
    "repetition_penalty": 1.0,
    "eval_strategy": "no",
    "save_strategy": "no",
    "report_to": "none",
    "logging_steps": 1,  # in-memory only (report_to none): the progress callback reads reward per step
    "disable_tqdm": True,
    "dataloader_num_workers": 0,
    "remove_unused_columns": False,  # the reward function needs the problem_index column
    "log_completions": False,
}

# streamrl settings the benchmark requires to keep its defaults (or the TRL job would differ silently)
REQUIRED_DEFAULTS: dict[str, Any] = {
    "loss.name": "decoupled_ppo",
    "loss.aggregation": "token-mean",
    "advantage.name": "grpo",
    "advantage.std_normalize": True,
    "loss.kl_coef": 0.0,
    "train.mini_batches": 1,
    "train.lora_rank": 0,
    "rollout.sampler": "uniform",
    "rollout.replay_share": 0.0,
    "reward.scorer": "task",
}


def _get(cfg: Any, dotted: str) -> Any:
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def check_supported(cfg: Any) -> None:
    """Raise ValueError naming the first streamrl setting this TRL mapping does not cover."""
    for key, want in REQUIRED_DEFAULTS.items():
        if _get(cfg, key) != want:
            raise ValueError(
                f"vs_trl: {key}={_get(cfg, key)!r} has no TRL counterpart in this benchmark; "
                f"use {key}={want!r}"
            )
    if cfg.task.startswith(("env:", "agent:")):
        raise ValueError(f"vs_trl: task={cfg.task} is multi-turn; the benchmark compares single-turn tasks")


def micro_batch_size(samples: int, token_budget: int, seq_tokens: int) -> int:
    """The largest divisor m of `samples` with m * seq_tokens <= token_budget (at least 1).

    samples = B * G per optimizer step; seq_tokens = prompt + max_new_tokens of the longest sequence.
    streamrl packs micro-batches by the same token budget, so both sides hold similar activations.
    """
    fits = max(1, token_budget // max(seq_tokens, 1))
    return max(d for d in range(1, samples + 1) if samples % d == 0 and d <= fits)


def grpo_config_kwargs(cfg: Any, steps: int, micro_batch: int, output_dir: str) -> dict[str, Any]:
    """GRPOConfig(**kwargs) for the job `cfg` describes, trained for `steps` optimizer steps."""
    check_supported(cfg)
    r, t, loss = cfg.rollout, cfg.train, cfg.loss
    samples = r.prompts_per_step * r.samples_per_prompt
    if samples % micro_batch:
        raise ValueError(f"micro_batch {micro_batch} does not divide {samples} samples per step")
    return {
        **FIXED_FIELDS,
        "output_dir": output_dir,
        "seed": cfg.seed,
        "max_steps": steps,
        "num_generations": r.samples_per_prompt,
        "generation_batch_size": samples,
        "per_device_train_batch_size": micro_batch,
        "gradient_accumulation_steps": samples // micro_batch,
        "max_completion_length": r.max_new_tokens,
        "temperature": r.temperature,
        "top_p": r.top_p,
        "learning_rate": t.lr,
        "weight_decay": t.weight_decay,
        "adam_beta1": t.betas[0],
        "adam_beta2": t.betas[1],
        "max_grad_norm": t.grad_clip,
        "warmup_steps": t.warmup_steps,
        # streamrl: LambdaLR min(1, (s + 1) / warmup) then constant
        "lr_scheduler_type": "constant_with_warmup" if t.warmup_steps else "constant",
        "entropy_coef": loss.entropy_coef,
        "loss_type": "dapo",
        "epsilon": loss.eps_low,
        "epsilon_high": loss.eps_high,
        "mask_truncated_completions": loss.mask_truncated,
        "top_entropy_quantile": loss.entropy_top_q,
        # streamrl bf16 = fp32 weights + bf16 autocast; TRL's bf16 is amp too
        "bf16": resolve_precision(t.precision, cfg.device) == "bf16",
    }


def unmatched_settings(cfg: Any) -> list[str]:
    """What differs between the two jobs even with the mapping above, one line each."""
    out = [
        "execution: streamrl runs rollout and training concurrently (async, staleness eta="
        f"{cfg.max_staleness}, decoupled PPO corrects off-policy tokens); TRL is synchronous (generate, "
        "then train), so its ratio is exactly 1 and streamrl's is not"
        if cfg.runtime.mode == "async"
        else "execution: both synchronous (streamrl runtime.mode=colocated)",
        "generation: streamrl decodes with its own engine (continuous batching, max_batch="
        f"{cfg.rollout.max_batch}); TRL calls transformers `generate` on the whole batch of "
        f"{cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt} (padded, static batch)",
        "threads: streamrl async gives the trainer and each rollout worker their own core(s) "
        "(train.threads / runtime.rollout_threads); TRL uses all cores in one process (torch default)",
        "loss: streamrl decoupled_ppo clips pi/pi_prox (pi_prox = this step's weights) and weights each "
        "token by pi_prox/pi_behav (engine log-probs); TRL dapo clips pi/pi_old with pi_old = pi "
        "(on-policy) and no weight: the same loss when nothing is stale and engine and trainer "
        "log-probs agree",
        "advantage eps: streamrl (r - mean) / (std + 1e-6); TRL (r - mean) / (std + 1e-4); both unbiased std",
        "sampling RNG: the two sides draw different samples from the same distribution (seeds differ in use)",
        "micro-batches: streamrl packs by train.token_budget per micro-batch; TRL uses a fixed "
        "per_device_train_batch_size (chosen by the same budget for the longest sequence)",
    ]
    out.append(
        "startup: streamrl's training time includes spawning its rollout worker process and loading the "
        "model there (seconds); TRL's is trainer.train() on a model already loaded"
        if cfg.runtime.mode == "async"
        else "startup: both training times start with the model loaded"
    )
    engine, trainer = (resolve_precision(p, cfg.device) for p in (cfg.rollout.precision, cfg.train.precision))
    if engine != trainer or engine == "bf16":
        out.append(
            f"precision: streamrl decodes with a {engine} copy of the weights (rollout.precision) and "
            f"trains with train.precision={trainer}; TRL generates and trains the one model under "
            f"{'bf16 autocast' if trainer == 'bf16' else 'fp32'}"
        )
    if cfg.device == "cpu":
        out.append(
            "attention: both sides load the model with streamrl's load_model, so TRL's training passes also "
            "use streamrl's matmul attention (models/attention.py; ~2.8x faster backward than stock SDPA "
            "on CPU): TRL here is faster than with its stock attention"
        )
    if cfg.train.warmup_steps:
        out.append(
            "warm-up: streamrl's lr ramps (s + 1) / warmup_steps, TRL's s / warmup_steps (one step later)"
        )
    if applies(cfg):
        out.append(
            "dynamic sampling: streamrl drops groups whose rewards are all equal and samples more "
            f"(rollout.dynamic_sampling=true, up to {cfg.rollout.dynamic_sampling_rounds} rounds); "
            "TRL trains on them (zero advantage); pass --streamrl-set rollout.dynamic_sampling=false to match"
        )
    return out
