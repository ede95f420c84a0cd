"""Turn the chat calls of one agent episode into token-in-token-out trajectories.

Calls are taken in order. When a call's prompt token ids begin with everything the running trajectory
holds (its prompt + completion so far), the call continues that trajectory: the new prompt suffix (tool
results, user turns, template glue) is appended as observation tokens (loss mask 0, log-prob 0, the
version of the token before it) and the call's completion as policy tokens (mask 1). Otherwise the
agent rewrote its history (dropped or edited a message, or the template re-tokenised the assistant
text differently), and the call starts a new trajectory: what the policy saw is never re-tokenised.
Every trajectory of an episode gets the episode's reward.
"""

from __future__ import annotations

from collections.abc import Sequence

from streamrl.envs.proxy import CallRecord
from streamrl.types import Trajectory


def assemble(
    calls: Sequence[CallRecord], problem_id: str, group_id: str, sample: int, reward: float, correct: bool
) -> list[Trajectory]:
    """calls (in order) -> trajectories; sample ids are '{group_id}-{sample}' then '-{sample}.1', ..."""
    out: list[Trajectory] = []
    cur: Trajectory | None = None
    for call in calls:
        context = [] if cur is None else cur.prompt_ids + cur.completion_ids
        if cur is not None and call.prompt_ids[: len(context)] == context:
            obs = call.prompt_ids[len(context) :]
            last_version = cur.versions[-1] if cur.versions else 0
            cur.completion_ids += obs + call.completion_ids
            cur.loss_mask += [0] * len(obs) + [1] * len(call.completion_ids)
            cur.behaviour_logprobs += [0.0] * len(obs) + call.logprobs
            cur.versions += [last_version] * len(obs) + call.versions
            cur.finish_reason = call.finish_reason
            cur.text += call.text
            continue
        suffix = f".{len(out)}" if out else ""
        cur = Trajectory(
            problem_id=problem_id,
            group_id=group_id,
            sample_id=f"{group_id}-{sample}{suffix}",
            prompt_ids=list(call.prompt_ids),
            completion_ids=list(call.completion_ids),
            behaviour_logprobs=list(call.logprobs),
            versions=list(call.versions),
            finish_reason=call.finish_reason,
            loss_mask=[1] * len(call.completion_ids),
            text=call.text,
            reward=reward,
            correct=correct,
        )
        out.append(cur)
    return out
