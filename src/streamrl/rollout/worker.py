"""A rollout worker: generates groups continuously with the newest published weights.

Requests arrive from a RequestSource (GroupRequest), finished and scored groups leave through a
ResultSink (GroupResult). Between decode steps the worker checks its WeightSource's version and takes
new weights in flight or by interrupt-and-recompute (engine/continuous.py). It never waits for the
trainer: it waits only when it has nothing to generate. For agent tasks the worker serves its own
chat proxy, and the agents' calls join the same decoder (rollout/agent_worker.py). The local backend
plugs in mp queues and SharedWeights (a spawned process); the ray backend a thread queue, an outbox
and an object-store or broadcast receiver (placement/ray_actor.py).
"""

from __future__ import annotations

import hashlib
import queue
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from streamrl.engine.base import Draft, decoded_rows
from streamrl.processes import parent_gone
from streamrl.types import Group, Problem


@dataclass
class GroupRequest:
    group_id: str
    problem: Problem
    prompt_ids: list[int]
    samples: int
    admitted_version: int
    greedy_baseline: bool = False  # also decode the prompt greedily (ReMax's baseline)
    drafts: tuple[
        Draft, ...
    ] = ()  # speculative rollouts: earlier responses to this prompt (rollout/drafts.py)


@dataclass
class GroupResult:
    """A worker's answer to one GroupRequest: the scored group (None when `error` says why not)."""

    group_id: str
    group: Group | None
    worker: int
    busy_s: float = 0.0  # seconds spent generating since the worker's previous result
    idle_s: float = 0.0  # seconds with nothing to generate, or waiting for scores (ScoreWait), since then
    tokens: int = 0  # tokens the engine sampled since the previous result (every request's, no tool output)
    # summed over the engine's decode steps since the previous result: sequences decoded and the KV-cache
    # rows forwarded for them (rows with identical tokens so far share one: engine/decode_batch.py)
    rows: int = 0
    cache_rows: int = 0
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


STOP = "stop"


class RequestSource(Protocol):
    """GroupRequest or STOP; raises queue.Empty (mp.Queue and queue.Queue both fit)."""

    def get(self, block: bool = True, timeout: float | None = None) -> Any: ...

    def get_nowait(self) -> Any: ...


class ResultSink(Protocol):
    def put(self, item: GroupResult) -> None: ...


class WeightSource(Protocol):
    """The newest published weights: `version` is cheap; `load_into` copies them and returns theirs."""

    @property
    def version(self) -> int: ...

    def load_into(self, model: Any) -> int: ...

    def read(self, consume: Any) -> int:
        """consume(tensors, version) with the newest weights (engines that hold their own copy)."""
        ...


