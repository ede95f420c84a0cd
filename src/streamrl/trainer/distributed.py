"""Data-parallel trainer ranks (train.strategy=ddp|fsdp2): same step() results as one process.

Every rank holds the whole TrainBatch and builds the same micro-batches; within a mini-batch the
micro-batch at position p goes to rank p % world. All ranks run the same number of forward/backward
passes (a rank short of work runs a zero-weight pass on a real micro-batch), so DDP's all-reduce and
FSDP2's all-gathers/reduce-scatters always pair up. The loss normaliser comes from all masks of the
global mini-batch (every rank sees them); DDP/FSDP2 average gradients over ranks, so each rank's loss
is scaled by world size: the synced gradient is the single-process sum. Metrics are summed over ranks.
How the ranks are started and fed: placement/trainer_ranks.py.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from streamrl.brief import brief_error
from streamrl.config import Config
from streamrl.trainer.full_state import gather_model, gather_optimizer, load_full
from streamrl.trainer.objective import merge_metric
from streamrl.trainer.trainer import Trainer
from streamrl.types import TrainBatch


def backend_for(cfg: Config) -> str:
    """train.dist_backend with auto resolved: nccl on CUDA, else gloo."""
    b = cfg.train.dist_backend
    if b == "auto":
        return "nccl" if cfg.device.startswith("cuda") and torch.cuda.is_available() else "gloo"
    return b


def rendezvous_store(host: str, world: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's rendezvous store, listening on a port the OS picks as it binds (port 0), so no other
    process can take the port between choosing and binding it. Followers connect to
    tcp://host:<store.port> (init_group); rank 0 creates it before starting them."""
    delta = timedelta(seconds=timeout_s)
    return dist.TCPStore(host, 0, world, True, timeout=delta, wait_for_workers=False)


def init_group(
    cfg: Config,
    rank: int,
    world: int,
    init_method: str,
    store: dist.Store | None = None,
    departed: Callable[[], list[int]] | None = None,
) -> None:
    """Join the process group through rank 0's store: rank 0 passes the store it created
    (rendezvous_store), a follower connects to it at init_method (tcp://host:port). Every rank waits
    until all `world` ranks reached the store; one missing for train.dist_timeout_s is a clear error.
    departed: the ranks whose process has exited (rank 0 checks it every second while it waits, so a
    follower that died before joining ends the wait at once, not after the timeout)."""
    timeout = cfg.train.dist_timeout_s
    delta = timedelta(seconds=timeout)
    if not dist.is_initialized():
        # torch names the default group by a counter that a failed init_process_group leaves raised
        # (only destroy_process_group resets it); fresh followers start at 0, so must this process
        from torch.distributed import distributed_c10d

        distributed_c10d._world.group_count = 0
    try:
        if store is None:
            url = urlparse(init_method)
            if url.scheme != "tcp" or not url.hostname or not url.port:
                raise ValueError(f"init_method must be tcp://host:port, got {init_method!r}")
            store = dist.TCPStore(url.hostname, url.port, world, False, timeout=delta)
        store.set(f"streamrl-joined-{rank}", "1")
        _wait_joined(store, [f"streamrl-joined-{r}" for r in range(world)], timeout, departed)
        pg_store = dist.PrefixStore("streamrl-trainer", store)
        dist.init_process_group(backend_for(cfg), store=pg_store, rank=rank, world_size=world, timeout=delta)
    except RankExited:
        raise
    except Exception as e:  # DistStoreError / RuntimeError, depending on where the wait stopped
        raise RuntimeError(
            f"trainer rank {rank}: not all {world} ranks joined within train.dist_timeout_s={timeout:g}s "
            f"({brief_error(e, 200, typed=True, first_line=True)})"
        ) from e


class RankExited(RuntimeError):
    """A follower's process ended before it joined the process group."""


