"""Optional Weights & Biases sink for the metrics stream (observe.wandb=true).

Offline mode by default: wandb writes RUN_DIR/wandb/ without any network; `wandb sync` uploads later.
The W&B run id is kept in RUN_DIR/wandb_run_id, so a resumed run logs on into the same W&B run;
except after a crash that left steps logged past the saved state (`rewound_to`): W&B ignores a step
below the last one a run logged, so the steps trained again would be lost there, and the run goes on
in a new W&B run (its config's `resumed_from` names the old one).
wandb is an optional extra (`pip install 'streamrl[wandb]'`); config validation rejects
observe.wandb=true without it, so the import here only fails if it vanished since.
"""

from __future__ import annotations

import math
import uuid
from pathlib import Path
from typing import Any

from streamrl.files import write_text_atomic

RUN_ID_FILE = "wandb_run_id"  # in the run directory


class WandbSink:
    def __init__(
        self, run_dir: Path, project: str, mode: str, config: dict[str, Any], rewound_to: int | None = None
    ) -> None:
        try:
            import wandb
        except ImportError as e:
            raise RuntimeError(
                "observe.wandb=true needs the wandb package: pip install 'streamrl[wandb]'"
            ) from e
        id_file = run_dir / RUN_ID_FILE  # a resumed run logs on into the W&B run it started
        run_id = id_file.read_text().strip() if id_file.is_file() else ""
        name = run_dir.resolve().name
        if run_id and rewound_to is not None:  # the old run holds steps past rewound_to: a new one
            config = {**config, "resumed_from": run_id}
            name, run_id = f"{name}-from-step-{rewound_to}", ""
        if not run_id:  # written whole: a start killed mid-write leaves no id, never half of one
            run_id = uuid.uuid4().hex[:16]
            write_text_atomic(id_file, run_id + "\n")
        self._run = wandb.init(
            project=project, mode=mode, dir=str(run_dir), name=name, config=config, id=run_id, resume="allow"
        )

    def write(self, record: dict[str, Any]) -> None:
        """Log the numeric scalars of one step; the staleness histogram as flat staleness_hist/N keys."""
        data: dict[str, float] = {}
        for k, v in record.items():
            if k == "step" or k.startswith("_"):
                continue
            if isinstance(v, dict):
                data.update({f"{k}/{n}": x for n, x in v.items() if isinstance(x, (int, float))})
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                data[k] = v
        self._run.log(data, step=int(record["step"]))

    def close(self) -> None:
        self._run.finish()
