"""What the train job does with each step's record: write the metrics stream (JSONL, TensorBoard,
optionally W&B), print each kind of failure's first message and diagnostics warnings once, and
refresh report.html every N steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from streamrl.config import Config, to_dict
from streamrl.observe.diagnostics import DiagnosticsMonitor
from streamrl.observe.error_examples import ErrorExamples
from streamrl.observe.metrics import MetricsWriter, Sink
from streamrl.observe.report import write_report
from streamrl.observe.run_data import read_metrics


class RunObserver:
    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        console: Console,
        purge_step: int | None = None,
    ) -> None:
        """purge_step: a resumed run's first step."""
        self.cfg, self.run_dir, self.console = cfg, run_dir, console
        sinks: list[Sink] = []
        if cfg.observe.wandb:
            from streamrl.observe.wandb_sink import WandbSink

            o = cfg.observe
            sinks.append(WandbSink(run_dir, o.wandb_project, o.wandb_mode, to_dict(cfg)))
        self.writer = MetricsWriter(run_dir, sinks=sinks, purge_step=purge_step)
        # a resumed run's rules see its earlier steps (metrics.jsonl, reconciled to the saved state)
        log = run_dir / "metrics.jsonl"
        earlier = read_metrics(log) if purge_step is not None and log.is_file() else []
        self.monitor = DiagnosticsMonitor(
            emit=lambda line: console.print(f"[yellow]{escape(line)}[/]"), history=earlier
        )
        self.errors = ErrorExamples(history=earlier)
        self._report_failed = False

    def on_step(self, record: dict[str, Any]) -> None:
        self.writer.write(record)
        for line in self.errors.update(record):  # each kind of failure's first message, once
            self.console.print(f"[yellow]{escape(line)}[/]")
        self.monitor.update(record)
        every = self.cfg.observe.report_every
        if every and record["step"] % every == 0:
            self.report()

    def report(self) -> Path | None:
        """Rewrite report.html; a failure is reported once and never stops training (it is a view)."""
        try:
            return write_report([self.run_dir], findings=self.monitor.findings())
        except Exception as e:  # a broken report must not kill a long run
            if not self._report_failed:
                self.console.print(f"[yellow]warning: could not write report.html: {escape(str(e))}[/]")
            self._report_failed = True
            return None

    def sync(self) -> None:
        self.writer.sync()

    def close(self) -> None:
        self.writer.close()
