"""What periodic state saves cost a run: their share of its training time.

    python benchmarks/state_saves.py RUN_DIR [RUN_DIR ...]

Reads each run's summary.json (the train job times the loop with its periodic saves in it, and the
saves apart) and prints the saves' share of the loop's time and the seconds per save. Run it on the
default job's directory (`make demo` prints it) to see what train.save_every costs there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    print(
        f"{'run':40s} {'steps':>5} {'save_every':>10} {'saves':>5} {'train s':>8} {'saves s':>8} {'share':>7}"
    )
    for arg in argv:
        run = Path(arg)
        summary = json.loads((run / "summary.json").read_text())
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        every = cfg["train"]["save_every"]
        t = summary["timings"]
        steps = summary["steps"]
        saves = len([s for s in range(1, steps) if every and s % every == 0])  # the last step: final save
        share = t.get("periodic_saves", 0.0) / max(t["train"], 1e-9)
        print(
            f"{str(run)[-40:]:40s} {steps:>5} {every:>10} {saves:>5} {t['train']:>8.1f} "
            f"{t.get('periodic_saves', 0.0):>8.2f} {share:>7.2%}"
        )
        if saves:
            print(
                f"  {t['periodic_saves'] / saves:.2f} s per save; "
                f"the final save took {t.get('save', 0.0):.2f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
