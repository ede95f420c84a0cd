"""Trainer ranks 1..N-1 as Ray actors (runtime.backend=ray with train.strategy=ddp|fsdp2).

Rank 0 stays the driver (it runs the RL loop). Each follower rank is an actor reserving
ray.trainer_cpus / ray.trainer_gpus that runs the same `run_follower` loop as a locally spawned rank;
commands and error reports travel on Ray queues instead of multiprocessing queues, and the handles
below give FollowerLinks the process-like view (is_alive / join / kill) it already uses.
On a GPU node Ray sets CUDA_VISIBLE_DEVICES per actor, so a follower uses its cuda:0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamrl.config import Config, to_dict


class RayQueue:
    """A Ray queue with the two extra calls FollowerLinks makes on a multiprocessing queue."""

    def __init__(self) -> None:
        from ray.util.queue import Queue

        self.q = Queue()

    def put(self, item: Any) -> None:
        self.q.put(item)

    def get(self, timeout: float | None = None) -> Any:
        return self.q.get(timeout=timeout)  # raises ray.util.queue.Empty, a queue.Empty

    def cancel_join_thread(self) -> None:  # nothing to flush: the queue is an actor
        pass


class RankActor:
    """Wrapped with ray.remote in start_rank_actors; `run` blocks for the life of the rank."""

    def run(self, target: Callable[..., None], *args: Any) -> None:
        target(*args)


class RankHandle:
    """The process-like face of a rank actor: alive while its `run` call has not returned."""

    def __init__(self, actor: Any, ref: Any, name: str) -> None:
        self.actor, self.ref, self.name = actor, ref, name

    def is_alive(self) -> bool:
        import ray

        ready, _ = ray.wait([self.ref], timeout=0)
        return not ready

    def join(self, timeout: float | None = None) -> None:
        import ray

        ray.wait([self.ref], timeout=timeout)

    def kill(self) -> None:
        """The actor ends at once, wherever it is (a rank in a collective ignores a stop)."""
        import ray

        ray.kill(self.actor, no_restart=True)


def start_rank_actors(
    cfg: Config, target: Callable[..., None]
) -> tuple[list[RankHandle], list[RayQueue], RayQueue, Any, str, bool]:
    """Start ranks 1..world-1 as actors -> (handles, command queues, error queue, rank 0's rendezvous
    store, init_method, whether this call started Ray: then the caller shuts it down after the ranks
    stopped).

    The process group's rendezvous is on this (the driver's) node, reachable from the other nodes."""
    import ray

    from streamrl.placement.ray_rollouts import ensure_ray
    from streamrl.trainer.distributed import rendezvous_store

    started = ensure_ray(cfg)
    world, r = cfg.train.world_size, cfg.ray
    need_cpu = (world - 1) * r.trainer_cpus + cfg.runtime.rollout_workers * r.rollout_cpus
    need_gpu = (world - 1) * r.trainer_gpus + cfg.runtime.rollout_workers * r.rollout_gpus
    have = ray.cluster_resources()
    for what, need, key in (("CPU", need_cpu, "trainer_cpus"), ("GPU", need_gpu, "trainer_gpus")):
        if need > have.get(what, 0.0):
            raise RuntimeError(
                f"ray: {world - 1} trainer rank actors (ray.{key}) and {cfg.runtime.rollout_workers} "
                f"rollout actors need {need:g} {what} but the cluster has {have.get(what, 0.0):g}: lower "
                f"ray.{key} / ray.rollout_{what.lower()}s, train.world_size or runtime.rollout_workers"
            )
    host = ray.util.get_node_ip_address()
    store = rendezvous_store(host, world, cfg.train.dist_timeout_s)
    init_method = f"tcp://{host}:{store.port}"
    actor_cls = ray.remote(RankActor).options(num_cpus=r.trainer_cpus, num_gpus=r.trainer_gpus)
    errors = RayQueue()
    commands = [RayQueue() for _ in range(1, world)]
    cfg_dict = to_dict(cfg)
    handles = []
    for rank in range(1, world):
        actor = actor_cls.remote()
        # parent_pid 0: an actor's parent is Ray's worker process, not rank 0; device index 0 (see above)
        ref = actor.run.remote(target, rank, world, init_method, cfg_dict, commands[rank - 1], errors, 0, 0)
        handles.append(RankHandle(actor, ref, f"streamrl-trainer-rank{rank}"))
    return handles, commands, errors, store, init_method, started
