"""Where metrics go: one interface, a local JSONL file always, W&B when enabled, or nothing.

A sink receives records (one per evaluation, each with `epoch`, `step` and `samples_seen`),
the final summary, and `close` with the run's status. Rank checks belong to whoever builds the
sinks, not to the training loop.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Protocol

from bsexp.errors import one_line
from bsexp.io import atomic_write_text

log = logging.getLogger(__name__)


class MetricsSink(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...
    def table(self, name: str, rows: list[dict[str, Any]]) -> None: ...
    def summary(self, summary: dict[str, Any]) -> None: ...
    def close(self, status: str) -> None: ...


class NullSink:
    def log(self, record: dict[str, Any]) -> None:
        pass

    def table(self, name: str, rows: list[dict[str, Any]]) -> None:
        pass

    def summary(self, summary: dict[str, Any]) -> None:
        pass

    def close(self, status: str) -> None:
        pass

    def wandb_id(self) -> str | None:
        return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL file (metrics.jsonl, jobs.jsonl); a line cut short by a killed
    process is skipped."""
    if not Path(path).exists():
        return []
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them readable
    return value


class JsonlSink:
    """`metrics.jsonl`: one JSON object per record, flushed as it is written."""

    def __init__(self, path: Path, keep: int | None = None) -> None:
        """A new file; or, resuming (`keep` records were logged before the checkpoint), the first
        `keep` lines of the existing one continued, so no record is missing or doubled."""
        self.path = path
        if keep is None:  # never appends to, or overwrites, an earlier run's records; an empty file holds none
            self.file = open(path, "w" if path.exists() and not path.stat().st_size else "x", encoding="utf-8")
            return
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)[:keep] if path.exists() else []
        atomic_write_text(path, "".join(line if line.endswith("\n") else line + "\n" for line in lines))
        self.file = open(path, "a", encoding="utf-8")

    def log(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")
        self.file.flush()

    def table(self, name: str, rows: list[dict[str, Any]]) -> None:
        pass  # tables have files of their own (finder.json)

    def summary(self, summary: dict[str, Any]) -> None:
        pass  # summary.json is written by the trainer, whatever the sinks

    def close(self, status: str) -> None:
        self.file.close()

    def wandb_id(self) -> str | None:
        return None


class WandbSink:
    """The real wandb package: offline unless `logger.wandb.mode` or $WANDB_MODE says otherwise.
    Metrics are plotted against `samples_seen`, so runs with different batch sizes line up."""

    def __init__(self, wandb_cfg, run_dir: Path, config: dict[str, Any], run_id: str | None = None) -> None:
        """A new W&B run, or (resuming) the run `run_id` continued."""
        import wandb

        mode = str(wandb_cfg.mode) if wandb_cfg.mode is not None else os.environ.get("WANDB_MODE", "offline")
        self.run = wandb.init(
            project=wandb_cfg.project,
            entity=wandb_cfg.entity,
            group=wandb_cfg.group,
            name=wandb_cfg.name,
            tags=list(wandb_cfg.tags) or None,
            mode=mode,
            dir=str(wandb_cfg.dir or run_dir),
            config=config,
            settings=wandb.Settings(silent=True),
            id=run_id,
            resume="allow" if run_id else None,
        )
        self.run.define_metric("samples_seen")
        self.run.define_metric("*", step_metric="samples_seen")
        self.mode = mode

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(record)

    def table(self, name: str, rows: list[dict[str, Any]]) -> None:
        import wandb

        columns = list(rows[0]) if rows else []
        self.run.log({name: wandb.Table(columns=columns, data=[[row[c] for c in columns] for row in rows])})

    def summary(self, summary: dict[str, Any]) -> None:
        flat = {k: v for k, v in summary.items() if not isinstance(v, dict)}
        for key, value in summary.items():  # one level of nesting, as "finder/micro_size"
            if isinstance(value, dict) and key != "provenance":
                flat.update({f"{key}/{k}": v for k, v in value.items() if not isinstance(v, (dict, list))})
        self.run.summary.update(flat)

    def wandb_id(self) -> str | None:
        return self.run.id

    def image(self, name: str, path: Path) -> None:
        import wandb

        self.run.log({name: wandb.Image(str(path))})

    def close(self, status: str) -> None:
        sync_dir = getattr(self.run.settings, "sync_dir", None)
        self.run.finish(exit_code=0 if status == "completed" else 1)
        if self.mode == "offline" and sync_dir:
            log.info("W&B offline run: %s (upload with `wandb sync %s`)", sync_dir, sync_dir)


class Sinks:
    """Fans every call out to several sinks. A remote sink (W&B) that fails is dropped with one
    warning and the run goes on with its local logs; a local file that fails is an error."""

    def __init__(self, *sinks: MetricsSink) -> None:
        self.sinks = sinks

    def attach(self, other: Sinks) -> None:
        """Add another fan-out's sinks (the job's outputs, to a loop built before them)."""
        self.sinks = (*self.sinks, *other.sinks)

    def _each(self, method: str, *args: Any) -> None:
        for sink in self.sinks:
            self._each_one(sink, method, *args)

    def _each_one(self, sink: MetricsSink, method: str, *args: Any) -> None:
        try:
            getattr(sink, method)(*args)
        except Exception as exc:
            if isinstance(sink, JsonlSink):
                raise
            log.warning(
                "%s failed (%s); going on with the local logs (metrics.jsonl, summary.json) only",
                type(sink).__name__,
                one_line(exc)[:200],
            )
            self.sinks = tuple(s for s in self.sinks if s is not sink)

    def log(self, record: dict[str, Any]) -> None:
        self._each("log", record)

    def table(self, name: str, rows: list[dict[str, Any]]) -> None:
        self._each("table", name, rows)

    def image(self, name: str, path: Path) -> None:
        """A figure, to the sinks that show images (W&B)."""
        for sink in self.sinks:
            if hasattr(sink, "image"):
                self._each_one(sink, "image", name, path)

    def summary(self, summary: dict[str, Any]) -> None:
        self._each("summary", summary)

    def close(self, status: str) -> None:
        self._each("close", status)

    def wandb_id(self) -> str | None:
        return next((sink.wandb_id() for sink in self.sinks if sink.wandb_id()), None)
