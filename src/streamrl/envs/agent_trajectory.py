"""Turn the chat calls of one agent episode into token-in-token-out trajectories.

Calls are taken in order (the choices of an `n > 1` call in choice order). When a call's prompt token
ids begin with everything a trajectory so far holds (its prompt + completion), the call continues
that trajectory (the most recent such one: an agent that sampled several choices continues the one it
kept): the new prompt suffix (tool results, user turns, template glue) is appended as observation
tokens (loss mask 0, log-prob 0, the version of the token before it) and the call's completion as
policy tokens (mask 1; 0 for a call cut at its token limit when `mask_truncated`, loss.mask_truncated).
Otherwise the agent rewrote its history (dropped or edited a message, or the
template re-tokenised the assistant text differently), and the call starts a new trajectory: what the
policy saw is never re-tokenised. Every trajectory of an episode gets the episode's reward.
"""

from __future__ import annotations

from collections.abc import Sequence

from streamrl.envs.chat_completion import CallRecord
from streamrl.types import Trajectory


def assemble(
    calls: Sequence[CallRecord],
    problem_id: str,
    group_id: str,
    sample: int,
    reward: float,
    correct: bool,
    mask_truncated: bool = False,
) -> list[Trajectory]:
    """calls (in order) -> trajectories; sample ids are '{group_id}-{sample}' then '-{sample}.1', ..."""
    out: list[Trajectory] = []
    for call in calls:
        policy = 0 if mask_truncated and call.finish_reason == "length" else 1
        cur = next((t for t in reversed(out) if _continues(call.prompt_ids, t)), None)
        if cur is not None:
            context = len(cur.prompt_ids) + len(cur.completion_ids)
            obs = call.prompt_ids[context:]
            last_version = cur.versions[-1] if cur.versions else 0
            cur.completion_ids += obs + call.completion_ids
            cur.loss_mask += [0] * len(obs) + [policy] * len(call.completion_ids)
            cur.behaviour_logprobs += [0.0] * len(obs) + call.logprobs
            cur.versions += [last_version] * len(obs) + call.versions
            cur.finish_reason = call.finish_reason
            cur.text += call.text
            continue
        suffix = f".{len(out)}" if out else ""
        new = Trajectory(
            problem_id=problem_id,
            group_id=group_id,
            sample_id=f"{group_id}-{sample}{suffix}",
            prompt_ids=list(call.prompt_ids),
            completion_ids=list(call.completion_ids),
            behaviour_logprobs=list(call.logprobs),
            versions=list(call.versions),
            finish_reason=call.finish_reason,
            loss_mask=[policy] * len(call.completion_ids),
            text=call.text,
            reward=reward,
            correct=correct,
        )
        out.append(new)
    return out


def _continues(prompt_ids: list[int], t: Trajectory) -> bool:
    n = len(t.prompt_ids)
    return prompt_ids[:n] == t.prompt_ids and prompt_ids[n : n + len(t.completion_ids)] == t.completion_ids
