"""vLLM as the rollout engine (engine=vllm): ContinuousDecoder's interface over vLLM's in-process engine.

The rollout worker drives it exactly like ContinuousDecoder: add(requests), step() -> finished
GenResults, update_weights(state, version) between steps. Every step is one vLLM scheduler step; each
token it delivers carries its log-prob under the sampling distribution (logprobs_mode=processed_logprobs:
after temperature and top-p, the same quantity as engine/sampling.py) and the policy version of the
weights that computed it.

Weights are reloaded in place (`reload_weights` on the worker), then a tied LM head is re-packed for
vLLM's CPU GEMM (a reload leaves its packed copy stale), and the prefix cache is reset. Prefix-cache
entries are also salted with the policy version, so a request admitted after an update never reuses KV
computed by older weights even while running requests keep blocks alive (in-flight mode).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrl.config_validate import VLLM_INSTALL_HINT as INSTALL_HINT
from streamrl.engine.base import GenRequest, GenResult, check_weight_mode


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:  # vllm missing, or a broken install (e.g. CUDA torchvision next to CPU torch)
        raise ImportError(f"{INSTALL_HINT} ({e})") from e
    return vllm


@dataclass
class _Row:
    """One request in flight: its streamrl result so far and the id vLLM currently knows it by."""

    result: GenResult
    vllm_id: str


class VLLMDecoder:
    """add/step/update_weights/idle/active_rows/version, like ContinuousDecoder (engine/continuous.py).

    stop_ids: the token ids that end a completion (engine/hf.py stop_token_ids); vLLM's own EOS rule
    is switched off so both engines stop on exactly the same set. stop_ids=set() decodes every request
    to max_new_tokens (benchmarks).
    """

    def __init__(
        self,
        model_dir: str | Path,
        stop_ids: set[int],
        weight_mode: str = "inflight",
        max_batch: int = 128,
        seed: int = 0,
        kv_cache_gib: int = 2,
        dtype: str = "float32",
        enforce_eager: bool = True,
        threads_bind: str = "nobind",
        gpu_memory_utilization: float = 0.5,
        device: str = "cpu",
        prefix_cache: bool = True,
    ) -> None:
        check_weight_mode(weight_mode)
        # read by vLLM when the engine starts: in-process engine core (weights handed over as tensors),
        # the CPU KV cache size and the cores its OpenMP threads are pinned to
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))
        if threads_bind:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = threads_bind
        if threads_bind == "nobind":  # keep the caller's torch threads (vLLM otherwise drops them to 1)
            import torch

            os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
        cache = Path(os.environ.get("STREAMRL_CACHE", "/tmp/streamrl-cache")) / "vllm"
        os.environ.setdefault("VLLM_CACHE_ROOT", str(cache))
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
        vllm = import_vllm()
        if device == "cpu":
            _check_cpu_head_size(Path(model_dir))
        self.llm = vllm.LLM(
            model=str(model_dir),
            dtype=dtype,
            enforce_eager=enforce_eager,
            seed=seed,
            max_num_seqs=max_batch,
            logprobs_mode="processed_logprobs",  # log-probs after temperature / top-p, as sampled
            async_scheduling=False,  # a step's tokens come from the weights loaded before that step
            enable_prefix_caching=prefix_cache,
            skip_tokenizer_init=True,  # token ids in, token ids out
            gpu_memory_utilization=gpu_memory_utilization,
        )
        self._engine = self.llm.llm_engine
        self._sampling = vllm.SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._delta = RequestOutputKind.DELTA
        self.stop_ids = sorted(stop_ids)
        self.weight_mode = weight_mode
        self.prefix_cache = prefix_cache
        self.version = 0
        self.paused = False
        self._rows: dict[str, _Row] = {}  # vLLM request id -> row
        self._ids = itertools.count()
        self._tied = bool(self.llm.llm_engine.model_config.hf_text_config.tie_word_embeddings)

    @property
    def active_rows(self) -> int:
        return len(self._rows)

    @property
    def idle(self) -> bool:
        return not self._rows

    def in_progress(self) -> list[GenResult]:
        """The unfinished requests' results so far (tokens, log-probs, versions)."""
        return [r.result for r in self._rows.values()]

    def add(self, requests: list[GenRequest]) -> None:
        for req in requests:
            if not req.prompt_ids:
                raise ValueError("GenRequest.prompt_ids is empty")
            self._submit(_Row(GenResult(request=req), ""))

    def _submit(self, row: _Row) -> None:
        """Hand a row to vLLM: prompt + the tokens it already has, for the tokens it still needs."""
        req, done = row.result.request, row.result.token_ids
        params = self._sampling(
            n=1,
            temperature=req.temperature,
            top_p=req.top_p,
            max_tokens=req.max_new_tokens - len(done),
            logprobs=0,  # the sampled token's log-prob only
            ignore_eos=True,
            stop_token_ids=self.stop_ids,
            detokenize=False,
            output_kind=self._delta,  # each step returns only the tokens new since the last one
        )
        row.vllm_id = str(next(self._ids))
        prompt = {"prompt_token_ids": req.prompt_ids + done, "cache_salt": f"v{self.version}"}
        self._engine.add_request(row.vllm_id, prompt, params)
        self._rows[row.vllm_id] = row

    def step(self) -> list[GenResult]:
        """One vLLM scheduler step; returns the requests that finished in it."""
        if self.paused or not self._rows:
            return []
        finished: list[GenResult] = []
        for out in self._engine.step():
            row = self._rows.get(out.request_id)
            if row is None:  # a request aborted by an update: its replacement carries on
                continue
            comp = out.outputs[0]
            res = row.result
            for tok, lp in zip(comp.token_ids, comp.logprobs or []):
                res.token_ids.append(int(tok))
                res.logprobs.append(float(lp[tok].logprob))
                res.versions.append(self.version)
            if out.finished:
                del self._rows[out.request_id]
                res.finish_reason = _finish_reason(comp.finish_reason, res, set(self.stop_ids))
                finished.append(res)
        return finished

    def update_weights(self, state: dict[str, Any] | None, version: int) -> None:
        """Load `state` (HF parameter names) in place and stamp later tokens with `version`.

        inflight: running requests keep their KV (computed by older weights) and go on decoding with the
        new ones. interrupt: running requests are aborted and re-added as prompt + tokens so far, so
        their KV is recomputed by the new weights; their tokens, log-probs and versions are kept.
        Requests with no token yet are re-added in both modes (their prompt KV, if any, is stale).
        """
        if state is None:
            raise ValueError("the vLLM engine holds its own copy of the weights: pass the state dict")
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items())})
        if self._tied:
            self.llm.collective_rpc(_repack_lm_head)
        self.version = version
        restart = [
            r for r in self._rows.values() if self.weight_mode == "interrupt" or not r.result.token_ids
        ]
        if restart:
            self._engine.abort_request([r.vllm_id for r in restart])
            for r in restart:
                del self._rows[r.vllm_id]
        # frees the old weights' prefix blocks (fails harmlessly while running requests hold blocks:
        # the version salt keeps new requests off them anyway)
        if self.prefix_cache:
            self._engine.reset_prefix_cache()
        for r in restart:
            self._submit(r)

    def pause(self) -> None:
        """step() generates nothing until resume(); requests and their progress are kept."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Decode `requests` to the end; results in their order."""
        if self.paused:
            raise RuntimeError("engine is paused; call resume() before generate()")
        self.add(requests)
        done: dict[int, GenResult] = {}
        while self._rows:
            for res in self.step():
                done[id(res.request)] = res
        return [done[id(r)] for r in requests]


