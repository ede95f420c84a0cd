"""Weights from the trainer (driver) to Ray rollout actors: object store or torch.distributed broadcast.

Both modes move one flat buffer per dtype (FlatLayout), never a pickled state dict.
- object_store: the trainer ray.put()s the flat buffers as uint8 numpy arrays (Ray's zero-copy path;
  a bf16 buffer travels as its bytes) and announces (version, ref) to each actor; an actor fetches when
  the announced version is newer than its engine's.
- broadcast: a process group (gloo on CPU, nccl on GPU) built outside torch's default group, so a DDP
  trainer group can coexist: rank 0 is the trainer, rank i+1 rollout actor i. Each publish is a header
  (the version) and the flat buffers; the trainer announces every publish to the actors by an actor
  call first, so no rank waits in a collective longer than runtime.sync_timeout_s.
Every wait is bounded: past runtime.sync_timeout_s a WeightSyncError names the mode, the version and
what to check, instead of a silent hang; a group that cannot form also says where each rollout actor
stands (not started, died and why, up and joined or not: placement/ray_actor.py).
"""

from __future__ import annotations

import datetime
import queue
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from streamrl.brief import brief_error
from streamrl.models.tied import copy_state


class WeightSyncError(RuntimeError):
    pass


def sync_error(mode: str, version: int, what: str, check: str, timeout: float) -> WeightSyncError:
    return WeightSyncError(
        f"weight sync (runtime.weight_sync={mode}) of policy version {version} {what} "
        f"(runtime.sync_timeout_s={timeout:g}); check {check}"
    )


