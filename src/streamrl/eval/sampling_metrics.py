"""pass@k, avg@k and maj@k over n sampled answers per problem: pure functions.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): the unbiased estimate of
the chance that at least one of k samples drawn without replacement from the n is correct,
1 - C(n - c, k) / C(n, k), computed as a product so it stays exact at n = 256 and beyond.

avg@k: the mean accuracy of a sample, c / n (every k <= n has the same unbiased estimate; reported once).

maj@k: majority vote over the extracted answers of the FIRST k samples (in sampling order, so the value
is deterministic for a given set of samples). Unextracted answers (None) do not vote; no vote at all is
wrong. Ties go to the answer that appeared first among the k samples; that rule is what makes maj@k a
deterministic function of the sample order. Answers are grouped with `same` (default: string equality
after stripping; a task passes its own equivalence, Task.same_answer, to group "0.5" with "1/2"), and
the vote is correct when the winning cluster's first sample was scored correct (so any task's verdict
counts: a program's tests, a reasoning-gym scorer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k)/C(n, k) for n samples of which c are correct; 0 <= c <= n, 1 <= k <= n.

    n=5, c=2, k=2 -> 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):  # C(n-c,k)/C(n,k) = prod_{i=n-c+1}^{n} (1 - k/i)
        miss *= 1.0 - k / i
    return 1.0 - miss


def majority_index(
    answers: Sequence[str | None], same: Callable[[str, str], bool] | None = None
) -> int | None:
    """The index of the first sample of the most frequent answer (first-seen wins ties); None if
    nothing was extracted."""
    eq = same or (lambda a, b: a.strip() == b.strip())
    clusters: list[list[int]] = []  # sample indices, in order of first appearance
    for i, a in enumerate(answers):
        if a is None:
            continue
        for cl in clusters:
            if eq(answers[cl[0]], a):  # type: ignore[arg-type]
                cl.append(i)
                break
        else:
            clusters.append([i])
    if not clusters:
        return None
    best = max(len(cl) for cl in clusters)
    return next(cl[0] for cl in clusters if len(cl) == best)


def maj_at_k(
    answers: Sequence[str | None],
    correct: Sequence[bool],
    k: int,
    same: Callable[[str, str], bool] | None = None,
) -> bool:
    """Is the majority answer of the first k samples correct? answers, correct: [n] per sample."""
    if not 1 <= k <= len(answers) or len(correct) != len(answers):
        raise ValueError(f"maj@k needs 1 <= k <= n={len(answers)} and n verdicts, got k={k}")
    winner = majority_index(answers[:k], same)
    return winner is not None and bool(correct[winner])


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself: the k values reported when none are asked for."""
    ks = []
    k = 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def summarize(
    correct: Sequence[Sequence[bool]], ks: Sequence[int], majority: Sequence[Sequence[bool]] | None = None
) -> dict[str, float]:
    """Problem-averaged pass@k for each k, avg@n, and maj@k when per-problem majority results are given.

    correct: [problems][n] per-sample correctness; majority: [problems][len(ks)] maj@k outcomes.
    """
    if not correct:
        raise ValueError("no problems to summarize")
    n = len(correct[0])
    if any(len(row) != n for row in correct):
        raise ValueError("every problem needs the same number of samples n")
    out: dict[str, float] = {}
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(n, sum(row), k) for row in correct) / len(correct)
    out[f"avg@{n}"] = sum(sum(row) / n for row in correct) / len(correct)
    if majority is not None:
        for j, k in enumerate(ks):
            out[f"maj@{k}"] = sum(float(row[j]) for row in majority) / len(majority)
    return out
