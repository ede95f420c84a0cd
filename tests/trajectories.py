"""One way to build a Trajectory in tests (tests/ is on sys.path via the rootdir conftest)."""

from streamrl.types import Trajectory


def make_traj(i, prompt, completion, reward=0.0, logprobs=None, loss_mask=None):
    return Trajectory(
        problem_id=f"p{i}",
        group_id="g",
        sample_id=f"s{i}",
        prompt_ids=list(prompt),
        completion_ids=list(completion),
        behaviour_logprobs=logprobs or [0.0] * len(completion),
        versions=[0] * len(completion),
        finish_reason="stop",
        loss_mask=loss_mask or [],
        reward=reward,
    )
