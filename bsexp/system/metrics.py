"""Where metrics go: one interface, a local JSONL file always, and any of W&B, TensorBoard and
MLflow when enabled (each through its library's own writer), or nothing.

A sink receives records (one per evaluation, each with `epoch`, `step` and `samples_seen`),
the final summary, and `close` with the run's status. Every sink plots against `samples_seen`,
so runs of different batch sizes line up. Rank checks belong to whoever builds the sinks, not to
the training loop.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from bsexp.errors import ConfigError, one_line
from bsexp.system import mlflow_store
from bsexp.system.io import DiskFull, atomic_write_text, no_room

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


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def summary_figures(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's figures, flat: its values and one level of nesting as "finder/micro_size"
    (provenance, and lists below the top level, left to summary.json)."""
    flat = {k: v for k, v in summary.items() if not isinstance(v, dict)}
    for key, value in summary.items():
        if isinstance(value, dict) and key != "provenance":
            flat.update({f"{key}/{k}": v for k, v in value.items() if not isinstance(v, (dict, list))})
    return flat


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as {"batch.size": 128, ...}: the keys a user types on the command line."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _text(value: Any) -> str:
    """A config value as the command line and the YAML write it: 128, true, null, [1, 2]."""
    return value if isinstance(value, str) else json.dumps(value)


# The packages of the optional loggers: logger option -> (module, what to install).
PACKAGES = {
    "tensorboard": ("tensorboard", "pip install 'bsexp[tensorboard]' (or tensorboard)"),
    "mlflow": ("mlflow", "pip install 'bsexp[mlflow]' (or mlflow)"),
}


def check_packages(logger_cfg) -> None:
    """A logger chosen without its package installed is a config error, one line."""
    import importlib.util

    for name, (module, install) in PACKAGES.items():
        if logger_cfg[name].enabled and importlib.util.find_spec(module) is None:
            raise ConfigError("logger", name, f"needs the {module} package, which is not installed: {install}")


def _line(record: dict[str, Any]) -> str:
    return json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n"


def _whole(line: str) -> bool:
    """Whether a line of a JSONL file holds a whole record (a cut-short one parses as no object)."""
    try:
        return line.endswith("\n") and isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


class JsonlSink:
    """`metrics.jsonl`: one JSON object per record, flushed as it is written, and made durable
    with each checkpoint (`durable`)."""

    def __init__(self, path: Path, records: list[dict[str, Any]] | None = None) -> None:
        """A new file; or, resuming, the `records` its checkpoint holds, and nothing after them,
        so none is missing or doubled: the file's own lines where they are whole, the checkpoint's
        where the file lacks them or holds them cut short (a power loss before the file reached
        the disk)."""
        self.path, self.lost = path, False
        if records is None:  # never appends to, or overwrites, an earlier run's records; an empty file holds none
            self.file = open(path, "w" if path.exists() and not path.stat().st_size else "x", encoding="utf-8")
            return
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True) if path.exists() else []
        kept = [line if n < len(lines) and _whole(line := lines[n]) else _line(r) for n, r in enumerate(records)]
        if written_back := sum(a != b for a, b in zip(kept, lines)) + max(0, len(records) - len(lines)):
            log.warning(
                "%s lacked or held cut short %d of the %d records its checkpoint holds: written back from it",
                path,
                written_back,
                len(records),
            )
        atomic_write_text(path, "".join(kept))
        self.file = open(path, "a", encoding="utf-8")

    def log(self, record: dict[str, Any]) -> None:
        line = _line(record)
        try:
            self.file.write(line)
            self.file.flush()
        except OSError as exc:
            self.lost = True
            if no_room(exc) is not None:
                raise DiskFull(self.path, len(line.encode()), exc.errno) from None
            raise

    def durable(self) -> None:
        """On disk, as a checkpoint is: what it holds of the records, the file holds too."""
        os.fsync(self.file.fileno())

    def table(self, name: str, rows: list[dict[str, Any]]) -> None:
        pass  # tables have files of their own (finder.json)

    def summary(self, summary: dict[str, Any]) -> None:
        pass  # summary.json is written by the trainer, whatever the sinks

    def close(self, status: str) -> None:
        try:
            self.file.close()
        except OSError:
            if not self.lost:  # a record that could not be written was said when it was logged
                raise

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
        self.run.summary.update(summary_figures(summary))

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


