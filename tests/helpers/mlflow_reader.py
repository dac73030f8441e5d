"""`python -m mlflow_reader OUT.json [TRACKING_URI]`: everything an MLflow store holds, read with
MLflow's own client as a user would, and written as JSON for a test to check. The tests start it in
a process of its own with no MLFLOW_ variable set (tests/cli/test_loggers.py: `reader_env`), so
nothing bsexp sets for itself helps it; with no TRACKING_URI, MlflowClient() finds the store by
MLflow's own default (./mlflow.db in the working directory)."""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient


def _artifacts(client: MlflowClient, run_id: str, where: str | None = None) -> list[str]:
    found = []
    for item in client.list_artifacts(run_id, where):
        found += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return found


def _content(path: Path) -> str:
    """A text artifact as its text, any other as its SHA-256."""
    if path.suffix in (".json", ".yaml"):
        return path.read_text()
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _run(client: MlflowClient, run, scratch: Path) -> dict:
    run_id = run.info.run_id
    history = {
        key: [
            [m.step, m.value]
            for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.timestamp, m.step))
        ]
        for key in run.data.metrics
    }
    artifacts = {}
    for path in _artifacts(client, run_id):
        artifacts[path] = _content(Path(client.download_artifacts(run_id, path, str(scratch))))
    return {
        "run_id": run_id,
        "name": run.info.run_name,
        "status": run.info.status,
        "tags": dict(run.data.tags),
        "params": dict(run.data.params),
        "metrics": dict(run.data.metrics),
        "history": history,
        "artifacts": artifacts,
    }


def main(out: str, uri: str | None = None) -> None:
    client = MlflowClient(tracking_uri=uri)
    store = {"tracking_uri": uri or mlflow.get_tracking_uri(), "experiments": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for experiment in client.search_experiments():
            runs = client.search_runs([experiment.experiment_id])
            store["experiments"][experiment.name] = [_run(client, run, Path(scratch) / run.info.run_id) for run in runs]
    Path(out).write_text(json.dumps(store))


if __name__ == "__main__":
    main(*sys.argv[1:])
