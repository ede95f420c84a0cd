"""Start the trainer ranks of train.strategy=ddp|fsdp2 on this machine.

Rank 0 is the calling process (it runs the RL loop); ranks 1..world-1 are spawned followers that run
`run_follower`: load the same model, join the process group, then loop on commands from rank 0
("step", batch) / ("sync", state) / ("gather", None) / ("load", moments) / ("stop", None). Commands
travel on a plain queue, not a collective, so a follower may wait for minutes while rank 0 generates;
train.dist_timeout_s bounds only the collectives a command runs. Followers ignore Ctrl-C (rank 0
decides), stop on "stop", and exit on their own if rank 0 dies. With runtime.backend=ray the followers
are Ray actors running the same run_follower (placement/ray_ranks.py).
"""

from __future__ import annotations

import os
import queue
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as tmp

from streamrl.brief import brief_error
from streamrl.config import Config, to_dict
from streamrl.trainer.trainer import Trainer

STOP = ("stop", None)


class FollowerLinks:
    """Rank 0's handles on its followers: processes, one command queue each, a shared error queue."""

    def __init__(
        self,
        procs: list[Any],
        commands: list[Any],
        errors: Any,
        timeout_s: float,
        after_close: Callable[[], None] | None = None,
    ) -> None:
        self.procs, self.commands, self.errors = procs, commands, errors
        self.timeout_s = timeout_s
        self.after_close = after_close  # Ray ranks: end the Ray instance this run started

    def send(self, command: tuple[str, Any]) -> None:
        dead = [i + 1 for i, p in enumerate(self.procs) if not p.is_alive()]
        if dead:
            raise RuntimeError(self.failure(None, f"trainer rank(s) {dead} exited"))
        for q in self.commands:
            q.put(command)

    def failure(self, err: BaseException | None, what: str = "") -> str:
        """One message for a failed collective: rank 0's error plus whatever the followers reported."""
        reports = []
        deadline = time.monotonic() + 2.0  # a follower's report may still be in flight
        while time.monotonic() < deadline:
            try:
                reports.append(self.errors.get(timeout=0.2))
            except queue.Empty:
                if reports or all(not p.is_alive() for p in self.procs):
                    break
        cause = brief_error(err, 200, typed=True, first_line=True)
        head = what or (
            f"distributed trainer failed on rank 0 ({cause}); a rank died, failed "
            f"or hung longer than train.dist_timeout_s={self.timeout_s:g}s"
        )
        tail = "\n".join(reports) if reports else "no follower reported an error (hung or killed?)"
        return f"{head}; followers: {tail}"

    def close(self, timeout: float = 30.0) -> None:
        for q in self.commands:
            try:
                q.put(STOP)
            except (ValueError, OSError):
                pass
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()  # SIGKILL: a follower ignores SIGTERM (rank 0 handles a job's stop)
                p.join(timeout=5)
        for q in [*self.commands, self.errors]:
            q.cancel_join_thread()
        if self.after_close is not None:
            self.after_close()
            self.after_close = None


def _ray_shutdown() -> None:
    import ray

    ray.shutdown()