class TensorBoardSink:
    """TensorBoard's own writer (torch.utils.tensorboard): every number of a record as a scalar at
    step `samples_seen`; the resolved config as text; at the end the summary's figures as scalars
    `summary/<name>` and the HParams dashboard's session (the flat config against those figures),
    so `tensorboard --logdir <sweep dir>` compares a sweep's points by batch size."""

    def __init__(self, log_dir: Path, config: dict[str, Any], purge_step: int | None = None) -> None:
        """A new log; or, resuming, the same directory, with what was logged at or past
        `purge_step` (samples) hidden: TensorBoard's own purge, so no point is shown twice."""
        from torch.utils.tensorboard import SummaryWriter

        # Each writer marks its start (a SessionLog START at the purge step): TensorBoard takes a
        # log's first START for its beginning and every later one for a restart, and drops what the
        # log holds at or past that restart's step.
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step or 0)
        self.config = flat_config(config)
        self.samples_seen = purge_step or 0
        if not purge_step:  # a resumed log holds the config already
            text = "\n".join(f"    {key}: {_text(value)}" for key, value in self.config.items())
            self.writer.add_text("config", text, global_step=0)
            self.writer.flush()

    def log(self, record: dict[str, Any]) -> None:
        self.samples_seen = int(record["samples_seen"])
        for key, value in record.items():
            if key != "samples_seen" and _number(value):
                self.writer.add_scalar(key, value, global_step=self.samples_seen)
        self.writer.flush()  # a record per evaluation: on disk before a crash can lose it

    def table(self, name: str, rows: list[dict[str, Any]]) -> None:
        columns = list(rows[0]) if rows else []
        lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
        lines += ["| " + " | ".join(_text(row[c]) for c in columns) + " |" for row in rows]
        self.writer.add_text(name, "\n".join(lines), global_step=self.samples_seen)

    def image(self, name: str, path: Path) -> None:
        import numpy as np
        from PIL import Image

        with Image.open(path) as picture:
            pixels = np.asarray(picture.convert("RGB"))
        # Under figures/: a figure may share its name with a record's scalar (adaptive/batch).
        self.writer.add_image(f"figures/{name}", pixels, global_step=self.samples_seen, dataformats="HWC")

    def summary(self, summary: dict[str, Any]) -> None:
        from tensorboard.plugins.hparams.api_pb2 import Status
        from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
        from torch.utils.tensorboard.summary import hparams

        step = int(summary.get("samples_seen") or self.samples_seen)
        figures = summary_figures(summary)
        numbers = {f"summary/{k}": v for k, v in figures.items() if _number(v)}
        for key, value in numbers.items():
            self.writer.add_scalar(key, value, global_step=step)
        text = "\n".join(f"    {key}: {_text(value)}" for key, value in figures.items())
        self.writer.add_text("summary", text, global_step=step)
        # The HParams plugin takes numbers, strings and bools: lists as their text.
        params = {k: v if v is None or isinstance(v, (int, float, str)) else _text(v) for k, v in self.config.items()}
        experiment, start, end = hparams(params, numbers)
        status = {"completed": "STATUS_SUCCESS", "preempted": "STATUS_ABORTED"}.get(summary.get("status"))
        content = HParamsPluginData.FromString(end.value[0].metadata.plugin_data.content)
        content.session_end_info.status = Status.Value(status or "STATUS_FAILURE")
        end.value[0].metadata.plugin_data.content = content.SerializeToString()
        for part in (experiment, start, end):  # as SummaryWriter.add_hparams writes them, in this run
            self.writer.file_writer.add_summary(part, step)
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.close()
        log_dir = self.writer.log_dir
        log.info("TensorBoard log: %s (see it with `tensorboard --logdir %s`)", log_dir, log_dir)

    def wandb_id(self) -> str | None:
        return None


def _same(held: float | None, value: float) -> bool:
    return held is not None and (held == value or (math.isnan(held) and math.isnan(value)))


# bsexp's run status -> MLflow's.
_MLFLOW_STATUS = {"completed": "FINISHED", "preempted": "KILLED"}


def mlflow_tracking_uri(mlflow_cfg, run_dir: Path) -> str:
    """logger.mlflow.tracking_uri; else $MLFLOW_TRACKING_URI; else MLflow's SQLite store,
    `mlflow.db` in `mlflow_store.store_dir` (what `mlflow ui` and MlflowClient read without options)."""
    if mlflow_cfg.tracking_uri:
        return str(mlflow_cfg.tracking_uri)
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{mlflow_store.store_dir(run_dir) / mlflow_store.DATABASE}"


