"""`rg:NAME`: reasoning-gym problems (lazy, deterministic by index and seed), scored with the
dataset's own `score_answer`; a sample is correct only at full score (1.0), because reasoning-gym
gives wrong answers small partial credit. `rg:composite` mixes datasets:
task_config.args.datasets=[{name, weight, config}, ...]."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from streamrl.data.task import HELDOUT_SEED, Task
from streamrl.types import Problem


class ReasoningGymTask(Task):
    def __init__(self, dataset: str, args: dict[str, Any], **kw: Any) -> None:
        import reasoning_gym

        super().__init__(**kw)
        self.name = f"rg:{dataset}"
        self.dataset = dataset
        self.args = dict(args)
        names = sorted(reasoning_gym.factory.DATASETS)
        if dataset not in names:
            raise ValueError(f"unknown reasoning-gym task '{dataset}'; choose from: {', '.join(names)}")
        try:
            self._scorer = self._create(1, 0)
        except (TypeError, AssertionError, KeyError, ValueError) as e:
            raise ValueError(f"bad task_config.args for rg:{dataset}: {e}") from e

    def _create(self, size: int, seed: int) -> Any:
        """The generator; composite's `datasets` list of dicts becomes reasoning-gym DatasetSpecs."""
        import reasoning_gym

        args = dict(self.args)
        if self.dataset == "composite":
            from reasoning_gym.composite import DatasetSpec

            specs = args.get("datasets")
            if not isinstance(specs, list) or not specs:
                raise ValueError("rg:composite needs task_config.args.datasets=[{name, weight, config}, ...]")
            args["datasets"] = [
                DatasetSpec(str(d["name"]), float(d.get("weight", 1.0)), dict(d.get("config") or {}))
                for d in specs
            ]
        return reasoning_gym.create_dataset(self.dataset, size=size, seed=seed, **args)

    def _stream(self, seed: int, prefix: str) -> Iterator[Problem]:
        ds = self._create(2**62, seed)
        idx = 0
        while True:
            entry = ds[idx]
            yield self._problem(
                f"{prefix}{seed}-{idx}", entry["question"], str(entry["answer"]), {"entry": entry}
            )
            idx += 1

    def heldout(self, n: int) -> list[Problem]:
        out: list[Problem] = []
        if n == 0:
            return out
        seen: set[str] = set()
        misses = 0
        for p in self._stream(HELDOUT_SEED, "eval-"):
            q = p.meta["question"]
            if q in seen:
                misses += 1
                if misses > 50 * n + 1000:
                    raise ValueError(
                        f"task {self.name} has fewer than {n} distinct problems; lower eval.size "
                        "or widen task_config.args"
                    )
                continue
            seen.add(q)
            out.append(p)
            if len(out) == n:
                return out
        return out

    def train_stream(self, seed: int, exclude: set[str]) -> Iterator[Problem]:
        """The generator's problems but those in `exclude` (held out, few-shot examples); raises once
        so many in a row are excluded that the generator has no other problem to give."""
        skipped = 0
        for p in self._stream(seed, "train-"):
            if p.meta["question"] not in exclude:
                skipped = 0
                yield p
                continue
            skipped += 1
            if skipped > 50 * len(exclude) + 1000:
                raise ValueError(
                    f"task {self.name}: every problem it generates is held out or a few-shot example "
                    f"({len(exclude)} of them): lower eval.size or widen task_config.args"
                )

    def is_correct(self, extracted: str, problem: Problem) -> bool:
        return self._scorer.score_answer(extracted, problem.meta["entry"]) == 1.0
