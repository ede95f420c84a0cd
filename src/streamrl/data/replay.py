"""Rollout replay (RLEP-style): recent successful samples are mixed back into later batches.

A sample is kept when it was trained fresh, is correct and had a positive advantage. Each batch of N
fresh samples gets  n = min(floor(share * N / (1 - share)), len(buffer))  replayed ones, so that
replayed / (fresh + replayed) = share once the buffer is full enough. They are drawn without
replacement (never the same sample twice in one batch) from the last `capacity` successes (a resumed
run's rollout.replay_capacity applies to its saved ones: a smaller one keeps the newest; resumed with
rollout.replay_share=0, its state keeps the saved buffer as it was, for a later resume with replay on).

A replayed sample keeps its tokens, its behaviour log-probs and versions from the policy that produced
it, and the advantage it was trained with. The loss corrects for the policy gap like for any stale
sample: decoupled PPO weights each token by w = pi_prox / pi_behav (capped by loss.behav_weight_cap),
so old samples count for what the current policy would still do. Replayed samples are tagged
(`reward_info["replayed"]`, sample id suffix `-r<step>`) and are not groups: the ledger, which counts
groups, is untouched; it only adds the number replayed.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from streamrl.types import TrainBatch, Trajectory


@dataclass
class Replayed:
    trajectory: Trajectory
    advantage: float
    step: int  # the step it was first trained in


class ReplayBuffer:
    def __init__(self, share: float, capacity: int, seed: int = 0) -> None:
        if not 0 <= share < 1:
            raise ValueError(f"rollout.replay_share must be in [0, 1), got {share}")
        self.share = share
        self.items: deque[Replayed] = deque(maxlen=capacity)
        self.rng = random.Random(seed)
        self.replayed_total = 0

    def add(self, batch: TrainBatch, step: int) -> None:
        """Keep the batch's fresh, correct, positively-advantaged samples."""
        for t, a in zip(batch.trajectories, batch.advantages):
            if t.correct and a > 0 and not t.reward_info.get("replayed"):
                self.items.append(Replayed(t, a, step))

    def mix(self, batch: TrainBatch, step: int) -> tuple[TrainBatch, dict[str, float]]:
        """(fresh batch + replayed samples, metrics). Distinct buffer entries, so no sample twice."""
        fresh = len(batch.trajectories)
        n = min(math.floor(self.share * fresh / (1 - self.share)), len(self.items))
        picked = [self.items[i] for i in self.rng.sample(range(len(self.items)), n)]
        trajs = [
            replace(
                r.trajectory,
                sample_id=f"{r.trajectory.sample_id}-r{step}",
                reward_info={**r.trajectory.reward_info, "replayed": True},
            )
            for r in picked
        ]
        rewards = batch.rewards or [t.reward for t in batch.trajectories]
        out = TrainBatch(
            trajectories=batch.trajectories + trajs,
            advantages=batch.advantages + [r.advantage for r in picked],
            rewards=rewards + [t.reward for t in trajs],
        )
        self.replayed_total += n
        ages = [step - r.step for r in picked]
        return out, {
            "replay_samples": float(n),
            "replay_share": n / max(fresh + n, 1),
            "replay_age_mean": sum(ages) / n if n else 0.0,
            "replay_buffer_size": float(len(self.items)),
        }

    def state(self) -> list[Any]:
        """[capacity saved, entries oldest first, the sampling generator's state, replayed so far]."""
        return [self.items.maxlen, list(self.items), self.rng.getstate(), self.replayed_total]

    def load(self, s: list[Any]) -> None:
        """A saved state() into this buffer, whose capacity (rollout.replay_capacity, given on resume)
        is kept: a smaller one keeps the newest entries."""
        self.items = deque(s[1], maxlen=self.items.maxlen)
        self.rng.setstate(s[2])
        self.replayed_total = s[3]


def make_replay(cfg: Any) -> ReplayBuffer | None:
    r = cfg.rollout
    return ReplayBuffer(r.replay_share, r.replay_capacity, cfg.seed) if r.replay_share > 0 else None


def replay_kept_note(saved: list[Any]) -> str:
    """The line a resume with replay off (rollout.replay_share=0) says about the buffer it saved
    (ReplayBuffer.state()): nothing is replayed, and every save keeps the buffer as it was saved."""
    return (
        f"streamrl: note: rollout.replay_share is 0: the {len(saved[1])} success(es) in the saved replay "
        "buffer are not replayed; the run state keeps them for a resume with rollout.replay_share > 0"
    )
