"""The admission bound under randomised engine delays, simulated event by event over many seeds."""

import heapq
import random

import pytest

from streamrl.loop.ledger import Ledger
from streamrl.loop.staleness import StalenessManager


def simulate(seed: int, B: int, eta: int, steps: int, workers: int = 3) -> dict:
    """Workers finish admitted groups after random (heavy-tailed) delays; the trainer takes B groups
    oldest-first whenever B are buffered, filtering any staler than eta, exactly as AsyncRunner does."""
    rng = random.Random(seed)
    sm = StalenessManager(B, eta)
    ledger = Ledger()
    version, now, n = 0, 0.0, 0
    events: list[tuple[float, int, str]] = []  # (finish time, seq, group id)
    admitted_at: dict[str, int] = {}
    buffer: list[str] = []
    trained: list[tuple[str, int]] = []
    while version < steps:
        while sm.try_admit():
            gid = f"g{n}"
            n += 1
            ledger.admitted(gid)
            admitted_at[gid] = version
            delay = rng.expovariate(1.0) * (20 if rng.random() < 0.1 else 1)  # a long tail
            heapq.heappush(events, (now + delay / workers, n, gid))
            s = sm.state
            assert s.accepted + s.running <= (eta + s.version + 1) * B
        now, _, gid = heapq.heappop(events)
        sm.on_return(kept=True)
        ledger.returned(gid)
        buffer.append(gid)
        while len(buffer) >= B:
            batch = []
            while len(batch) < B and buffer:
                g = buffer.pop(0)
                if version - admitted_at[g] > eta:
                    ledger.filtered(g, "stale")
                    sm.release_accepted()
                else:
                    batch.append(g)
            if len(batch) < B:
                buffer[:0] = batch
                break
            for g in batch:
                ledger.trained(g)
                trained.append((g, version - admitted_at[g]))
            version += 1
            sm.set_version(version)
    ledger.carry_over()
    return {"trained": trained, "counts": ledger.counts(), "admitted": n}


@pytest.mark.parametrize("eta", [0, 1, 2, 4])
def test_bound_holds_under_random_delays(eta):
    seen, filtered = set(), 0
    for seed in range(60):
        out = simulate(seed, B=4, eta=eta, steps=25)
        assert all(stale <= eta for _, stale in out["trained"])
        seen.update(stale for _, stale in out["trained"])
        filtered += out["counts"]["filtered"]
        c = out["counts"]
        assert c["lost"] == 0
        assert c["trained"] + c["filtered"] + c["carried_over"] == out["admitted"]
        ids = [g for g, _ in out["trained"]]
        assert len(ids) == len(set(ids)) == 25 * 4
    assert max(seen) == eta  # the bound is reached, so the test would see it broken
    assert (filtered > 0) == (eta > 0)  # the long tail really produces too-stale groups


def test_eta_zero_is_synchronous():
    for seed in range(30):
        out = simulate(seed, B=3, eta=0, steps=10)
        assert [s for _, s in out["trained"]] == [0] * 30
        assert out["counts"]["filtered"] == 0 and out["admitted"] == 30  # never more than one batch ahead


def test_capacity_formula_and_rebase_on_resume():
    sm = StalenessManager(batch_groups=8, max_staleness=2)
    assert sm.capacity() == 24  # (2 + 0 + 1) * 8
    for _ in range(24):
        assert sm.try_admit()
    assert not sm.try_admit() and sm.capacity() == 0
    sm.on_return(kept=True)
    sm.set_version(1)
    assert sm.capacity() == 8
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