class MlflowSink:
    """MLflow's own client (MlflowClient): the flat resolved config as params (and config.yaml as
    an artifact), every number of a record as a metric at step `samples_seen`, the summary's
    figures as metrics `summary/<name>` (its words as tags, all of it as summary.json), figures
    and tables as artifacts; the run ends FINISHED, KILLED (preempted) or FAILED."""

    RUN_DIR_TAG = "bsexp.run_dir"

    def __init__(self, mlflow_cfg, run_dir: Path, config: dict[str, Any], resuming: bool = False) -> None:
        """A new MLflow run; or, resuming, the run logged from this run directory continued: a
        point it already holds with the same value (a record logged again after the checkpoint,
        the resume being exact) is not logged twice; one that differs (a timing) is logged anew."""
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = mlflow_tracking_uri(mlflow_cfg, run_dir)
        if urlparse(uri).scheme in ("", "file"):  # MLflow 3 keeps its file store behind this opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.uri, database = uri, mlflow_store.sqlite_file(uri)
        with mlflow_store.one_at_a_time(database.parent) if database else contextlib.nullcontext():
            self.client = MlflowClient(tracking_uri=uri)
            # A SQLite store's artifacts beside it, not in MLflow's default ./mlruns of the working directory.
            artifacts = (database.parent / mlflow_store.ARTIFACTS).as_uri() if database else None
            self.experiment_id = experiment_id = self._experiment(str(mlflow_cfg.experiment), artifacts)
        run_dir = Path(run_dir).resolve()
        self.logged: dict[tuple[str, int], float] = {}  # (key, step) -> the value MLflow holds
        found = self._run_of(experiment_id, run_dir) if resuming else None
        if found is not None:
            self.run_id = found.info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            for key in found.data.metrics:
                self.logged.update({(key, m.step): m.value for m in self.client.get_metric_history(self.run_id, key)})
            return
        name = mlflow_cfg.run_name or run_dir.name
        run = self.client.create_run(experiment_id, run_name=name, tags={self.RUN_DIR_TAG: str(run_dir)})
        self.run_id = run.info.run_id
        params = [Param(key, _text(value)) for key, value in flat_config(config).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params a request
            self.client.log_batch(self.run_id, params=params[start : start + 100])
        self.client.log_dict(self.run_id, config, "config.yaml")

    def _experiment(self, name: str, artifacts: str | None) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=artifacts)
        except MlflowException:  # another point of a sweep created it meanwhile
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _run_of(self, experiment_id: str, run_dir: Path):
        quote = '"' if "'" in str(run_dir) else "'"
        runs = self.client.search_runs(
            [experiment_id],
            f"tags.`{self.RUN_DIR_TAG}` = {quote}{run_dir}{quote}",
            max_results=1,
            order_by=["attributes.start_time DESC"],
        )
        return runs[0] if runs else None

    def _metrics(self, values: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(key, float(value), now, step)
            for key, value in values.items()
            if _number(value) and not _same(self.logged.get((key, step)), float(value))
        ]
        for start in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics a request
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])
        self.logged.update({(m.key, step): m.value for m in metrics})

    def log(self, record: dict[str, Any]) -> None:
        self._metrics({k: v for k, v in record.items() if k != "samples_seen"}, int(record["samples_seen"]))

    def table(self, name: str, rows: list[dict[str, Any]]) -> None:
        self.client.log_dict(self.run_id, rows, f"{name}.json")

    def image(self, name: str, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path="figures")

    def summary(self, summary: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        figures = {k: v for k, v in summary_figures(summary).items() if v is not None}
        self._metrics({f"summary/{k}": v for k, v in figures.items()}, int(summary.get("samples_seen") or 0))
        words = [RunTag(f"summary/{k}", _text(v)[:5000]) for k, v in figures.items() if not _number(v)]
        for start in range(0, len(words), 100):  # at most 100 tags a request
            self.client.log_batch(self.run_id, tags=words[start : start + 100])
        self.client.log_dict(self.run_id, summary, "summary.json")

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=_MLFLOW_STATUS.get(status, "FAILED"))
        log.info(
            "MLflow run %s in %s (%s)",
            self.run_id,
            self.uri,
            mlflow_store.open_line(self.uri, self.experiment_id, self.run_id),
        )

    def wandb_id(self) -> str | None:
        return None


class Sinks:
    """Fans every call out to several sinks. A logger's sink (W&B, TensorBoard, MLflow) that fails
    is dropped with one warning and the run goes on with its local logs; a local file that fails
    is an error."""

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
        """A figure, to the sinks that show images (W&B, TensorBoard, MLflow)."""
        for sink in self.sinks:
            if hasattr(sink, "image"):
                self._each_one(sink, "image", name, path)

    def summary(self, summary: dict[str, Any]) -> None:
        self._each("summary", summary)

    def close(self, status: str) -> None:
        self._each("close", status)

    def durable(self) -> None:
        """The local records on disk (with a checkpoint): the loggers keep their own."""
        for sink in self.sinks:
            if isinstance(sink, JsonlSink):
                sink.durable()

    def wandb_id(self) -> str | None:
        return next((sink.wandb_id() for sink in self.sinks if sink.wandb_id()), None)
