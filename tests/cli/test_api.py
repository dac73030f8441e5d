"""bsexp's Python API (bsexp.api), as a notebook calls it: a run started from overrides (the command
line itself, in a process of its own) with its summary and metrics; a configuration error as
RunFailed; a sweep started and read as a table of points; pandas only where it is installed. A
tuning read as a table: tests/cli/test_tune.py."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import subprocess
import sys

import pytest

from bsexp import api
from conftest import cli_env

TINY = [
    "data=synthetic",
    "data.shape=[1,16]",
    "data.num_samples=600",
    "data.val_size=88",
    "model=mlp",
    "model.hidden=[32]",
    "epochs=2",
    "logger=none",
    "trainer.progress=false",
]


def _environment(data_root, patch: pytest.MonkeyPatch) -> None:
    """The environment the tests' command lines get (tests/conftest.py), for the API's own."""
    for key, value in cli_env(data_root).items():
        patch.setenv(key, value)
    patch.delenv("HYDRA_FULL_ERROR", raising=False)


@pytest.fixture
def environment(data_root, monkeypatch):
    _environment(data_root, monkeypatch)


@pytest.fixture(scope="module")
def started(data_root, tmp_path_factory):
    """A run started from Python as a notebook starts one, told nothing of where to go; what it
    printed."""
    cwd = tmp_path_factory.mktemp("api")
    shown = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(shown):
        _environment(data_root, patch)
        run = api.train(*TINY, "batch.size=64", cwd=cwd)
    return run, cwd, shown.getvalue()


def test_a_run_started_from_python_is_the_command_lines_run(started):
    run, cwd, shown = started
    # Where the command line puts a run when told nothing: outputs/<date>/<time>-<pid> under cwd.
    assert run.dir.parent.parent == cwd / "outputs" and (run.dir / ".hydra" / "config.yaml").is_file()
    assert run.summary == json.loads((run.dir / "summary.json").read_text())
    assert run.summary["status"] == "completed" and run.summary["batch_size"] == 64
    assert run.config["batch"]["size"] == 64 and run.config["epochs"] == 2
    records = [json.loads(line) for line in (run.dir / "metrics.jsonl").read_text().splitlines()]
    assert run.metrics() == records and len(records) == 2 and records[-1]["val_acc"] == run.summary["val_acc"]
    assert f"  outputs             {run.dir}" in shown  # its output, shown as it came


def test_a_runs_metrics_without_pandas_and_as_a_dataframe(started, tmp_path):
    run = api.Run(str(started[0].dir))  # any run's directory, opened
    # Where pandas is not installed (an import of it fails): the records as they are, and a clear
    # error for a frame.
    script = (
        "import sys; sys.modules['pandas'] = None\n"
        "from bsexp import api\n"
        f"run = api.Run({str(run.dir)!r})\n"
        "assert len(run.metrics()) == 2\n"
        "try:\n    run.metrics(frame=True)\nexcept ImportError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=cli_env(tmp_path), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "frame=True needs pandas (pip install pandas); without it, the rows are dicts"
    pandas = pytest.importorskip("pandas")  # the dev extra has it (MLflow needs it)
    frame = run.metrics(frame=True)
    assert isinstance(frame, pandas.DataFrame) and frame.to_dict("records") == run.metrics()


def test_a_bad_override_is_run_failed_with_the_command_lines_line(environment, tmp_path):
    with pytest.raises(api.RunFailed) as failed:
        api.train(*TINY, "optimizer.lr=-1", cwd=tmp_path, quiet=True)
    assert failed.value.returncode == 2 and failed.value.dir is None
    assert failed.value.line.startswith("error: optimizer.lr=-1.0: must be") and not (tmp_path / "outputs").exists()
    with pytest.raises(ValueError, match="sweep()"):
        api.train("-m", "seed=0,1")


def test_a_sweep_started_from_python_and_read_as_a_table_of_points(environment, tmp_path):
    sweep = api.sweep(*TINY, "batch.size=32,64", cwd=tmp_path, quiet=True)
    assert sweep.parent.parent == tmp_path / "outputs" / "multirun" and (sweep / "jobs.jsonl").is_file()
    rows = api.points(sweep)
    assert [(row["point"][:2], row["batch.size"], row["status"]) for row in rows] == [
        ("0_", 32, "completed"),
        ("1_", 64, "completed"),
    ]
    for row in rows:  # the summary's figures, flat, as summary.json holds them
        summary = json.loads((sweep / row["point"] / "summary.json").read_text())
        assert row["val_acc"] == summary["val_acc"] and row["steps"] == summary["steps"]
        assert row["batch_size"] == row["batch.size"] and row["dir"] == str(sweep / row["point"])
        assert row["epochs"] == 2 and row["data"] == "synthetic" and row["error"] is None
    # A point removed after the sweep: still a row of the grid, missing, its batch from its overrides.
    (sweep / rows[1]["point"] / "summary.json").unlink()
    assert [(row["batch.size"], row["status"]) for row in api.points(sweep)] == [(32, "completed"), (64, "missing")]


INTERRUPTED = """
import os, signal, sys, threading, time
from pathlib import Path
from bsexp import api

run_dir, args = Path(sys.argv[1]), sys.argv[2:]

def stop_button():  # a notebook's stop button, once the run has evaluated
    while not ((run_dir / "metrics.jsonl").is_file() and (run_dir / "metrics.jsonl").read_text()):
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=stop_button, daemon=True).start()
try:
    api.train(*args, f"hydra.run.dir={run_dir}", quiet=True)
except KeyboardInterrupt as exc:
    print(exc)
"""


@pytest.mark.slow  # a run started, interrupted and continued: 20-70 s on 2 cores (scripts/test_slow.sh)
def test_an_interrupted_run_saves_a_checkpoint_and_continues(environment, tmp_path):
    """Interrupted in Python (SIGINT, as a notebook's stop button or Ctrl-C sends it), the run is
    told as Ctrl-C tells it: it checkpoints and stops, and the KeyboardInterrupt names the command
    that continues it, which api.train continues to the end."""
    # 800 steps, so that the run is still training when the stop button's signal comes
    run_dir, args = tmp_path / "run", [*TINY, "epochs=200", "checkpoint.every_steps=10000"]
    # As in a notebook or a terminal: Python's KeyboardInterrupt on SIGINT. pytest-xdist's workers
    # ignore SIGINT, and a Python child that starts with it ignored installs no handler for it: the
    # stop button's signal was dropped and the run went on to its end (CI, 2026-12-05).
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED, str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert done.returncode == 0, done.stderr
    told = done.stdout.strip()
    assert told.startswith("python -m bsexp.train stopped (exit code 130): ") and told.endswith(
        f"python -m bsexp.train resume=auto hydra.run.dir={run_dir}"
    ), told
    stopped = api.Run(run_dir).summary
    assert stopped["status"] == "preempted" and 0 < stopped["steps"] < 800
    assert list((run_dir / "checkpoints").glob("step-*.pt"))
    resumed = api.train("resume=auto", f"hydra.run.dir={run_dir}", cwd=tmp_path, quiet=True)
    assert resumed.summary["status"] == "completed" and resumed.summary["steps"] == 800
    assert resumed.summary["resumed_from"].endswith(f"step-{stopped['steps']:09d}.pt")
