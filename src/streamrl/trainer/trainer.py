"""One optimizer step over a batch of trajectories: micro-batches, loss, backward, clip, AdamW."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from streamrl.algo import advantage_spec, aggregation_fn, correction_spec, kl_fn, loss_spec
from streamrl.algo.aggregation import batch_normalizer
from streamrl.algo.token_weights import entropy_top_q_mask, sign_weights
from streamrl.config import AdvantageConfig, Config, LossConfig, TrainConfig
from streamrl.models import lora
from streamrl.models.attention import training_kernels
from streamrl.models.compute_weights import compute_weights, installed
from streamrl.models.export import save_model
from streamrl.models.frozen import freeze
from streamrl.models.lora import apply_lora, is_lora, merged_state
from streamrl.models.precision import resolve_precision
from streamrl.trainer import boundaries
from streamrl.trainer.allocator import keep_freed_memory
from streamrl.trainer.batching import MicroBatch
from streamrl.trainer.critic import CriticTargets, ValueHead, clipped_value_loss
from streamrl.trainer.logprobs import completion_forward, completion_logprobs
from streamrl.trainer.mini_batch_cuts import OWN, MiniBatchCuts, mini_batch_cuts
from streamrl.trainer.objective import (
    accumulate,
    correction_params,
    finish,
    loss_params,
    policy_objective,
)
from streamrl.trainer.prepare import kl_reward_penalty, prepare_batch
from streamrl.types import TrainBatch

# the engine/trainer log-prob gap's sum and its tokens, merged over micro-batches and ranks
GAP_SUM, GAP_TOKENS = "_gap_sum", "_gap_tokens"


def disable_dropout(model: Any) -> None:
    """No dropout in the policy: the loss compares log-probs of separate passes (the trainer's with the
    engine's, pi_theta with pi_old) that dropout noise would set apart. Dropout modules get p = 0, and
    float attributes a module reads at each forward (Llama's attention_dropout, Bloom's hidden_dropout)
    are set to 0."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
        for name, value in list(vars(m).items()):
            if name.endswith("dropout") and isinstance(value, float):
                setattr(m, name, 0.0)


class Trainer:
    def __init__(
        self,
        model: Any,
        train: TrainConfig,
        loss: LossConfig,
        advantage: AdvantageConfig,
        *,
        temperature: float,
        max_new_tokens: int,
        pad_id: int,
    ) -> None:
        """train/loss/advantage: the config sections; temperature: the sampling temperature the log-probs
        are recomputed at; max_new_tokens: the constant length of the token-sum-norm aggregation."""
        self.model = model
        disable_dropout(model)
        self.train, self.loss, self.advantage = train, loss, advantage
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.pad_id = pad_id
        self.version = 0
        self._before_update = True  # no optimizer step of the current batch yet (step)
        t = train
        self.ref_model = None
        if loss.kl_coef > 0:  # before any adapter: the reference is the initial policy
            self.ref_model = freeze(copy.deepcopy(model))
        if t.lora_rank > 0:
            apply_lora(model, t.lora_rank, t.lora_alpha, t.lora_targets)
        # a token-level advantage (GAE): a value head on the policy's last hidden state, trained with it
        self.value_head: ValueHead | None = None
        self.advantage_spec = advantage_spec(advantage.name)
        if self.advantage_spec.critic:
            dev = next(model.parameters()).device
            self.value_head = ValueHead(model.config.hidden_size).to(dev)
        self.forward_model: Any = model  # what trains: the model, or its DDP wrapper
        # bf16 autocast on fp32 master weights (train.precision; auto: where the device has bf16 units)
        self.bf16 = resolve_precision(t.precision, next(model.parameters()).device) == "bf16"
        if next(model.parameters()).device.type == "cpu":
            keep_freed_memory()  # each step's activations reuse the last step's pages (trainer/allocator.py)
        # the CPU Llama path (models/fused_llama.py): fused layers on weights cast once per optimizer step;
        # LoRA and data parallel keep transformers' modules (PEFT's and DDP/FSDP2's hooks live there)
        self.compute_dtype: torch.dtype | None = None
        if installed(model) and t.lora_rank == 0 and t.strategy == "single":
            self.compute_dtype = torch.bfloat16 if self.bf16 else next(model.parameters()).dtype
        self._distribute()  # hook: data-parallel wrapping/sharding, before the optimizer sees the params
        self.params = [p for p in model.parameters() if p.requires_grad]
        if self.value_head is not None:
            self.params += list(self.value_head.parameters())
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=t.lr,
            betas=t.betas,
            weight_decay=t.weight_decay,
            # one pass over each tensor instead of ~10 elementwise kernels: 0.46 -> 0.14 s per step for
            # SmolLM2 on one CPU thread (FSDP2's sharded DTensor parameters keep the default path)
            fused=t.strategy != "fsdp2",
        )
        warm = max(t.warmup_steps, 0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0
        )
        self.loss_spec = loss_spec(loss.name)
        self.correction = correction_spec(loss.rollout_correction)
        self.loss_params, self.correction_params = loss_params(loss), correction_params(loss)
        self.aggregate = aggregation_fn(loss.aggregation)
        self.kl = kl_fn(loss.kl_estimator)
        # called before each micro-batch and each decoder layer's forward and backward (set_boundary)
        self.boundary: Callable[[], object] | None = None
        self._remove_boundaries: Callable[[], None] | None = None

    def set_boundary(self, fn: Callable[[], object] | None) -> None:
        """Where the async loop's elastic cores may re-size the threads (trainer/boundaries.py): before
        each micro-batch and each decoder layer, forward and backward; None removes them."""
        if self._remove_boundaries is not None:
            self._remove_boundaries()
            self._remove_boundaries = None
        self.boundary = fn
        if fn is not None:
            self._remove_boundaries = boundaries.install(self.model, fn)

    @classmethod
    def from_config(cls, model: Any, cfg: Config, pad_id: int, **kw: Any) -> Trainer:
        """The trainer a run's Config describes (its train, loss and advantage sections)."""
        r = cfg.rollout
        return cls(
            model,
            cfg.train,
            cfg.loss,
            cfg.advantage,
            temperature=r.temperature,
            max_new_tokens=r.max_new_tokens,
            pad_id=pad_id,
            **kw,
        )

    # ---- data-parallel hooks (trainer/distributed.py overrides them; one process: no-ops) ----------
    def _distribute(self) -> None:
        """Wrap or shard self.model for data parallelism (sets self.forward_model)."""

    def _my_share(self, idx: list[int]) -> list[tuple[int, float]]:
        """(micro-batch index, loss weight) this process runs for one mini-batch; weight 0 = a pass
        that only joins the collectives."""
        return [(i, 1.0) for i in idx]

    def _grad_sync(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        """Context of one backward; `last`: the mini-batch's final backward (where gradients sync)."""
        return contextlib.nullcontext()

    def _clip_grads(self) -> float:
        """Clip to train.grad_clip; -> the total grad norm before clipping."""
        return float(torch.nn.utils.clip_grad_norm_(self.params, self.train.grad_clip))

    def _reduce_metrics(self, loss_sum: float, totals: dict[str, float]) -> tuple[float, dict[str, float]]:
        """Sum the loss and token-weighted metric totals over all processes."""
        return loss_sum, totals

    def _gather_values(self, values: torch.Tensor) -> torch.Tensor:
        """A 1-D tensor of every process's values, concatenated in rank order."""
        return values

    def _after_step(self) -> None:
        """Runs on every process after the optimizer steps of one batch."""

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state_dict, whole (what a run state saves)."""
        return self.optimizer.state_dict()

    def engine_state(self) -> dict[str, torch.Tensor] | None:
        """Weights for a colocated engine; None: it shares self.model (nothing to copy)."""
        return None

    def close(self) -> None:
        """Stop helper processes (distributed followers); idempotent."""

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.bf16:
            dev = next(self.model.parameters()).device.type
            return torch.autocast(device_type=dev, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _compute_weights(self) -> contextlib.AbstractContextManager[Any]:
        """Context of one optimizer step's micro-batches (the weights do not change inside)."""
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return compute_weights(self.model, self.compute_dtype)

    def prepare(self, batch: TrainBatch) -> tuple[list[MicroBatch], list[CriticTargets | None]]:
        """Micro-batches (in train.packing's or train.shared_prompt's layout, else padded: trainer/layout.py)
        and critic targets for `batch` (trainer/prepare.py)."""
        return prepare_batch(self, batch)

    def _needs_trainer_old(self) -> bool:
        """The trainer's log-probs before the step are read (decoupled PPO's proximal policy, a rollout
        correction); with one optimizer step per batch they come free with the training forward."""
        proximal = self.loss_spec.proximal and self.loss.prox == "recompute"
        return proximal or self.correction.name != "none"

    def _prox_logprobs(self, mbs: list[MicroBatch]) -> list[torch.Tensor | None]:
        """pi_old per micro-batch: only an extra pass when several optimizer steps share one batch."""
        if not self._needs_trainer_old() or min(self.train.mini_batches, len(mbs)) == 1:
            return [None] * len(mbs)  # none needed, or computed from the training forward (same weights)
        # the training forward's kernels: its compute weights and precision, its attention at any length
        with torch.no_grad(), self._autocast(), self._compute_weights(), training_kernels():
            return [completion_logprobs(self.model, mb, self.temperature)[0] for mb in mbs]

    def _micro_step(
        self,
        mb: MicroBatch,
        norm: float,
        prox: torch.Tensor | None,
        totals: dict[str, float],
        critic: CriticTargets | None = None,
        weight: float = 1.0,
        cuts: MiniBatchCuts = OWN,
        index: int = 0,
    ) -> float:
        """Forward + backward of one micro-batch; accumulates token-weighted metrics into totals.

        The backward uses loss * weight (data parallel: world size, or 0 for a collective-only pass,
        whose metrics are not counted); cuts: the mini-batch's token selections (mini_batch_cuts.py),
        `index`: this micro-batch's in them; returns the unweighted loss."""
        dev = next(self.model.parameters()).device
        mask = mb.loss_mask.to(dev)
        temp = self.temperature
        lc = self.loss
        with self._autocast():
            logprobs, entropy, hidden = completion_forward(
                self.forward_model,
                mb,
                temp,
                return_entropy=True,
                entropy_grad=lc.entropy_coef != 0,
                return_hidden=critic is not None,
            )
        assert entropy is not None
        behav = mb.old_logprobs.to(dev)
        loss_mask = cuts.entropy.get(index)
        if loss_mask is None:
            loss_mask = entropy_top_q_mask(entropy, mask, lc.entropy_top_q)
        advantages = sign_weights(mb.advantages.to(dev), lc.pos_weight, lc.neg_weight)
        read = self.train.mini_batches == 1 or self._needs_trainer_old()  # by the loss, or its metrics
        if prox is None and self._before_update and read:
            prox = logprobs.detach()  # the weights before this batch's only optimizer step
        per_token, metrics = policy_objective(
            self.loss_spec,
            self.correction,
            self.loss_params,
            self.correction_params,
            logprobs=logprobs,
            behav=behav,
            trainer_old=None if prox is None else prox.to(dev),
            advantages=advantages,
            mask=mask,  # a sequence's ratio and statistics count all its tokens, trained on or not
            prox_mode=lc.prox,
            m2_keep=cuts.m2.get(index),
        )
        # the selection (entropy_top_q) trains the policy term on its tokens; the others keep
        # their place in every aggregation (as a rollout correction's drops do), and the KL and entropy
        # terms below regularise every token
        per_token = torch.where(loss_mask > 0, per_token, torch.zeros_like(per_token))
        if self.ref_model is not None and lc.kl_in == "loss":
            with torch.no_grad(), self._autocast():
                ref_lp, _ = completion_logprobs(self.ref_model, mb, temp)
            kl = self.kl(logprobs, ref_lp)
            per_token = per_token + lc.kl_coef * kl
            metrics["kl_ref"] = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1))
        if lc.entropy_coef != 0:
            per_token = per_token - lc.entropy_coef * entropy
        loss = self.aggregate(per_token, mask, norm)
        if critic is not None:
            assert self.value_head is not None and hidden is not None
            with self._autocast():
                values = self.value_head(hidden)  # [B, C], same forward as the policy's log-probs
            ret = critic.returns.to(dev)
            v_loss, clipped = clipped_value_loss(values, critic.old_values.to(dev), ret, lc.value_clip)
            loss = loss + lc.vf_coef * self.aggregate(v_loss, mask, norm)
            denom = mask.sum().clamp(min=1)
            metrics.update(
                value_loss=float((v_loss.detach() * mask).sum() / denom),
                value_mean=float((values.detach() * mask).sum() / denom),
                return_mean=float((ret * mask).sum() / denom),
                value_clip_frac=float((clipped * mask).sum() / denom),
                gae_advantage_mean=float((mb.advantages.to(dev) * mask).sum() / denom),
            )
        (loss * weight).backward()
        if weight == 0:
            return 0.0
        n = float(mask.sum())
        metrics["entropy"] = float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1))
        metrics["entropy_mask_kept_frac"] = float(loss_mask.sum() / mask.sum().clamp(min=1))
        # log-prob gap between the engine and the trainer on the same weights (0 when fully on-policy):
        # against the weights before the step (prox), or this forward's before the first optimizer step;
        # averaged over the tokens it was measured on (step: GAP_SUM / GAP_TOKENS)
        base = prox if prox is not None else (logprobs.detach() if self._before_update else None)
        if base is not None:
            totals[GAP_SUM] = totals.get(GAP_SUM, 0.0) + float(((base.to(dev) - behav).abs() * mask).sum())
            totals[GAP_TOKENS] = totals.get(GAP_TOKENS, 0.0) + n
        accumulate(totals, metrics, n)
        totals["_tokens"] = totals.get("_tokens", 0.0) + n
        return float(loss.detach())

    def kl_reward_penalty(self, batch: TrainBatch) -> list[float]:
        """kl_coef * each trajectory's summed KL(behaviour || reference) (trainer/prepare.py)."""
        return kl_reward_penalty(self, batch)

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One policy version: train.mini_batches clipped AdamW steps over the batch's micro-batches."""
        start = time.perf_counter()
        self.model.train()
        mbs, critic = self.prepare(batch)
        prox = self._prox_logprobs(mbs)
        k = min(self.train.mini_batches, len(mbs))
        totals: dict[str, float] = {}
        loss_sum = 0.0
        grad_norms: list[float] = []
        lrs: list[float] = []
        self._before_update = True  # until this batch's first optimizer step
        for j in range(k):
            idx = list(range(j, len(mbs), k))  # interleaved: mini-batches are not sorted by length
            masks = [mbs[i].loss_mask for i in idx]
            norm = batch_normalizer(self.loss.aggregation, masks, self.max_new_tokens)
            mine = self._my_share(idx)
            with self._compute_weights():
                cuts = mini_batch_cuts(self, mbs, mine, len(idx), prox)
                for n, (i, w) in enumerate(mine):
                    if self.boundary is not None:
                        self.boundary()
                    with self._grad_sync(last=n == len(mine) - 1):
                        loss_sum += self._micro_step(mbs[i], norm, prox[i], totals, critic[i], w, cuts, i)
            grad_norms.append(self._clip_grads())
            lrs.append(self.optimizer.param_groups[0]["lr"])  # what this update used (warmup moves it)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self._before_update = False
            self.scheduler.step()  # train.warmup_steps counts optimizer steps
        self.version += 1
        loss_sum, totals = self._reduce_metrics(loss_sum, totals)
        self._after_step()
        n_tokens = totals.pop("_tokens", 0.0)
        gap, gap_tokens = totals.pop(GAP_SUM, 0.0), totals.pop(GAP_TOKENS, 0.0)
        out = finish(totals, n_tokens)
        if gap_tokens:
            out["behav_logprob_gap"] = gap / gap_tokens
        real = sum(len(t.prompt_ids) + len(t.completion_ids) for t in batch.trajectories)
        padded = sum(mb.num_tokens for mb in mbs)
        out.update(
            loss=loss_sum / k,
            grad_norm=sum(grad_norms) / len(grad_norms),
            lr=sum(lrs) / len(lrs),  # the step's updates' (the scheduler already gives the next step's)
            micro_batches=len(mbs),
            optimizer_steps=k,
            tokens_trained=real,
            padded_tokens=padded,
            # positions the forward ran on padding (train.packing makes it 0)
            padding_frac=1.0 - sum(mb.real_positions for mb in mbs) / max(padded, 1),
            train_time=time.perf_counter() - start,
        )
        return out

    def policy_state(self) -> dict[str, torch.Tensor]:
        """The weights an engine or a plain transformers model loads (LoRA adapters merged in)."""
        return merged_state(self.model) if is_lora(self.model) else self.model.state_dict()

    def save(self, path: str, tokenizer: Any, dtype: torch.dtype = torch.float32) -> None:
        """An HF model directory loadable by transformers' from_pretrained, its weights (LoRA: merged)
        in `dtype`; + value_head.pt with gae; + adapter/ with LoRA, the adapters alone in PEFT's format
        (fp32, what a resume restores)."""
        save_model(self.model, path, self.policy_state(), dtype)
        tokenizer.save_pretrained(path)
        if is_lora(self.model):
            lora.save_adapter(self.model, Path(path) / lora.ADAPTER_DIR)
        if self.value_head is not None:
            torch.save(self.value_head.state_dict(), Path(path) / "value_head.pt")

    def load_adapter(self, path: str | Path) -> None:
        """Restore the LoRA adapters `save` wrote into `path` (no-op without LoRA)."""
        if is_lora(self.model):
            lora.load_adapter(self.model, Path(path) / lora.ADAPTER_DIR)

    def load_value_head(self, path: str | Path) -> None:
        """Restore the value head saved by `save` into `path` (no-op without gae or without the file)."""
        f = Path(path) / "value_head.pt"
        if self.value_head is not None and f.is_file():
            self.value_head.load_state_dict(torch.load(f, weights_only=True))
