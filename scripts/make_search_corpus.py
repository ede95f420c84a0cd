"""Write the offline corpus and questions of env:search (deterministic: same files on every run).

    python scripts/make_search_corpus.py [--out src/streamrl/envs/data]

100 invented countries, each with a capital, a river, a founding year, a founder and a national
animal. Two passages per country (geography, history), each also naming a neighbour: those mentions
are the distractors a search has to rank below the right passage. One question per country, on one of
its five facts; `doc_id` names the passage that answers it.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

N_COUNTRIES = 100
_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "br", "dr", "kr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_ENDS = ["ria", "nia", "lor", "dan", "mar", "vek", "sia", "tor", "wen", "ros"]
_ANIMALS = ["heron", "lynx", "otter", "falcon", "ibex", "badger", "crane", "marten", "stag", "viper"]
_REGIONS = ["northern", "southern", "eastern", "western", "central"]


def _word(rng: random.Random, syllables: int, end: str = "") -> str:
    return ("".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)) + end).capitalize()


def _unique(rng: random.Random, n: int, make, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        w = make(rng)
        if w.lower() not in taken:
            taken.add(w.lower())
            out.append(w)
    return out


def build(seed: int = 7) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    taken: set[str] = set()
    countries = _unique(rng, N_COUNTRIES, lambda r: _word(r, 2, r.choice(_ENDS)), taken)
    capitals = _unique(rng, N_COUNTRIES, lambda r: _word(r, 2), taken)
    rivers = _unique(rng, N_COUNTRIES, lambda r: _word(r, 1, "n"), taken)
    founders = _unique(rng, N_COUNTRIES, lambda r: f"{_word(r, 2)} {_word(r, 2)}", taken)
    years = rng.sample(range(800, 1900), N_COUNTRIES)
    docs: list[dict] = []
    questions: list[dict] = []
    for i, c in enumerate(countries):
        near, far = countries[(i + 1) % N_COUNTRIES], countries[(i + 37) % N_COUNTRIES]
        animal, region = rng.choice(_ANIMALS), rng.choice(_REGIONS)
        geo, hist = f"d{2 * i:03d}", f"d{2 * i + 1:03d}"
        docs.append(
            {
                "id": geo,
                "title": f"Geography of {c}",
                "text": f"{c} lies in the {region} lowlands. The capital of {c} is {capitals[i]}. "
                f"The {rivers[i]} River flows through {c} to the sea. To the east, {c} borders {near}.",
            }
        )
        docs.append(
            {
                "id": hist,
                "title": f"History of {c}",
                "text": f"{c} was founded in {years[i]} by {founders[i]}. The national animal of {c} is the "
                f"{animal}. Merchants of {c} traded salt with {far}.",
            }
        )
        kind = i % 5
        q, a, aliases, gold = {
            0: (f"What is the capital of {c}?", capitals[i], [], geo),
            1: (f"Which river flows through {c}?", rivers[i], [f"{rivers[i]} River"], geo),
            2: (f"In which year was {c} founded?", str(years[i]), [], hist),
            3: (f"Who founded {c}?", founders[i], [], hist),
            4: (f"What is the national animal of {c}?", animal, [], hist),
        }[kind]
        questions.append({"id": f"q{i:03d}", "question": q, "answer": a, "aliases": aliases, "doc_id": gold})
    return docs, questions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent.parent / "src/streamrl/envs/data"))
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    docs, questions = build()
    for name, rows in (("search_corpus.jsonl", docs), ("search_questions.jsonl", questions)):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} rows to {out / name}")


if __name__ == "__main__":
    main()
