"""Optional Weights & Biases sink for the metrics stream (observe.wandb=true).

Offline mode by default: wandb writes RUN_DIR/wandb/ without any network; `wandb sync` uploads later.
The W&B run id is kept in RUN_DIR/wandb_run_id, so a resumed run logs on into the same W&B run;
except after a crash that left steps logged past the saved state: W&B ignores a step below the last
one a run logged, so the steps trained again would be lost there, and the run goes on in a new W&B run
(its config's `resumed_from` names the old one). The resume decides that on disk when it sets the
lines past the state aside (`rewind_wandb_run`), so a resume that fails before logging leaves the
next one to log into the new run too.
wandb is an optional extra (`pip install 'streamrl[wandb]'`); config validation rejects
observe.wandb=true without it, so the import here only fails if it vanished since.
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

from streamrl.files import file_digest, write_text_atomic

RUN_ID_FILE = "wandb_run_id"  # in the run directory
SWITCH_FILE = "wandb_switch.json"  # {"from": old id, "id": new id, "step": the saved step resumed from,
# "log": metrics.jsonl's digest before its lines past the step were set aside}
METRICS_LOG = "metrics.jsonl"  # what the W&B run logged, a line per step (observe/metrics.py)


def rewind_wandb_run(run_dir: Path, step: int) -> None:
    """A resume went back to `step` below steps the run's W&B run logged: from now on the run logs
    into a new W&B run. The switch is written before the new id, so a kill between the two writes
    still ends in the new run (WandbSink completes it); and before the metrics log is cut
    (loop/run_dir.py), so a kill before the cut calls this again on the same log: the switch written
    then stands (completed), and no other W&B run is started for the same rewind."""
    id_file = run_dir / RUN_ID_FILE
    if not id_file.is_file():  # no W&B run started: the next one starts fresh anyway
        return
    run_id, log = id_file.read_text().strip(), file_digest(run_dir / METRICS_LOG)
    switch_file = run_dir / SWITCH_FILE
    switch = json.loads(switch_file.read_text()) if switch_file.is_file() else {}
    done = (
        switch.get("step") == step and switch.get("log") == log and run_id in (switch["from"], switch["id"])
    )
    if not done:
        switch = {"from": run_id, "id": uuid.uuid4().hex[:16], "step": step, "log": log}
        write_text_atomic(switch_file, json.dumps(switch))
    write_text_atomic(id_file, switch["id"] + "\n")


class WandbSink:
    def __init__(self, run_dir: Path, project: str, mode: str, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError as e:
            raise RuntimeError(
                "observe.wandb=true needs the wandb package: pip install 'streamrl[wandb]'"
            ) from e
        id_file = run_dir / RUN_ID_FILE  # a resumed run logs on into the W&B run it started
        run_id = id_file.read_text().strip() if id_file.is_file() else ""
        name = run_dir.resolve().name
        switch_file = run_dir / SWITCH_FILE
        switch = json.loads(switch_file.read_text()) if switch_file.is_file() else {}
        new_id = ""
        if switch and run_id in (switch["from"], switch["id"]):  # the W&B run a rewind started
            config = {**config, "resumed_from": switch["from"]}
            name = f"{name}-from-step-{switch['step']}"
            if run_id != switch["id"]:  # the rewind was killed before it wrote the new id
                new_id = switch["id"]
        elif not run_id:
            new_id = uuid.uuid4().hex[:16]
        if new_id:  # written whole: a start killed mid-write leaves no id, never half of one
            run_id = new_id
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
