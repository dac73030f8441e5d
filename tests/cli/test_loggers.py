"""logger=tensorboard, logger=mlflow and several loggers at once, through the CLI: what each wrote,
read back with TensorBoard's and MLflow's own readers, holds the records of metrics.jsonl at their
samples_seen, the resolved config and the summary; a resumed run continues the same TensorBoard
log and MLflow run, with no point twice. MLflow's store is read as a user reads it: by MLflow's
client in a process of its own with no MLFLOW_ variable (tests/helpers/mlflow_reader.py), and by
MLflow's UI server."""

import hashlib
import io
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from logger_records import TensorBoardLog
from PIL import Image
from tensorboard.util import tensor_util

import wandb_records
from conftest import cli_env

# 380 training samples at 64 a step: 6 steps an epoch, an evaluation every 2 (3 records an epoch).
TINY = [
    "data.num_samples=600",
    "data.val_size=100",
    "epochs=1",
    "model.width=8",
    "batch.size=64",
    "trainer.eval_every_steps=2",
    "trainer.progress=false",
]


def train(data_root, cwd, *args):
    out = subprocess.run(
        [sys.executable, "-m", "bsexp.train", *TINY, *args],
        cwd=cwd,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def flat(node, prefix=""):
    if isinstance(node, dict) and node:
        return {k: v for key, value in node.items() for k, v in flat(value, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): node}


def metric_keys(run_dir: Path) -> list[str]:
    """The numbers every record holds (samples_seen is the axis, not a metric)."""
    logged = records(run_dir)
    keys = [k for k, v in logged[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return [k for k in keys if k != "samples_seen"]


def assert_tensorboard_holds_the_run(log_dir: Path, run_dir: Path) -> None:
    tb = TensorBoardLog(log_dir)
    logged, final = records(run_dir), summary(run_dir)
    steps = [r["samples_seen"] for r in logged]
    assert len(logged) >= 3 and steps == sorted(set(steps))
    for key in metric_keys(run_dir):  # TensorBoard keeps float32
        assert tb.scalars(key) == [(r["samples_seen"], pytest.approx(r[key], rel=1e-6)) for r in logged], key
    config = flat(yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text()))
    [(step, text)] = tb.texts("config")
    lines = text.splitlines()
    assert step == 0 and f"    batch.size: {config['batch.size']}" in lines and "    data.num_samples: 600" in lines
    assert f"    derived.lr: {final['lr']}" in lines
    for key in ("val_acc", "test_acc", "gen_gap", "wall_time_s", "samples_per_s", "lr"):
        assert tb.scalars(f"summary/{key}") == [(final["samples_seen"], pytest.approx(final[key], rel=1e-6))], key
    [(_, words)] = tb.texts("summary")
    assert "    status: completed" in words.splitlines()
    hparams, metrics, status = tb.hparams()
    assert hparams["batch.size"] == config["batch.size"] and hparams["optimizer.lr"] == config["optimizer.lr"]
    assert hparams["derived.lr"] == pytest.approx(final["lr"]) and hparams["data._target_"] == config["data._target_"]
    assert {"summary/val_acc", "summary/test_acc", "summary/samples_per_s"} <= set(metrics)
    assert status == "STATUS_SUCCESS"


def reader_env(data_root) -> dict[str, str]:
    """The CLI's environment with no MLflow variable: none of what bsexp might set for itself."""
    return {k: v for k, v in cli_env(data_root).items() if not k.startswith("MLFLOW_")}


def read_mlflow(data_root, cwd: Path, uri: str | None = None) -> dict:
    """The store MLflow's client finds from `cwd` (its default, ./mlflow.db) or at `uri`, read in a
    process of its own (tests/helpers/mlflow_reader.py)."""
    out = cwd.parent / f"read-{cwd.name}.json"
    done = subprocess.run(
        [sys.executable, "-m", "mlflow_reader", str(out), *([uri] if uri else [])],
        cwd=cwd,
        env=reader_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def history(run: dict, key: str) -> list[tuple[int, float]]:
    """(step, value) of a metric, in the order logged."""
    return [tuple(point) for point in run["history"].get(key, [])]


def assert_mlflow_holds_the_run(store: dict, run_dir: Path, experiment: str = "bsexp") -> dict:
    [run] = store["experiments"][experiment]
    logged, final = records(run_dir), summary(run_dir)
    assert run["status"] == "FINISHED" and run["tags"]["bsexp.run_dir"] == str(run_dir.resolve())
    for key in metric_keys(run_dir):
        assert history(run, key) == [(r["samples_seen"], r[key]) for r in logged], key
    config = flat(yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text()))
    params = run["params"]
    assert config.keys() <= params.keys()
    assert params["batch.size"] == "64" and params["optimizer.lr"] == str(config["optimizer.lr"])
    assert params["data._target_"] == config["data._target_"] and params["schedule.milestones"] == "[]"
    assert params["trainer.max_steps"] == "null" and params["logger.mlflow.enabled"] == "true"
    assert float(params["derived.lr"]) == final["lr"] and float(params["derived.weight_decay"]) == final["weight_decay"]
    for key in ("val_acc", "best_val_acc", "test_acc", "gen_gap", "wall_time_s", "samples_per_s", "peak_memory_mb"):
        assert history(run, f"summary/{key}") == [(final["samples_seen"], final[key])], key
    assert run["tags"]["summary/status"] == "completed" and run["tags"]["summary/data"] == final["data"]
    assert json.loads(run["artifacts"]["summary.json"]) == final
    composed = yaml.safe_load(run["artifacts"]["config.yaml"])
    assert composed["batch"]["size"] == 64 and composed["derived"]["lr"] == final["lr"]
    return run


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("loggers")


def test_logger_tensorboard_writes_every_record_the_config_and_the_summary(data_root, out):
    run_dir = out / "tensorboard"
    train(data_root, out, "logger=tensorboard", f"hydra.run.dir={run_dir}")
    assert_tensorboard_holds_the_run(run_dir / "tensorboard", run_dir)
    assert not (run_dir / "wandb").exists() and not (run_dir / "mlruns").exists()


def test_logger_mlflow_writes_a_store_mlflows_client_reads_without_options(data_root, out):
    """The run's mlflow.db, read by MlflowClient() in the run directory as a user would: no tracking
    URI (MLflow's default store, ./mlflow.db), no MLFLOW_ variable; its artifacts beside it, none in
    the working directory; the run's log says how to open it in MLflow's UI."""
    run_dir = out / "mlflow"
    done = train(data_root, out, "logger=mlflow", f"hydra.run.dir={run_dir}")
    store = read_mlflow(data_root, run_dir)
    uri = f"sqlite:///{run_dir.resolve() / 'mlflow.db'}"
    assert store["tracking_uri"] == uri  # MLflow's default store, ./mlflow.db, found as it is
    run = assert_mlflow_holds_the_run(store, run_dir)
    assert run["name"] == "mlflow"  # the run directory's name
    assert (run_dir / "mlartifacts" / run["run_id"] / "artifacts" / "summary.json").is_file()
    assert f"(see it with `mlflow ui --backend-store-uri {uri}`)" in done.stdout
    assert not (run_dir / "wandb").exists() and not (run_dir / "tensorboard").exists()
    assert not (run_dir / "mlruns").exists() and not (out / "mlruns").exists() and not (out / "mlflow.db").exists()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str, body: dict | None = None) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read()


@pytest.mark.slow  # MLflow's UI server takes 10-60 s to start on 2 cores: scripts/test_slow.sh runs it
def test_the_command_a_mlflow_run_prints_opens_it_in_mlflows_ui(data_root, out):
    """The `mlflow ui ...` command the run printed, run as it reads (a port of its own added), with
    no MLFLOW_ variable: its server lists the run, its metrics and its artifacts, and serves the UI."""
    run_dir = out / "ui"
    done = train(data_root, out, "logger=mlflow", f"hydra.run.dir={run_dir}")
    command = done.stdout.split("(see it with `", 1)[1].split("`)", 1)[0]
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", *shlex.split(command)[1:], "--host", "127.0.0.1", "--port", str(port)],
        cwd=out,
        env=reader_env(data_root),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its workers in its own group, ended with it
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                get(f"{base}/health")
                break
            except OSError:
                assert server.poll() is None, f"mlflow ui ended with {server.returncode}"
                time.sleep(1)
        assert b"<title>MLflow</title>" in get(f"{base}/")
        found = json.loads(get(f"{base}/ajax-api/2.0/mlflow/experiments/get-by-name?experiment_name=bsexp"))
        [run] = json.loads(
            get(f"{base}/ajax-api/2.0/mlflow/runs/search", {"experiment_ids": [found["experiment"]["experiment_id"]]})
        )["runs"]
        run_id = run["info"]["run_id"]
        assert run["info"]["status"] == "FINISHED" and run["info"]["run_name"] == "ui"
        shown = json.loads(get(f"{base}/ajax-api/2.0/mlflow/metrics/get-history?run_uuid={run_id}&metric_key=val_acc"))
        assert [(m["step"], m["value"]) for m in shown["metrics"]] == [
            (r["samples_seen"], r["val_acc"]) for r in records(run_dir)
        ]
        assert json.loads(get(f"{base}/get-artifact?path=summary.json&run_uuid={run_id}")) == summary(run_dir)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


@pytest.mark.slow  # 17-32 s on 2 cores: scripts/test_slow.sh (the default tiers' time)
def test_three_loggers_at_once_each_where_the_config_says(data_root, out):
    """logger=[wandb,tensorboard,mlflow], the TensorBoard log and the MLflow store moved by config."""
    run_dir, tb_dir, store = out / "all", out / "tb-elsewhere", out / "shared" / "mlflow.db"
    train(
        data_root,
        out,
        "logger=[wandb,tensorboard,mlflow]",
        f"logger.tensorboard.dir={tb_dir}",
        f"logger.mlflow.tracking_uri=sqlite:///{store}",
        "logger.mlflow.experiment=tiny",
        "logger.mlflow.run_name=three",
        f"hydra.run.dir={run_dir}",
    )
    assert_tensorboard_holds_the_run(tb_dir, run_dir)
    run = assert_mlflow_holds_the_run(read_mlflow(data_root, out, f"sqlite:///{store}"), run_dir, experiment="tiny")
    assert run["name"] == "three" and (store.parent / "mlartifacts" / run["run_id"]).is_dir()
    [run_file] = run_dir.glob("wandb/offline-run-*/run-*.wandb")  # W&B as with logger=wandb alone
    rows = wandb_records.history(run_file)
    assert [row["samples_seen"] for row in rows] == [r["samples_seen"] for r in records(run_dir)]
    assert [row["val_acc"] for row in rows] == [r["val_acc"] for r in records(run_dir)]
    assert wandb_records.summary(run_file)["test_acc"] == pytest.approx(summary(run_dir)["test_acc"])
    assert not (run_dir / "tensorboard").exists() and not (run_dir / "mlflow.db").exists()


@pytest.mark.slow  # 20-90 s on 2 cores (a joblib sweep): scripts/test_slow.sh runs it
def test_a_sweeps_points_side_by_side_share_one_mlflow_store(data_root, out):
    """Two points started together (joblib) on a store that does not exist yet: MLflow creates its
    tables once (the points take turns), and <sweep dir>/mlflow.db holds both runs, each named by its
    point, so that MLflow's UI compares them."""
    sweep = out / "sweep"
    done = subprocess.run(
        [sys.executable, "-m", "bsexp.train", "-m", *TINY, "logger=mlflow", "seed=0,1", "hydra/launcher=joblib"]
        + ["hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}"],
        cwd=out,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = {run["name"]: run for run in read_mlflow(data_root, sweep)["experiments"]["bsexp"]}
    points = sorted(point.name for point in sweep.iterdir() if (point / ".hydra").is_dir())
    assert sorted(runs) == points and len(points) == 2
    for name, run in runs.items():
        point = sweep / name
        assert run["status"] == "FINISHED" and run["tags"]["bsexp.run_dir"] == str(point.resolve())
        assert history(run, "val_acc") == [(r["samples_seen"], r["val_acc"]) for r in records(point)]
        assert "could not start" not in (point / "train.log").read_text()
        assert not (point / "mlflow.db").exists()


@pytest.mark.slow  # 17-32 s on 2 cores: scripts/test_slow.sh (the default tiers' time)
def test_a_resumed_run_continues_its_tensorboard_log_and_mlflow_run_without_doubles(data_root, out):
    """Resumed from a checkpoint before its end, the run logs its later records again: TensorBoard
    shows each once (its own purge), MLflow holds each once (the same values are not logged twice)."""
    run_dir = out / "resumed"
    args = ["epochs=2", "checkpoint.every_steps=4", "checkpoint.keep=10", "logger=[tensorboard,mlflow]"]
    train(data_root, out, *args, f"hydra.run.dir={run_dir}")
    first = records(run_dir)
    wall_first = summary(run_dir)["wall_time_s"]
    train(data_root, out, *args, f"resume={run_dir / 'checkpoints' / 'step-000000004.pt'}")
    final = summary(run_dir)
    assert final["status"] == "completed" and final["resumed_from"].endswith("step-000000004.pt")
    logged = records(run_dir)
    assert len(logged) == len(first) == 6 and [r["val_loss"] for r in logged] == [r["val_loss"] for r in first]
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one writer each
    assert_tensorboard_holds_the_run(run_dir / "tensorboard", run_dir)
    assert_mlflow_holds_the_run_resumed(read_mlflow(data_root, run_dir), run_dir, wall_first)


def assert_mlflow_holds_the_run_resumed(store: dict, run_dir: Path, wall_first: float) -> None:
    """One MLflow run, each record once; a figure measured again with another value (a time, a
    throughput) logged anew at the same step, and the latest shown."""
    [run] = store["experiments"]["bsexp"]
    final, logged = summary(run_dir), records(run_dir)
    for key in metric_keys(run_dir):
        logged_to_mlflow = history(run, key)
        latest = {step: value for step, value in logged_to_mlflow}
        assert latest == {r["samples_seen"]: r[key] for r in logged}, key
        if key != "samples_per_s":  # the same values, as the resume is exact: each once
            assert logged_to_mlflow == [(r["samples_seen"], r[key]) for r in logged], key
    wall = history(run, "summary/wall_time_s")
    assert wall == [(final["samples_seen"], wall_first), (final["samples_seen"], final["wall_time_s"])]
    assert run["metrics"]["summary/wall_time_s"] == final["wall_time_s"] and not math.isclose(wall_first, wall[-1][1])
    assert run["tags"]["summary/resumed_from"] == final["resumed_from"] and run["status"] == "FINISHED"


@pytest.mark.slow  # 20-70 s on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_a_policys_figure_and_the_finders_table_reach_both(data_root, out):
    """batch=adaptive draws the batch over training (batch.png): an image in TensorBoard, an
    artifact in MLflow. batch=finder's trials: a table as TensorBoard text, an MLflow artifact."""
    both = "logger=[tensorboard,mlflow]"
    adaptive = out / "adaptive"
    train(data_root, out, "batch=adaptive", "batch.find_micro_size=false", both, f"hydra.run.dir={adaptive}")
    png = (adaptive / "batch.png").read_bytes()
    [image] = TensorBoardLog(adaptive / "tensorboard").events.Tensors("figures/adaptive/batch")
    width, height, encoded = tensor_util.make_ndarray(image.tensor_proto)
    with Image.open(adaptive / "batch.png") as drawn:
        assert (int(width), int(height)) == drawn.size
    with Image.open(io.BytesIO(encoded)) as shown:
        assert shown.size == drawn.size and image.step == summary(adaptive)["samples_seen"]
    [run] = read_mlflow(data_root, adaptive)["experiments"]["bsexp"]
    assert run["artifacts"]["figures/batch.png"] == "sha256:" + hashlib.sha256(png).hexdigest()

    finder = out / "finder"
    train(data_root, out, "batch=finder", both, f"hydra.run.dir={finder}")
    trials = json.loads((finder / "finder.json").read_text())["trials"]
    [(_, table)] = TensorBoardLog(finder / "tensorboard").texts("finder/trials")
    header, _, *rows = table.splitlines()
    assert header == "| " + " | ".join(trials[0]) + " |" and len(rows) == len(trials) >= 2
    assert [row.split(" | ")[0].lstrip("| ") for row in rows] == [str(t["size"]) for t in trials]
    [run] = read_mlflow(data_root, finder)["experiments"]["bsexp"]
    assert json.loads(run["artifacts"]["finder/trials.json"]) == trials
    micro = json.loads((finder / "summary.json").read_text())["finder"]["micro_size"]
    assert run["metrics"]["summary/finder/micro_size"] == micro
