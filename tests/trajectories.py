"""One way to build a Trajectory in tests, and a random batch of them (tests/ is on sys.path via the
rootdir conftest)."""

import torch

from streamrl.types import TrainBatch, Trajectory


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


def random_batch(
    n: int,
    seed: int,
    prompt_lens: tuple[int, int] = (2, 9),
    completion_lens: tuple[int, int] = (1, 7),
    logprob_spread: float = 1.0,
) -> TrainBatch:
    """n ragged trajectories from one generator seeded `seed`: random tokens in [3, 200), prompt and
    completion lengths in [lo, hi) of prompt_lens and completion_lens, behaviour log-probs uniform in
    [-logprob_spread, 0]; then n standard-normal advantages."""
    g = torch.Generator().manual_seed(seed)

    def tokens(lens: tuple[int, int]) -> list[int]:
        size = int(torch.randint(*lens, (1,), generator=g))
        return torch.randint(3, 200, (size,), generator=g).tolist()

    trajs = []
    for i in range(n):
        p, c = tokens(prompt_lens), tokens(completion_lens)
        trajs.append(
            make_traj(i, p, c, logprobs=(-logprob_spread * torch.rand(len(c), generator=g)).tolist())
        )
    return TrainBatch(trajectories=trajs, advantages=torch.randn(n, generator=g).tolist())
