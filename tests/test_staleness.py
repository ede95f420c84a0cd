"""The admission bound under randomised engine delays, simulated event by event over many seeds.

The simulation keeps its own record of every group (admitted at which policy version, trained at
which, filtered or not) and checks the manager against it, never against the manager's counters."""

import heapq
import random

import pytest

from streamrl.loop.ledger import Ledger
from streamrl.loop.staleness import StalenessManager


def simulate(seed: int, B: int, eta: int, steps: int, workers: int = 3, in_order: bool = False) -> dict:
    """Workers finish admitted groups after random (heavy-tailed) delays; the trainer takes B groups as
    AsyncRunner does: the buffered ones on their last version within the bound first, waiting for those
    still running while they are at least as many as the places left, then the oldest that finished
    first; it filters any staler than eta.

    in_order=True: groups come back in admission order (one FIFO queue) and nothing is filtered, so
    the staleness of every trained group is the manager's doing alone.
    At each admission the simulation checks, from its own events, that the live groups (admitted and
    not filtered: a kept group holds its slot) stay under (min(eta, version) + version + 1) * B, and
    that a refusal happens exactly at that bound, not before."""
    rng = random.Random(seed)
    sm = StalenessManager(B, eta)
    ledger = Ledger()
    version, now, n, n_filtered, last_finish = 0, 0.0, 0, 0, 0.0
    events: list[tuple[float, int, str]] = []  # (finish time, seq, group id)
    admitted_at: dict[str, int] = {}
    buffer: list[str] = []
    trained: list[tuple[str, int, int]] = []  # (group id, version at admission, version trained at)
    while version < steps:
        while True:
            live, bound = n - n_filtered, (min(eta, version) + version + 1) * B
            if not sm.try_admit():
                assert live == bound, f"version {version}: admission refused at {live} live groups < {bound}"
                break
            assert live < bound, f"version {version}: group {live + 1} admitted past the bound {bound}"
            gid = f"g{n}"
            n += 1
            ledger.admitted(gid)
            admitted_at[gid] = version
            delay = rng.expovariate(1.0) * (20 if rng.random() < 0.1 else 1)  # a long tail
            finish = now + delay / workers
            if in_order:
                finish = last_finish = max(finish, last_finish)
            heapq.heappush(events, (finish, n, gid))
        assert events, f"version {version}: nothing running and nothing admitted (deadlock)"
        now, _, gid = heapq.heappop(events)
        sm.on_return(kept=True)
        ledger.returned(gid)
        buffer.append(gid)
        while version < steps:
            batch = []
            while len(batch) < B and buffer:
                i = min(range(len(buffer)), key=lambda k: (admitted_at[buffer[k]], k))
                due = sum(admitted_at[g] <= version - eta for _, _, g in events)  # still running
                if not in_order and admitted_at[buffer[i]] > version - eta and due >= B - len(batch):
                    break  # wait for them
                g = buffer.pop(i)
                if not in_order and version - admitted_at[g] > eta:
                    ledger.filtered(g, "stale")
                    sm.release_accepted()
                    n_filtered += 1
                else:
                    batch.append(g)
            if len(batch) < B:
                buffer[:0] = batch
                break
            for g in batch:
                ledger.trained(g)
                trained.append((g, admitted_at[g], version))
            version += 1
            sm.set_version(version)
    ledger.carry_over()
    return {"trained": trained, "counts": ledger.counts(), "admitted": n}


@pytest.mark.parametrize("eta", [0, 1, 2, 4])
def test_groups_returned_in_order_are_never_staler_than_eta(eta):
    """Nothing filters here: admission control alone bounds how far behind a trained group's policy is.
    The lead ramps up: a group admitted under version a is at most min(eta, a) versions old when
    trained, so the base policy generates exactly one batch and the first step is synchronous."""
    for seed in range(30):
        out = simulate(seed, B=4, eta=eta, steps=25, in_order=True)
        stale = [trained_at - admitted for _, admitted, trained_at in out["trained"]]
        assert len(stale) == 25 * 4 and out["counts"]["filtered"] == 0
        assert max(stale) == eta, f"seed {seed}: staleness {max(stale)} with eta={eta}"
        for g, admitted, trained_at in out["trained"]:
            assert trained_at - admitted <= min(eta, admitted), f"seed {seed}: {g} admitted at {admitted}"
        assert sum(admitted == 0 for _, admitted, _ in out["trained"]) == 4


@pytest.mark.parametrize("eta", [0, 1, 2, 4])
def test_bound_holds_under_random_delays(eta):
    seen, filtered = set(), 0
    for seed in range(60):
        out = simulate(seed, B=4, eta=eta, steps=25)
        seen.update(trained_at - admitted for _, admitted, trained_at in out["trained"])
        filtered += out["counts"]["filtered"]
        c = out["counts"]
        assert c["lost"] == 0
        assert c["trained"] + c["filtered"] + c["carried_over"] == out["admitted"]
        ids = [g for g, _, _ in out["trained"]]
        assert len(ids) == len(set(ids)) == 25 * 4
    assert max(seen) == eta  # groups eta versions old are trained, not filtered
    # at most B groups are on their last version at once with eta <= 1, and the batch waits for them:
    # none comes back too stale; with a larger eta the long tail still produces some
    assert (filtered > 0) == (eta > 1)


def test_eta_zero_is_synchronous():
    for seed in range(30):
        out = simulate(seed, B=3, eta=0, steps=10)
        assert [trained_at - admitted for _, admitted, trained_at in out["trained"]] == [0] * 30
        assert out["counts"]["filtered"] == 0 and out["admitted"] == 30  # never more than one batch ahead


def test_capacity_formula_and_rebase_on_resume():
    sm = StalenessManager(batch_groups=8, max_staleness=2)
    assert sm.capacity() == 8  # (min(2, 0) + 0 + 1) * 8: the base policy generates one batch
    for _ in range(8):
        assert sm.try_admit()
    assert not sm.try_admit() and sm.capacity() == 0
    sm.on_return(kept=True)
    sm.set_version(1)
    assert sm.capacity() == 16  # (1 + 1 + 1) * 8 - 8
    for _ in range(16):
        assert sm.try_admit()
    assert not sm.try_admit()
    sm.set_version(2)
    assert sm.capacity() == 16  # (2 + 2 + 1) * 8 - 24
    sm.set_version(3)
    assert sm.capacity() == 24  # (2 + 3 + 1) * 8 - 24: the full lead from version eta on
    # resumed at version 5 with 3 finished groups carried over: (2 + 5 + 1) * 8 - (5 * 8 + 3) = 21,
    # not the 64 a counter reset to zero would allow (AReaL issue #1388)
    resumed = StalenessManager.resumed(8, 2, version=5, buffered=3, running=0)
    assert resumed.capacity() == 21


def test_bad_arguments_and_misuse():
    with pytest.raises(ValueError, match="max_staleness >= 0"):
        StalenessManager(4, -1)
    sm = StalenessManager(4, 0)
    with pytest.raises(RuntimeError, match="never admitted"):
        sm.on_return(kept=True)