def _finish_reason(vllm_reason: str | None, res: GenResult, stop_ids: set[int]) -> str:
    if vllm_reason == "stop" or (res.token_ids and res.token_ids[-1] in stop_ids):
        return "stop"
    return "abort" if vllm_reason == "abort" else "length"


def _repack_lm_head(worker: Any) -> None:
    """On vLLM's worker: rebuild the packed CPU copy of a tied LM head from the reloaded embedding."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(worker.model_runner.get_model().lm_head, remove_weight=False)


CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def _check_cpu_head_size(model_dir: Path) -> None:
    """vLLM's CPU attention supports a fixed set of head sizes; say so before it fails deep inside."""
    import json

    cfg = json.loads((model_dir / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    heads = cfg.get("num_attention_heads")
    head = cfg.get("head_dim") or (cfg["hidden_size"] // heads if heads else None)
    if head is not None and head not in CPU_HEAD_SIZES:
        raise ValueError(
            f"vLLM's CPU attention supports head sizes {', '.join(map(str, CPU_HEAD_SIZES))}; "
            f"{model_dir} has {head} (tiny-random has 16: build one with "
            "streamrl.models.tiny.build(dir, hidden=128) and pass model=dir)"
        )


def decoder_from_config(cfg: Any, model_dir: Path, stop_ids: set[int], seed: int = 0) -> VLLMDecoder:
    """The rollout worker's decoder for engine=vllm (cfg: a streamrl Config), sampling from `seed`."""
    v = cfg.vllm
    return VLLMDecoder(
        model_dir,
        stop_ids,
        weight_mode=cfg.runtime.weight_update,
        max_batch=cfg.rollout.max_batch,
        seed=seed,
        kv_cache_gib=v.kv_cache_gib,
        dtype=v.dtype,
        enforce_eager=v.enforce_eager,
        threads_bind=v.threads_bind,
        gpu_memory_utilization=v.gpu_memory_utilization,
        device=cfg.device,
        prefix_cache=cfg.rollout.prefix_cache,
    )