@dataclass(frozen=True)
class FlatLayout:
    """Parameter order, shapes and dtypes (as 'float32' etc.); flat buffers are grouped by dtype."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    @classmethod
    def of(cls, state: dict[str, torch.Tensor]) -> FlatLayout:
        return cls(
            tuple(state),
            tuple(tuple(t.shape) for t in state.values()),
            tuple(str(t.dtype).removeprefix("torch.") for t in state.values()),
        )

    def buffer_dtypes(self) -> list[str]:
        return sorted(set(self.dtypes))

    def numel(self, dtype: str) -> int:
        return sum(_prod(s) for s, d in zip(self.shapes, self.dtypes) if d == dtype)

    def empty(self) -> dict[str, torch.Tensor]:
        return {d: torch.empty(self.numel(d), dtype=getattr(torch, d)) for d in self.buffer_dtypes()}

    def flatten(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """{dtype: 1-D tensor of all parameters of that dtype, in layout order} (one copy)."""
        out = {}
        for d in self.buffer_dtypes():
            parts = [state[n].detach().reshape(-1).cpu() for n, dt in zip(self.names, self.dtypes) if dt == d]
            out[d] = torch.cat(parts)
        return out

    def unflatten(self, flats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Views into `flats` by parameter name."""
        out, offsets = {}, dict.fromkeys(flats, 0)
        for n, shape, d in zip(self.names, self.shapes, self.dtypes):
            k = _prod(shape)
            out[n] = flats[d][offsets[d] : offsets[d] + k].view(shape)
            offsets[d] += k
        return out


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def copy_into(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    copy_state(model, tensors)  # a tied weight once; tied aliases with different values refused


# ---- object store ---------------------------------------------------------------------------------
class ObjectStorePublisher:
    """Trainer side: ray.put the newest weights; `announcement()` is what each actor receives."""

    def __init__(self) -> None:
        self.version = -1
        self._box: list[Any] = []

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        import ray

        layout = FlatLayout.of(state)
        arrays = {d: t.view(torch.uint8).numpy() for d, t in layout.flatten(state).items()}
        self._box = [ray.put((version, layout, arrays))]  # the old object is freed once no actor holds it
        self.version = version

    def announcement(self) -> tuple[int, list[Any]]:
        """(version, [ref]): the ref inside a list so Ray hands it over unresolved (fetched on demand)."""
        return self.version, list(self._box)


class ObjectStoreReceiver:
    """Actor side: remembers the newest announced (version, ref); fetches it when asked."""

    mode = "object_store"

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._cond = threading.Condition()
        self._version, self._box = -1, []

    def announce(self, version: int, box: list[Any]) -> None:
        with self._cond:
            if version > self._version:
                self._version, self._box = version, box
                self._cond.notify_all()

    @property
    def version(self) -> int:
        return self._version

    def status(self) -> str:
        """Nothing to tell: a fetch fails in the call that asked for it."""
        return ""

    def snapshot(self) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, {name: tensor}) of the newest announced weights."""
        import ray
        from ray.exceptions import GetTimeoutError, RayError

        with self._cond:
            if not self._cond.wait_for(lambda: self._version >= 0, timeout=self.timeout):
                raise sync_error(self.mode, 0, "was never announced", _OS_CHECK, self.timeout)
            version, box = self._version, self._box
        try:
            got_version, layout, arrays = ray.get(box[0], timeout=self.timeout)
        except GetTimeoutError:
            raise sync_error(self.mode, version, "was not fetched", _OS_CHECK, self.timeout) from None
        except RayError as e:
            what = f"failed ({type(e).__name__})"
            raise sync_error(self.mode, version, what, _OS_CHECK, self.timeout) from e
        with warnings.catch_warnings():  # object-store arrays are read-only; we only read them
            warnings.simplefilter("ignore", UserWarning)
            flats = {d: torch.from_numpy(a).view(getattr(torch, d)) for d, a in arrays.items()}
        return got_version, layout.unflatten(flats)

    def load_into(self, model: torch.nn.Module) -> int:
        version, tensors = self.snapshot()
        copy_into(model, tensors)
        return version

    def read(self, consume: Callable[[dict[str, torch.Tensor], int], None]) -> int:
        """Hand the newest weights to `consume` (an engine that holds its own copy, e.g. vLLM)."""
        version, tensors = self.snapshot()
        consume(tensors, version)
        return version


_OS_CHECK = "that the driver (trainer) is alive and the object store has room (`ray status`)"


# ---- broadcast ------------------------------------------------------------------------------------
def _join(
    host: str, port: int, rank: int, world: int, timeout: float, epoch: int, backend: str, store: Any = None
) -> Any:
    """A process group of its own (not torch's default group); blocks until all `world` ranks join.
    Rank 0 passes the store it listens on (BroadcastPublisher); the members connect to host:port."""
    import torch.distributed as dist

    delta = datetime.timedelta(seconds=timeout)
    if store is None:
        store = dist.TCPStore(host, port, world, False, timeout=delta)
    prefixed = dist.PrefixStore(f"streamrl-weights-{epoch}", store)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = delta
        return dist.ProcessGroupNCCL(prefixed, rank, world, opts), store
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = delta
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=_node_ip())]
    return dist.ProcessGroupGloo(prefixed, rank, world, opts), store


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    except Exception:
        return "127.0.0.1"


_BC_CHECK = (
    "that every rollout actor is alive and reaches the trainer's address {addr} (firewall, `ray status`)"
)


class BroadcastPublisher:
    """Trainer side, rank 0 of a group with `members` rollout actors (ranks 1..members)."""

    mode = "broadcast"

    def __init__(self, members: int, timeout: float, backend: str = "gloo", epoch: int = 0) -> None:
        self.members, self.timeout, self.backend, self.epoch = members, timeout, backend, epoch
        self.host = _node_ip()
        # rank 0's store listens from here on, on a port the OS picks as it binds (port 0): nothing
        # can take the port between choosing it and the members connecting to it
        import torch.distributed as dist

        delta = datetime.timedelta(seconds=timeout)
        self._store = dist.TCPStore(self.host, 0, members + 1, True, timeout=delta, wait_for_workers=False)
        self.port = int(self._store.port)
        self.pg: Any = None
        self.version = -1

    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def _check(self) -> str:
        return _BC_CHECK.format(addr=f"{self.host}:{self.port}")

    def connect(self) -> None:
        """Blocks until every member joined (or raises after the timeout)."""
        try:
            self.pg, _ = _join(
                self.host, self.port, 0, self.members + 1, self.timeout, self.epoch, self.backend, self._store
            )
        except Exception as e:
            raise sync_error(
                self.mode,
                0,
                f"could not form its group of {self.members + 1} ranks ({type(e).__name__})",
                self._check(),
                self.timeout,
            ) from e

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Every member must have been announced this version (it then joins the same collectives)."""
        layout = FlatLayout.of(state)
        delta = datetime.timedelta(seconds=self.timeout)
        device = "cuda" if self.backend == "nccl" else "cpu"
        try:
            self.pg.broadcast(torch.tensor([version], dtype=torch.int64, device=device), 0).wait(delta)
            for _, flat in sorted(layout.flatten(state).items()):
                self.pg.broadcast(flat.to(device), 0).wait(delta)
        except Exception as e:
            raise sync_error(
                self.mode,
                version,
                f"did not complete ({brief_error(e, 120, typed=True)})",
                self._check(),
                self.timeout,
            ) from e
        self.version = version


class BroadcastReceiver:
    """Actor side, rank `rank`: a thread joins the group, then takes part in each announced publish,
    receiving into staging buffers; `load_into` copies the newest complete version into the model."""

    mode = "broadcast"

    def __init__(
        self,
        layout: FlatLayout,
        host: str,
        port: int,
        rank: int,
        world: int,
        timeout: float,
        backend: str = "gloo",
        epoch: int = 0,
    ) -> None:
        self.layout, self.timeout = layout, timeout
        self._device = "cuda" if backend == "nccl" else "cpu"
        self._staging = {d: t.to(self._device) for d, t in layout.empty().items()}
        self._cond = threading.Condition()
        self._version = -1
        self._error: BaseException | None = None
        self._joined = False
        self._todo: queue.Queue[int] = queue.Queue()
        self._check = _BC_CHECK.format(addr=f"{host}:{port}")
        args = (host, port, rank, world, timeout, epoch, backend)
        threading.Thread(target=self._run, args=args, daemon=True, name="weights-broadcast").start()

    def announce(self, version: int, box: list[Any] | None = None) -> None:
        self._todo.put(version)

    def _run(self, *join_args: Any) -> None:
        version = 0
        try:
            pg, _store = _join(*join_args)
            self._joined = True
            delta = datetime.timedelta(seconds=self.timeout)
            while True:
                version = self._todo.get()
                header = torch.zeros(1, dtype=torch.int64, device=self._device)
                pg.broadcast(header, 0).wait(delta)
                with self._cond:  # load_into never sees a half-received version
                    for _, buf in sorted(self._staging.items()):
                        pg.broadcast(buf, 0).wait(delta)
                    self._version = int(header.item())
                    self._cond.notify_all()
        except Exception as e:
            with self._cond:
                self._error = sync_error(
                    self.mode,
                    version,
                    f"failed on this actor ({brief_error(e, 120, typed=True)})",
                    self._check,
                    self.timeout,
                )
                self._cond.notify_all()

    @property
    def version(self) -> int:
        if self._error is not None:
            raise self._error
        return self._version

    def status(self) -> str:
        """Where this rank stands in its group: joined, not yet, or why joining or a transfer failed."""
        if self._error is not None:
            return f"its weights failed: {brief_error(self._error, 200)}"
        return "joined the weight group" if self._joined else "not yet in the weight group"

    def snapshot(self) -> tuple[int, dict[str, torch.Tensor]]:
        with self._cond:
            if not self._cond.wait_for(lambda: self._version >= 0 or self._error, timeout=self.timeout):
                raise sync_error(self.mode, 0, "never arrived", self._check, self.timeout)
            if self._error is not None:
                raise self._error
            views = self.layout.unflatten(self._staging)
            return self._version, {n: v.clone() for n, v in views.items()}

    def load_into(self, model: torch.nn.Module) -> int:
        with self._cond:
            if not self._cond.wait_for(lambda: self._version >= 0 or self._error, timeout=self.timeout):
                raise sync_error(self.mode, 0, "never arrived", self._check, self.timeout)
            if self._error is not None:
                raise self._error
            copy_into(model, self.layout.unflatten(self._staging))
            return self._version

    def read(self, consume: Callable[[dict[str, torch.Tensor], int], None]) -> int:
        """Hand the newest weights to `consume` (an engine that holds its own copy, e.g. vLLM)."""
        version, tensors = self.snapshot()
        consume(tensors, version)
        return version
