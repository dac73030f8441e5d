"""logger=tensorboard, logger=mlflow and several loggers at once, through the CLI: what each wrote,
read back with TensorBoard's and MLflow's own readers, holds the records of metrics.jsonl at their
samples_seen, the resolved config and the summary; a resumed run continues the same TensorBoard
log and MLflow run, with no point twice."""

import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from logger_records import TensorBoardLog, mlflow_client, mlflow_history, mlflow_runs
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


def assert_mlflow_holds_the_run(tracking_uri: str, run_dir: Path, experiment: str = "bsexp") -> None:
    client = mlflow_client(tracking_uri)
    [run] = mlflow_runs(client, experiment)
    logged, final = records(run_dir), summary(run_dir)
    run_id = run.info.run_id
    assert run.info.status == "FINISHED" and run.data.tags["bsexp.run_dir"] == str(run_dir.resolve())
    for key in metric_keys(run_dir):
        assert mlflow_history(client, run_id, key) == [(r["samples_seen"], r[key]) for r in logged], key
    config = flat(yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text()))
    params = run.data.params
    assert config.keys() <= params.keys()
    assert params["batch.size"] == "64" and params["optimizer.lr"] == str(config["optimizer.lr"])
    assert params["data._target_"] == config["data._target_"] and params["schedule.milestones"] == "[]"
    assert params["trainer.max_steps"] == "null" and params["logger.mlflow.enabled"] == "true"
    assert float(params["derived.lr"]) == final["lr"] and float(params["derived.weight_decay"]) == final["weight_decay"]
    for key in ("val_acc", "best_val_acc", "test_acc", "gen_gap", "wall_time_s", "samples_per_s", "peak_memory_mb"):
        assert mlflow_history(client, run_id, f"summary/{key}") == [(final["samples_seen"], final[key])], key
    assert run.data.tags["summary/status"] == "completed" and run.data.tags["summary/data"] == final["data"]
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "summary.json"} <= artifacts
    fetched = str(run_dir / "fetched")
    assert json.loads(Path(client.download_artifacts(run_id, "summary.json", fetched)).read_text()) == final
    composed = yaml.safe_load(Path(client.download_artifacts(run_id, "config.yaml", fetched)).read_text())
    assert composed["batch"]["size"] == 64 and composed["derived"]["lr"] == final["lr"]


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("loggers")


def test_logger_tensorboard_writes_every_record_the_config_and_the_summary(data_root, out):
    run_dir = out / "tensorboard"
    train(data_root, out, "logger=tensorboard", f"hydra.run.dir={run_dir}")
    assert_tensorboard_holds_the_run(run_dir / "tensorboard", run_dir)
    assert not (run_dir / "wandb").exists() and not (run_dir / "mlruns").exists()


def test_logger_mlflow_writes_a_local_file_store_in_the_run(data_root, out):
    run_dir = out / "mlflow"
    train(data_root, out, "logger=mlflow", f"hydra.run.dir={run_dir}")
    assert_mlflow_holds_the_run((run_dir / "mlruns").as_uri(), run_dir)
    [run] = mlflow_runs(mlflow_client((run_dir / "mlruns").as_uri()))
    assert run.info.run_name == "mlflow"  # the run directory's name
    assert not (run_dir / "wandb").exists() and not (run_dir / "tensorboard").exists()


def test_three_loggers_at_once_each_where_the_config_says(data_root, out):
    """logger=[wandb,tensorboard,mlflow], the TensorBoard log and the MLflow store moved by config."""
    run_dir, tb_dir, store = out / "all", out / "tb-elsewhere", out / "shared-mlruns"
    train(
        data_root,
        out,
        "logger=[wandb,tensorboard,mlflow]",
        f"logger.tensorboard.dir={tb_dir}",
        f"logger.mlflow.tracking_uri={store.as_uri()}",
        "logger.mlflow.experiment=tiny",
        "logger.mlflow.run_name=three",
        f"hydra.run.dir={run_dir}",
    )
    assert_tensorboard_holds_the_run(tb_dir, run_dir)
    assert_mlflow_holds_the_run(store.as_uri(), run_dir, experiment="tiny")
    [run] = mlflow_runs(mlflow_client(store.as_uri()), "tiny")
    assert run.info.run_name == "three"
    [run_file] = run_dir.glob("wandb/offline-run-*/run-*.wandb")  # W&B as with logger=wandb alone
    rows = wandb_records.history(run_file)
    assert [row["samples_seen"] for row in rows] == [r["samples_seen"] for r in records(run_dir)]
    assert [row["val_acc"] for row in rows] == [r["val_acc"] for r in records(run_dir)]
    assert wandb_records.summary(run_file)["test_acc"] == pytest.approx(summary(run_dir)["test_acc"])
    assert not (run_dir / "tensorboard").exists() and not (run_dir / "mlruns").exists()


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
    assert_mlflow_holds_the_run_resumed(run_dir, wall_first)


def assert_mlflow_holds_the_run_resumed(run_dir: Path, wall_first: float) -> None:
    """One MLflow run, each record once; a figure measured again with another value (a time, a
    throughput) logged anew at the same step, and the latest shown."""
    client = mlflow_client((run_dir / "mlruns").as_uri())
    [run] = mlflow_runs(client)
    final, logged = summary(run_dir), records(run_dir)
    for key in metric_keys(run_dir):
        history = mlflow_history(client, run.info.run_id, key)
        latest = {step: value for step, value in history}
        assert latest == {r["samples_seen"]: r[key] for r in logged}, key
        if key != "samples_per_s":  # the same values, as the resume is exact: each once
            assert history == [(r["samples_seen"], r[key]) for r in logged], key
    wall = mlflow_history(client, run.info.run_id, "summary/wall_time_s")
    assert wall == [(final["samples_seen"], wall_first), (final["samples_seen"], final["wall_time_s"])]
    assert run.data.metrics["summary/wall_time_s"] == final["wall_time_s"] and not math.isclose(wall_first, wall[-1][1])
    assert run.data.tags["summary/resumed_from"] == final["resumed_from"] and run.info.status == "FINISHED"


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
    client = mlflow_client((adaptive / "mlruns").as_uri())
    [run] = mlflow_runs(client)
    assert Path(client.download_artifacts(run.info.run_id, "figures/batch.png", str(out / "got"))).read_bytes() == png

    finder = out / "finder"
    train(data_root, out, "batch=finder", both, f"hydra.run.dir={finder}")
    trials = json.loads((finder / "finder.json").read_text())["trials"]
    [(_, table)] = TensorBoardLog(finder / "tensorboard").texts("finder/trials")
    header, _, *rows = table.splitlines()
    assert header == "| " + " | ".join(trials[0]) + " |" and len(rows) == len(trials) >= 2
    assert [row.split(" | ")[0].lstrip("| ") for row in rows] == [str(t["size"]) for t in trials]
    client = mlflow_client((finder / "mlruns").as_uri())
    [run] = mlflow_runs(client)
    got = Path(client.download_artifacts(run.info.run_id, "finder/trials.json", str(out / "got")))
    assert json.loads(got.read_text()) == trials
    micro = json.loads((finder / "summary.json").read_text())["finder"]["micro_size"]
    assert run.data.metrics["summary/finder/micro_size"] == micro