def worker_seed(seed: int, worker_id: int, version: int) -> int:
    """The sampling seed of rollout worker `worker_id` of a run seeded `seed` that starts on weights
    `version`: another worker, another run seed or a start on other weights (a resume, a restart after
    the weights moved) draws other random numbers; the same three draw the same."""
    digest = hashlib.blake2b(f"{seed}/{worker_id}/{version}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _first_version(weights: WeightSource, timeout_s: float = 60.0) -> int:
    """The version of the weights the worker starts on, before it loads them: a Ray actor's receiver
    knows it once the trainer's first announcement arrives (-1 before), shared memory at once."""
    deadline = time.monotonic() + timeout_s
    while weights.version < 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    return max(0, weights.version)


def run_worker(
    worker_id: int, cfg_dict: dict[str, Any], requests: Any, results: Any, weights: Any, threads: int
) -> None:
    """Process entry point (spawned). Returns when it receives STOP or its parent dies."""
    import torch

    # Ctrl-C in a terminal reaches the whole process group: the controller decides when workers stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(threads)
    serve(worker_id, cfg_dict, requests, results, weights, parent_gone())


def serve(
    worker_id: int,
    cfg_dict: dict[str, Any],
    requests: RequestSource,
    results: ResultSink,
    weights: WeightSource,
    orphaned: Callable[[], bool],
) -> None:
    """Generate until STOP or `orphaned()` (the controller is gone); errors go to `results`."""
    try:
        _loop(worker_id, cfg_dict, requests, results, weights, orphaned)
    except Exception:  # the controller sees the error instead of a silent hang
        traceback.print_exc()  # and the worker's stderr has it, should the report be lost with the process
        results.put(GroupResult("", None, worker_id, error=traceback.format_exc()))


def _loop(
    worker_id: int,
    cfg_dict: dict[str, Any],
    requests: RequestSource,
    results: ResultSink,
    weights: WeightSource,
    orphaned: Callable[[], bool],
) -> None:
    import torch

    from streamrl.config import from_dict
    from streamrl.engine.base import Decoder, GenRequest
    from streamrl.engine.continuous import ContinuousDecoder
    from streamrl.engine.hf import HFEngine
    from streamrl.envs.agent_task import AgentTask
    from streamrl.envs.base import EnvTask
    from streamrl.models import load_tokenizer, resolve_model_dir
    from streamrl.models.frozen import freeze
    from streamrl.models.precision import precision_dtype
    from streamrl.models.startup import start_model
    from streamrl.rollout.agent_worker import AgentGroups
    from streamrl.rollout.episodes import EpisodeTable
    from streamrl.rollout.score import ScoreWait, Scoring
    from streamrl.rollout.trajectory import GREEDY, RolloutSettings, greedy_request, make_trajectory
    from streamrl.tasks import task_from_config

    cfg = from_dict(cfg_dict)
    model_dir = resolve_model_dir(cfg.model, cfg.seed)
    tokenizer = load_tokenizer(model_dir, cfg.task_config.chat_template)
    task = task_from_config(cfg)
    if cfg.engine == "vllm":
        from streamrl.engine.hf import stop_ids_from_dir
        from streamrl.engine.vllm import decoder_from_config

        stop_ids = stop_ids_from_dir(model_dir, tokenizer)
        seed = worker_seed(cfg.seed, worker_id, _first_version(weights))  # vLLM takes it at the start
        decoder: Decoder = decoder_from_config(cfg, model_dir, stop_ids, seed)

        def refresh() -> int:  # vLLM holds its own weights: it reloads them from the shared buffer
            return weights.read(decoder.update_weights)

    else:
        # the shared fp32 weights are cast into this dtype on every load (copy_ casts)
        dtype = precision_dtype(cfg.rollout.precision, cfg.device)
        started = start_model(cfg.model, cfg.seed, cfg.device, dtype, cfg.task_config.chat_template)
        model = freeze(started.model)
        engine = HFEngine(
            model,
            tokenizer,
            cfg.rollout.max_batch,
            device=cfg.device,
            prefix_cache=cfg.rollout.prefix_cache,
            branch_min=cfg.rollout.spec_branch_min,
        )
        decoder = ContinuousDecoder(engine, cfg.runtime.weight_update)

        def refresh() -> int:  # copy into the engine's module, then recompute KV in interrupt mode
            version = weights.load_into(model)
            decoder.update_weights(None, version)
            return version

    # seeded from the weights it starts on: a resumed or restarted worker does not draw again the
    # random numbers the run drew from its start
    loaded = refresh()
    if cfg.engine != "vllm":  # vLLM took its seed at construction, from the version announced then
        seed = worker_seed(cfg.seed, worker_id, loaded)
        engine.generator.manual_seed(seed)
    torch.manual_seed(seed)
    r = RolloutSettings.from_config(cfg)
    episodes = EpisodeTable(task, tokenizer, r) if isinstance(task, EnvTask) else None
    scoring = Scoring(cfg, task)
    try:  # a proxy that cannot start: the reward service's threads and processes stop too
        agents = AgentGroups(task, tokenizer, r, scoring) if isinstance(task, AgentTask) else None
    except BaseException:
        scoring.close()
        raise
    open_groups: dict[str, tuple[GroupRequest, list[Any]]] = {}
    # samples asked for so far per group: screening (r.screen) asks for the first few, the rest only if
    # those disagree
    asked: dict[str, int] = {}
    busy = idle = 0.0
    sampled = 0  # tokens sampled since the previous result
    counted = [0, 0]  # the engine's decode rows and cache rows up to the previous result

    def result(gid: str, group: Group) -> GroupResult:
        """The group's result with the worker's counters since the previous one (then reset)."""
        nonlocal busy, idle, sampled
        now = list(decoded_rows(getattr(decoder, "engine", None)))  # vLLM's decoder counts none
        out = GroupResult(
            gid, group, worker_id, busy, idle, sampled, now[0] - counted[0], now[1] - counted[1]
        )
        busy = idle = sampled = 0
        counted[:] = now
        return out

    taken_any = False

    def ask(req: GroupRequest, ks: range, baseline: bool) -> None:
        gens = [
            GenRequest(
                req.prompt_ids,
                r.max_new_tokens,
                r.temperature,
                r.top_p,
                tag=(req.group_id, k),
                drafts=req.drafts,
                lenience=r.spec_lenience,
            )
            for k in ks
        ]
        if baseline:
            gens.append(greedy_request(req.prompt_ids, r, (req.group_id, GREEDY)))
        if episodes is not None:  # env task: each sample is an episode starting with this request
            gens = [episodes.start(req.problem, g) for g in gens]
        decoder.add(gens)
        asked[req.group_id] = ks.stop

    def take(req: GroupRequest) -> None:
        nonlocal taken_any
        taken_any = True
        if req.group_id in open_groups or (agents is not None and req.group_id in agents.open):
            return  # sent again while this worker still generates it (loop/stall.py): one copy
        if agents is not None:  # agent task: G agent threads whose calls reach the decoder via the proxy
            agents.start(req)
            return
        open_groups[req.group_id] = (req, [])
        first = r.screen if 0 < r.screen < req.samples else req.samples
        ask(req, range(first), req.greedy_baseline)

    score_wait = ScoreWait()

    deadlines: dict[str, float] = {}  # group -> when its outstanding scores run out of budget

    def emit_scored() -> None:
        """Send every group whose samples are all generated and scored (scoring runs in the reward
        service's threads/processes while this loop keeps decoding), or whose scores ran past
        reward.step_budget_s after its last sample was generated (those score 0, "step_budget")."""
        for req, group in agents.finished() if agents is not None else []:
            results.put(result(req.group_id, group))
        for gid in [
            g for g, (req, done) in open_groups.items() if len(done) == asked[g] + req.greedy_baseline
        ]:
            req, done = open_groups[gid]
            deadline = deadlines.setdefault(gid, scoring.deadline())
            scored = all(fut is None or fut.done() for _, _, fut in done)
            if not scored and time.monotonic() < deadline:
                continue
            del deadlines[gid]
            scoring.settle([(traj, fut) for _, traj, fut in done if fut is not None])  # None: env-scored
            done[:] = [(k, traj, None) for k, traj, _ in done]  # settled once
            trajs = [t for _, t, _ in sorted(done, key=lambda d: d[0])]
            baseline = trajs.pop(0) if req.greedy_baseline else None  # GREEDY = -1 sorts first
            group = Group(req.problem, trajs, baseline)
            if asked[gid] < req.samples and not group.uninformative:  # screened in: the rest of the group
                ask(req, range(asked[gid], req.samples), False)
                continue
            del open_groups[gid], asked[gid]
            results.put(result(gid, group))

    try:
        while True:
            if orphaned():  # the controller was killed: do not linger as an orphan
                return
            emit_scored()
            t0 = time.perf_counter()
            # intake: block only when there is nothing to decode (briefly while agents may call)
            wait = 0.005 if agents is not None and agents.live else 0.05
            try:
                while True:
                    item = requests.get(timeout=wait) if decoder.idle else requests.get_nowait()
                    if item == STOP:
                        return
                    take(item)
                    if decoder.idle:
                        break
            except queue.Empty:
                pass
            if agents is not None:
                decoder.add(agents.requests())
            if decoder.idle:
                if taken_any:  # waiting for the first request is the job's start, not the loop idling
                    idle += time.perf_counter() - t0
                continue
            # newest weights between decode steps; never start a request on weights older than those it
            # was admitted under (publish happens before admission, so one load always suffices)
            admitted = [req.admitted_version for req, _ in open_groups.values()]
            need = max(admitted + (agents.admitted_versions() if agents is not None else []), default=0)
            if weights.version > decoder.version or decoder.version < need:
                refresh()
            t_step = time.perf_counter()
            finished = []  # groups whose last response this step generated
            for res in decoder.step():
                sampled += len(res.token_ids)
                if agents is not None and agents.owns(res):
                    agents.resolve(res)
                    continue
                gid, k = res.request.tag
                req, done = open_groups[gid]
                if episodes is None:
                    traj = make_trajectory(req.problem, res, tokenizer, r, gid, k)
                    done.append((k, traj, scoring.submit(req.problem, traj)))
                    if len(done) == asked[gid] + req.greedy_baseline:
                        finished.append(gid)
                    continue
                nxt, ep_traj = episodes.advance(res)
                if nxt is not None:  # the env answered: the episode's next turn joins the decoder
                    decoder.add([nxt])
                elif ep_traj is not None:
                    done.append((k, ep_traj, None))
            # their scores, briefly, so that emit_scored sends them now rather than after the next step
            score_wait.earn(time.perf_counter() - t_step)
            waited = score_wait.wait([f for g in finished for _, _, f in open_groups[g][1] if f is not None])
            busy += time.perf_counter() - t0 - waited
            idle += waited
    finally:
        scoring.close()
        if agents is not None:
            agents.close()