def make_trainer(
    model: Any, cfg: Config, pad_id: int, follower_target: Callable[..., None] | None = None
) -> Trainer:
    """Trainer for train.strategy: one process, or rank 0 of `train.world_size` local ranks (whose
    followers are started here; trainer.close() stops them). Tests swap follower_target."""
    if cfg.train.strategy == "single":
        return Trainer.from_config(model, cfg, pad_id)
    from streamrl.trainer.distributed import DistributedTrainer, init_group, rendezvous_store

    world = cfg.train.world_size
    target = follower_target or run_follower
    procs: list[Any]
    if cfg.runtime.backend == "ray":  # ranks 1.. as Ray actors with ray.trainer_cpus/gpus each
        from streamrl.placement.ray_ranks import start_rank_actors

        procs, commands, errors, store, init_method, started = start_rank_actors(cfg, target)
        after_close = _ray_shutdown if started else None
    else:
        after_close = None
        store = rendezvous_store("127.0.0.1", world, cfg.train.dist_timeout_s)
        init_method = f"tcp://127.0.0.1:{store.port}"
        ctx = tmp.get_context("spawn")
        errors = ctx.Queue()
        commands = [ctx.Queue() for _ in range(1, world)]
        procs = [
            ctx.Process(
                target=target,
                args=(r, world, init_method, to_dict(cfg), commands[r - 1], errors, os.getpid()),
                daemon=True,
                name=f"streamrl-trainer-rank{r}",
            )
            for r in range(1, world)
        ]
        # a follower ignores Ctrl-C and a group SIGTERM (rank 0 stops the job), but only once it runs
        # run_follower: until then (its imports) it starts with them blocked, pending, then discarded
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for p in procs:
                p.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    links = FollowerLinks(procs, commands, errors, cfg.train.dist_timeout_s, after_close)
    try:
        init_group(
            cfg, 0, world, init_method, store, lambda: [r for r, p in enumerate(procs, 1) if not p.is_alive()]
        )
        return DistributedTrainer.from_config(model, cfg, pad_id, links=links)
    except BaseException as e:
        msg = links.failure(e) if not isinstance(e, KeyboardInterrupt) else ""
        links.close(timeout=1)
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        if msg:
            raise RuntimeError(msg) from e
        raise


def run_follower(
    rank: int,
    world: int,
    init_method: str,
    cfg_dict: dict[str, Any],
    commands: Any,
    errors: Any,
    parent_pid: int = 0,
    device_index: int = -1,
) -> None:
    """A follower rank: same model and config as rank 0, trains the batches rank 0 sends.
    device_index: the CUDA device (-1: the rank's own index; a Ray actor sees only its GPU: 0)."""
    # Ctrl-C, and a SIGTERM sent to the whole group (Slurm, systemd), are rank 0's to handle: it stops at
    # a step boundary and saves, which needs this rank alive
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ignored in C too: no collective sees an EINTR
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})  # blocked at start
    try:
        _follow(rank, world, init_method, cfg_dict, commands, parent_pid, device_index)
    except BaseException:
        errors.put(f"rank {rank}: {traceback.format_exc()}")
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _follow(
    rank: int,
    world: int,
    init_method: str,
    cfg_dict: dict[str, Any],
    commands: Any,
    parent: int,
    device_index: int = -1,
) -> None:
    from streamrl.config import from_dict
    from streamrl.models.startup import start_model
    from streamrl.trainer.distributed import DistributedTrainer, init_group

    cfg = from_dict(cfg_dict)
    torch.set_num_threads(cfg.train.threads or 1)
    torch.manual_seed(cfg.seed)
    device = cfg.device
    if device.startswith("cuda"):
        index = rank if device_index < 0 else device_index
        device = f"cuda:{index}"
        torch.cuda.set_device(index)
        cfg.device = device
    # fp32 master weights, as rank 0's
    started = start_model(cfg.model, cfg.seed, device, chat_template=cfg.task_config.chat_template)
    init_group(cfg, rank, world, init_method)
    trainer = DistributedTrainer.from_config(started.model, cfg, int(started.tokenizer.pad_token_id))
    while True:
        try:
            kind, payload = commands.get(timeout=1.0)
        except queue.Empty:
            if parent and os.getppid() != parent:  # rank 0 is gone: do not linger as an orphan
                return
            continue
        if kind == "stop":
            return
        if kind == "step":
            trainer.step(payload)
        elif kind == "sync":
            trainer.load_sync(payload)
        elif kind == "gather":  # fsdp2: rank 0 saves the optimizer state, gathered from every rank
            trainer.optimizer_state()
        elif kind == "load":  # fsdp2: rank 0 resumes, every rank takes its shards of the saved state
            trainer.load_full_state({}, {}, moments=payload)
        else:
            raise ValueError(f"unknown trainer command {kind!r}")