def _wait_joined(
    store: dist.Store, keys: list[str], timeout_s: float, departed: Callable[[], list[int]] | None
) -> None:
    """store.wait(keys) for up to timeout_s, in one-second slices when `departed` can end it sooner."""
    if departed is None:
        store.wait(keys, timedelta(seconds=timeout_s))
        return
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            store.wait(keys, timedelta(seconds=max(0.01, min(1.0, left))))
            return
        except dist.DistStoreError:
            if gone := departed():
                raise RankExited(f"trainer rank(s) {gone} exited before joining the process group") from None
            if left <= 1.0:
                raise


def rank_share(idx: list[int], rank: int, world: int) -> list[tuple[int, float]]:
    """(micro-batch index, loss weight) for `rank`: positions rank, rank + world, ...; every rank gets
    ceil(len / world) entries, padded with zero-weight passes on idx[0]. Real entries weigh `world`."""
    slots = math.ceil(len(idx) / world)
    out = []
    for s in range(slots):
        pos = s * world + rank
        out.append((idx[pos], float(world)) if pos < len(idx) else (idx[0], 0.0))
    return out


def clip_grad_norm_sharded(params: list[torch.Tensor], max_norm: float) -> float:
    """Global grad norm over DTensor (sharded) and plain (replicated) grads, then clip in place like
    torch.nn.utils.clip_grad_norm_ (coef = max_norm / (norm + 1e-6), at most 1). -> the norm."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    sharded = torch.zeros((), dtype=torch.float64)
    replicated = torch.zeros((), dtype=torch.float64)
    for g in grads:
        if isinstance(g, DTensor):
            sharded += g.to_local().double().pow(2).sum().cpu()
        else:
            replicated += g.double().pow(2).sum().cpu()
    dist.all_reduce(sharded)  # each rank holds a disjoint shard
    norm = float((sharded + replicated).sqrt())
    coef = min(max_norm / (norm + 1e-6), 1.0)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return norm


class DistributedTrainer(Trainer):
    """A Trainer on one data-parallel rank; the process group must be initialised (init_group).

    Rank 0 is the controller: its step(batch) first sends the batch to the followers (`links`, see
    placement/trainer_ranks.py), then trains; followers call step() with the batch they received.
    """

    def __init__(self, model: Any, *args: Any, links: Any = None, **kw: Any) -> None:
        """Trainer's arguments, plus `links`: rank 0 only, the follower processes and their queues."""
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.links = links
        self._full_state: dict[str, torch.Tensor] = {}
        super().__init__(model, *args, **kw)
        self._after_step()  # fsdp2: rank 0's full state for the first policy_state()

    # ---- hooks -----------------------------------------------------------------------------
    def _distribute(self) -> None:
        if self.train.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            # constructing DDP broadcasts rank 0's parameters and buffers; buffers (rotary tables)
            # are not re-broadcast each forward, so ranks may run different no-grad passes
            self.forward_model = DistributedDataParallel(self.model, forward_sync_buffers=False)
            return
        from torch.distributed.fsdp import fully_shard

        with torch.no_grad():  # same start on every rank whatever each loaded
            for t in list(self.model.parameters()) + list(self.model.buffers()):
                dist.broadcast(t.data, 0)
        layers = self.model.get_decoder().layers
        for layer in layers:
            fully_shard(layer)
        fully_shard(self.model)
        self.forward_model = self.model

    def _my_share(self, idx: list[int]) -> list[tuple[int, float]]:
        return rank_share(idx, self.rank, self.world)

    def _grad_sync(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        if self.train.strategy == "ddp" and not last:
            return self.forward_model.no_sync()  # accumulate locally; sync on the last backward
        if self.train.strategy == "fsdp2":
            self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def _clip_grads(self) -> float:
        if self.train.strategy == "fsdp2":
            return clip_grad_norm_sharded(self.params, self.train.grad_clip)
        return super()._clip_grads()  # DDP: every rank holds the same synced gradients

    def _reduce_metrics(self, loss_sum: float, totals: dict[str, float]) -> tuple[float, dict[str, float]]:
        parts: list[Any] = [None] * self.world
        dist.all_gather_object(parts, (loss_sum, totals))
        merged: dict[str, float] = {}
        for _, tot in parts:  # rank order: the same float sums on every rank
            for k, v in tot.items():
                merged[k] = merge_metric(k, merged.get(k), v)
        return sum(p[0] for p in parts), merged

    def _gather_values(self, values: torch.Tensor) -> torch.Tensor:
        parts: list[Any] = [None] * self.world
        dist.all_gather_object(parts, values.cpu())
        return torch.cat(parts)

    def _after_step(self) -> None:
        if self.train.strategy == "fsdp2":
            # a collective: every rank calls it here, so rank 0 can hand out weights without the others
            self._full_state = gather_model(self.model)

    # ---- controller side -------------------------------------------------------------------
    def _lead(self, command: tuple[str, Any], run: Callable[[], Any]) -> Any:
        """Rank 0: send `command` to the followers, then run its part of it; a failure names theirs."""
        if self.links is not None:
            self.links.send(command)
        try:
            return run()
        except Exception as e:
            if self.links is None:
                raise
            raise RuntimeError(self.links.failure(e)) from e

    def step(self, batch: TrainBatch) -> dict[str, float]:
        return self._lead(("step", batch), lambda: super(DistributedTrainer, self).step(batch))

    def optimizer_state(self) -> dict[str, Any]:
        """fsdp2: the full optimizer state gathered from the shards, on rank 0 ({} on the others)."""
        if self.train.strategy != "fsdp2":
            return super().optimizer_state()  # ddp: every rank holds all of it
        return self._lead(("gather", None), lambda: gather_optimizer(self.model, self.optimizer))

    def load_full_state(
        self, weights: dict[str, torch.Tensor], optimizer: dict[str, Any], moments: bool | None = None
    ) -> None:
        """fsdp2, resume: rank 0 passes the saved weights and optimizer state (one process's format),
        the followers {}, {} and whether it has moments; every rank loads its shards of them
        (trainer/full_state.py)."""
        has = bool(optimizer.get("state")) if moments is None else moments

        def load() -> None:
            load_full(self.model, self.optimizer, weights, optimizer, has)
            self._after_step()  # the full weights rank 0 hands out are the loaded ones

        self._lead(("load", has), load)

    def sync_followers(self) -> None:
        """After rank 0 loaded a checkpoint (resume): followers take its scheduler and version, and
        with ddp its weights and optimizer (fsdp2 loaded those on every rank: load_full_state). The
        state goes as bytes, by value: torch's process queues hand a tensor over by sharing its memory,
        and every rank would then update one set of optimizer moments in place."""
        if self.links is not None:
            extra: dict[str, Any] = {"scheduler": self.scheduler.state_dict(), "version": self.version}
            if self.train.strategy == "ddp":
                extra["optimizer"] = self.optimizer.state_dict()
            buffer = io.BytesIO()
            torch.save(extra, buffer)
            self.links.send(("sync", buffer.getvalue()))
        if self.train.strategy == "ddp":
            self.broadcast_parameters()

    def load_sync(self, payload: bytes) -> None:
        """Follower side of sync_followers."""
        extra = torch.load(io.BytesIO(payload), weights_only=False)  # rank 0's own state
        if "optimizer" in extra:
            self.optimizer.load_state_dict(extra["optimizer"])
        self.scheduler.load_state_dict(extra["scheduler"])
        self.version = extra["version"]
        if self.train.strategy == "ddp":
            self.broadcast_parameters()

    def broadcast_parameters(self) -> None:
        with torch.no_grad():
            for p in self.model.parameters():
                dist.broadcast(p.data, 0)

    def policy_state(self) -> dict[str, torch.Tensor]:
        if self.train.strategy == "fsdp2":
            return self._full_state
        return super().policy_state()

    def engine_state(self) -> dict[str, torch.Tensor] | None:
        return self._full_state if self.train.strategy == "fsdp2" else None

    def close(self) -> None:
        if self.links is not None:
            self.links.close()
            self.links = None
        if dist.is_initialized():
            dist.destroy_process_group()
