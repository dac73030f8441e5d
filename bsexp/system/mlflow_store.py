"""MLflow's store for a run: where it lives (MLflow's SQLite store, which its UI and client read
without options), how processes share one, and how to open it. No MLflow import here: bsexp.system.metrics'
MlflowSink writes the store through MLflow's own client."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import os
import shlex
from pathlib import Path
from urllib.parse import urlparse

DATABASE, ARTIFACTS = "mlflow.db", "mlartifacts"  # the SQLite file, and its runs' artifacts beside it


def store_dir(run_dir: Path) -> Path:
    """Where a run's default MLflow store lives: a sweep's directory (its points in one store, the
    UI compares them) for a point of one, else the run's own directory."""
    run_dir = Path(run_dir).resolve()
    return run_dir.parent if (run_dir.parent / "multirun.yaml").is_file() else run_dir


def sqlite_file(uri: str) -> Path | None:
    """The database file of a sqlite:/// URI (SQLAlchemy's: three slashes, then the path)."""
    path = uri[len("sqlite:///") :].split("?")[0] if uri.startswith("sqlite:///") else ""
    return Path(path).resolve() if path and path != ":memory:" else None


@contextlib.contextmanager
def one_at_a_time(directory: Path):
    """An exclusive lock on a directory: MLflow creates a new SQLite store's tables on first use
    (its migrations take seconds), so processes starting together (a sweep's points side by side)
    take turns, the first creating them and the others finding them."""
    directory.mkdir(parents=True, exist_ok=True)
    handle = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # and with it the lock


def open_line(uri: str, experiment_id: str, run_id: str) -> str:
    """How to see a run in MLflow's UI: the server's page, or the `mlflow ui` command for a local
    store (with `pip install mlflow` first where only mlflow-skinny, which has no UI, is installed)."""
    if urlparse(uri).scheme in ("http", "https"):
        return f"see it at {uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    command = f"mlflow ui --backend-store-uri {shlex.quote(uri)}"
    try:
        importlib.metadata.distribution("mlflow")  # the UI's package; mlflow-skinny is the client alone
    except importlib.metadata.PackageNotFoundError:
        command = f"pip install mlflow, then {command}"
    return f"see it with `{command}`"
