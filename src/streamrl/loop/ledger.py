"""Exactly-once accounting of groups: every admitted group ends trained, filtered or carried over.

States: running (admitted, not returned) -> buffered (returned, kept) -> trained; or -> filtered
(returned, dropped: all-equal rewards under dynamic sampling, too stale, ...). At shutdown, running and
buffered groups are carried over into the checkpoint. `lost` counts ids admitted but in no final state,
and those a resumed state carried over without holding them (state "lost", loop/state.py
reconcile_carried); it is 0 unless a resumed state lost groups. A second transition of an id is an
error, not a silent double count.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Ledger:
    def __init__(self) -> None:
        self.state: dict[str, str] = {}
        self.generated = 0  # groups returned by rollout workers (each G samples)
        self.filter_reasons: dict[str, int] = {}
        self.replayed_samples = 0  # rollout replay: samples trained again (not groups: no state change)
        self.regenerated = 0  # carried-over unfinished groups generated again after a resume

    def _move(self, gid: str, frm: tuple[str, ...], to: str) -> None:
        cur = self.state.get(gid)
        if cur not in frm:
            raise RuntimeError(f"group {gid}: cannot go from {cur!r} to {to!r} (allowed from {frm})")
        self.state[gid] = to

    def admitted(self, gid: str) -> None:
        self._move(gid, (None,), "running")

    def requeue(self, gid: str, to: str) -> None:
        """On resume: a carried-over group goes back to running (re-generated) or buffered (finished)."""
        self._move(gid, ("carried_over",), to)
        self.regenerated += to == "running"

    def returned(self, gid: str) -> None:
        self.generated += 1
        self._move(gid, ("running",), "buffered")

    def trained(self, gid: str) -> None:
        self._move(gid, ("buffered",), "trained")

    def filtered(self, gid: str, reason: str) -> None:
        self._move(gid, ("running", "buffered"), "filtered")
        self.filter_reasons[reason] = self.filter_reasons.get(reason, 0) + 1

    def replayed(self, n: int) -> None:
        self.replayed_samples += n

    def carry_over(self) -> list[str]:
        """At shutdown: everything not yet trained or filtered is carried over; returns those ids."""
        ids = [g for g, s in self.state.items() if s in ("running", "buffered")]
        for g in ids:
            self.state[g] = "carried_over"
        return ids

    def drop_buffered(self, reason: str) -> list[str]:
        """Every returned group not yet trained is filtered for `reason` (a colocated step that failed
        before its update); returns those ids."""
        ids = [g for g, s in self.state.items() if s == "buffered"]
        for g in ids:
            self.filtered(g, reason)
        return ids

    def counts(self) -> dict[str, Any]:
        """Totals by final state. `lost` = groups still running or buffered (0 after carry_over()) and
        those a resumed state lost."""
        by = {s: 0 for s in ("trained", "filtered", "carried_over", "running", "buffered", "lost")}
        for s in self.state.values():
            by[s] += 1
        return {
            "admitted": len(self.state),
            "generated": self.generated,
            "trained": by["trained"],
            "filtered": by["filtered"],
            "carried_over": by["carried_over"],
            "lost": by["running"] + by["buffered"] + by["lost"],
            "filter_reasons": dict(self.filter_reasons),
            "replayed_samples": self.replayed_samples,
            "regenerated": self.regenerated,
        }

    def snapshot(self) -> dict[str, Any]:
        """state_dict() as if carry_over() ran now, leaving this ledger as it is (periodic saves: a run
        resumed from it carries over what was running or buffered at the save)."""
        d = self.state_dict()
        d["state"] = {g: "carried_over" if s in ("running", "buffered") else s for g, s in self.state.items()}
        return d

    def state_dict(self) -> dict[str, Any]:
        return {
            "state": dict(self.state),
            "generated": self.generated,
            "filter_reasons": dict(self.filter_reasons),
            "replayed_samples": self.replayed_samples,
            "regenerated": self.regenerated,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.state = dict(d["state"])
        self.generated = int(d["generated"])
        self.filter_reasons = dict(d["filter_reasons"])
        self.replayed_samples = int(d.get("replayed_samples", 0))
        self.regenerated = int(d.get("regenerated", 0))

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> Ledger:
        led = cls()
        led.load_state_dict(d)
        return led

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.counts(), indent=2))
