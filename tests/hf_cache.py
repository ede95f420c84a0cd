"""Hugging Face datasets for the data tests: GSM8K-like tables and a hub cache (tests/ is on sys.path)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import datasets

COLS = {"prompt": "question", "id": "uid"}


def gsm8k_table(split: str, n: int) -> datasets.Dataset:
    """n GSM8K-like rows: question, a worked solution ending '#### 2,000 i', a uid naming split and row."""
    return datasets.Dataset.from_dict(
        {
            "question": [f"{split} {i}: what is {i} + {i}?" for i in range(n)],
            "answer": [
                f"{i}000 + {i}000 = <<{i}000+{i}000={2 * i}000>>.\n#### {2000 * i:,}" for i in range(n)
            ],
            "uid": [f"{split}-{i}" for i in range(n)],
        }
    )


def sha1_order(questions):
    return sorted(questions, key=lambda q: hashlib.sha1(q.encode()).hexdigest())


def hub_snapshot(hub: Path, repo: str, splits: dict[str, datasets.Dataset]) -> None:
    """A dataset repository as the hub cache holds it (`hf download --repo-type dataset REPO`):
    datasets--ORG--NAME/refs/main -> a revision, whose snapshot holds data/<split>-00000-of-00001.parquet."""
    root = hub / f"datasets--{repo.replace('/', '--')}"
    rev = hashlib.sha1(repo.encode()).hexdigest()
    for name, table in splits.items():
        table.to_parquet(str(root / "snapshots" / rev / "data" / f"{name}-00000-of-00001.parquet"))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(rev)
