"""env:search (ASearcher-style): answer questions by searching a local corpus with BM25.

Protocol, per model turn:
- `<answer>...</answer>` ends the episode; reward = 1 if the normalised answer equals the normalised
  reference or one of its aliases (lower case, no punctuation, no articles, single spaces);
- else `<search>query</search>` (the last one of the turn) returns the top-k passages as the
  observation;
- else (neither) the observation is a reminder of the protocol and the episode goes on (Search-R1);
  an episode that never answers ends at the limits with reward 0.
The corpus and questions are shipped in envs/data (made by scripts/make_search_corpus.py).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import string
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from streamrl.config import EnvConfig, TaskConfig
from streamrl.data.task import Score
from streamrl.envs.base import EnvStep, EnvTask, ProblemEnv, register, truncate_middle
from streamrl.types import Problem

DATA = Path(__file__).parent / "data"
SYSTEM_PROMPT = (
    "Answer the question with the help of a search engine over a document collection. To search, "
    "write <search>your query</search> and end your turn; the top passages come back in the next "
    "message. You may search several times. When you know the answer, write <answer>the answer</answer>."
)
INVALID = "No action found. To search write <search>query</search>; to answer write <answer>answer</answer>."
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_SEARCH = re.compile(r"<search>(.*?)</search>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """'The  Bran River.' -> 'bran river' (SQuAD-style exact-match normalisation)."""
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(_ARTICLES.sub(" ", text).split())


def extract_tag_answer(text: str) -> str | None:
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Bm25Retriever:
    """BM25 (bm25s) over passages {id, title, text}; search(query, k) -> the k best passages."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        import bm25s

        self.docs = docs
        self._bm25s = bm25s
        self.index = bm25s.BM25()
        corpus = [f"{d['title']}. {d['text']}" for d in docs]
        self.index.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)

    def search(self, query: str, k: int) -> list[dict[str, Any]]:
        tokens = self._bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)
        if not tokens[0]:  # only stopwords or punctuation: nothing to match
            return []
        k = min(k, len(self.docs))
        ids, scores = self.index.retrieve(tokens, k=k, show_progress=False)
        return [self.docs[int(i)] for i, s in zip(ids[0], scores[0]) if s > 0]


@lru_cache(maxsize=4)
def load_retriever(corpus: Path = DATA / "search_corpus.jsonl") -> Bm25Retriever:
    """One index per process and corpus file (built in well under a second for the shipped corpus)."""
    return Bm25Retriever(_read_jsonl(corpus))


class SearchEnv(ProblemEnv):
    def __init__(self, task: SearchTask, retriever: Bm25Retriever, top_k: int, max_chars: int) -> None:
        self.task, self.retriever, self.top_k, self.max_chars = task, retriever, top_k, max_chars

    def step(self, text: str) -> EnvStep:
        problem = self.current()
        answer = extract_tag_answer(text)
        queries = _SEARCH.findall(text)
        if not queries and answer is None:  # Search-R1: say how to act and let the model try again
            return EnvStep(INVALID, 0.0, False, {"formatted": False})
        if answer is not None:
            s = self.task.score(problem, text)
            info = {"correct": s.correct, "formatted": s.formatted, "extracted": s.extracted}
            return EnvStep("", float(s.correct), True, info)
        hits = self.retriever.search(queries[-1].strip(), self.top_k)
        body = "\n".join(f"[{i}] {d['title']}: {d['text']}" for i, d in enumerate(hits, 1))
        obs = truncate_middle(body or "No passages found.", self.max_chars)
        return EnvStep(obs, 0.0, False, {"hits": len(hits)})


class SearchTask(EnvTask):
    """The shipped questions: held-out = the first min(n, N // 4) in a fixed hashed order (so the
    default eval.size never leaves the training stream empty); training = the rest, reshuffled per
    epoch."""

    def __init__(
        self,
        args: dict[str, Any],
        system_prompt: str,
        instruction: str,
        extract: str,
        env_cfg: EnvConfig,
    ) -> None:
        if system_prompt in ("", TaskConfig().system_prompt):  # the single-turn default knows no search tool
            system_prompt = SYSTEM_PROMPT
        super().__init__(system_prompt, instruction, extract)
        if args:
            raise ValueError(f"task env:search takes no task_config.args, got {sorted(args)}; remove them")
        self.name = "env:search"
        self.env_cfg = env_cfg
        rows = _read_jsonl(DATA / "search_questions.jsonl")
        self.rows = sorted(rows, key=lambda r: hashlib.sha1(r["question"].encode()).hexdigest())

    def _make(self, row: dict[str, Any]) -> Problem:
        meta = {"aliases": row.get("aliases", []), "doc_id": row.get("doc_id")}
        return self._problem(f"search-{row['id']}", row["question"], row["answer"], meta)

    def heldout(self, n: int) -> list[Problem]:
        return [self._make(r) for r in self.rows[: min(n, len(self.rows) // 4)]]

    def train_stream(self, seed: int, exclude: set[str]) -> Iterator[Problem]:
        rows = [r for r in self.rows if r["question"] not in exclude]
        rng = random.Random(seed)
        while True:
            rng.shuffle(rows)
            yield from (self._make(r) for r in rows)

    def score(self, problem: Problem, text: str) -> Score:
        extracted = extract_tag_answer(text)
        if extracted is None:
            return Score(False, False, None)
        return Score(self.is_correct(extracted, problem), True, extracted)

    def is_correct(self, extracted: str, problem: Problem) -> bool:
        refs = [problem.answer, *problem.meta.get("aliases", [])]
        return normalize_answer(extracted) in {normalize_answer(r) for r in refs}

    def new_env(self) -> SearchEnv:
        return SearchEnv(self, load_retriever(), self.env_cfg.top_k, self.env_cfg.max_observation_chars)


@register("search")
def build(sandbox_executor: str = "local", sandbox_min_isolation: str = "auto", **kw: Any) -> SearchTask:
    return SearchTask(**kw)  # its tool runs no code: the sandbox's settings are not read
