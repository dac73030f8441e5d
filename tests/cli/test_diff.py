"""`python -m bsexp.diff RUN_A RUN_B` on real tiny runs: the config keys that differ, the summary
figures side by side, and one line (exit code 2) for a directory that is not a run."""

import json
import re
import shutil
import subprocess
import sys

import pytest

from conftest import TINY_RUN, cli_env


def train(data_root, cwd, *args):
    out = subprocess.run(
        [sys.executable, "-m", "bsexp.train", *args, *TINY_RUN],
        cwd=cwd,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]


def diff(data_root, *dirs):
    return subprocess.run(
        [sys.executable, "-m", "bsexp.diff", *map(str, dirs)],
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def runs(data_root, tmp_path_factory):
    """A sweep of two batch sizes (its points are run directories too) and a run of another seed."""
    tmp = tmp_path_factory.mktemp("diff")
    train(data_root, tmp, "-m", "batch.size=64,128", f"hydra.sweep.dir={tmp / 'sweep'}")
    train(data_root, tmp, "batch.size=64", "seed=1", f"hydra.run.dir={tmp / 'seed1'}")
    points = sorted(p.parent.parent for p in (tmp / "sweep").glob("*/.hydra/config.yaml"))
    return tmp / "sweep", points, tmp / "seed1"


def sections(stdout: str) -> tuple[list[str], dict[str, list[str]]]:
    """The config lines (from "config:" to the blank line) and the summary's rows by label."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("config:"))
    end = lines.index("", start)
    table = lines[lines.index("summary") + 2 :]  # after its header row
    rows = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", row.strip()) for row in table)}
    return lines[start:end], rows


def test_two_sweep_points_differ_in_their_batch_size(runs, data_root):
    _, (a, b), _ = runs
    out = diff(data_root, a, b)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"A  {a}\nB  {b}\n")
    config, rows = sections(out.stdout)
    assert config == ["config: 1 key differs", "  batch.size: 64 -> 128"]
    summary_a, summary_b = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    assert rows["status"] == ["completed", "completed"]
    assert rows["batch"] == ["64", "128", "x2"]
    assert rows["micro x accum x ranks"] == ["64 x 1 x 1", "128 x 1 x 1"]
    assert rows["lr"] == ["0.05", "0.1", "x2"]  # the linear rule from 0.1 at 128
    assert rows["steps"] == ["6", "3", "x0.5"]  # 380 training samples
    assert rows["val acc"][:2] == [f"{100 * summary_a['val_acc']:.2f} %", f"{100 * summary_b['val_acc']:.2f} %"]
    gap = 100 * (summary_b["test_acc"] - summary_a["test_acc"])
    assert rows["test acc"][2] == f"{gap:+.2f} pp"
    assert rows["peak memory (MB)"][:2] == [f"{s['peak_memory_mb']:,.0f}" for s in (summary_a, summary_b)]
    for label in ("weight decay", "train acc", "generalisation gap", "wall time (s)", "samples/s", "seed"):
        assert len(rows[label]) >= 2, label


def test_a_run_against_a_sweep_point_shows_every_key_that_differs(runs, data_root):
    _, (a, _), seed1 = runs
    out = diff(data_root, seed1, a)
    assert out.returncode == 0, out.stderr
    config, rows = sections(out.stdout)
    assert config == ["config: 1 key differs", "  seed: 1 -> 0"]
    assert rows["seed"] == ["1", "0"] and rows["batch"] == ["64", "64", "x1"]


def test_a_run_against_itself_is_identical(runs, data_root):
    _, (a, _), _ = runs
    out = diff(data_root, a, a)
    assert out.returncode == 0, out.stderr
    assert sections(out.stdout)[0] == ["config: identical"]


def test_a_directory_that_is_not_a_run_is_one_line_exit_2(runs, data_root, tmp_path):
    sweep, (a, _), _ = runs
    empty = tmp_path / "empty"
    empty.mkdir()
    out = diff(data_root, a, empty)
    assert out.returncode == 2 and out.stdout == ""
    lacks = "no .hydra/config.yaml, no summary.json, no metrics.jsonl"
    assert out.stderr == f"error: {empty} is not a run directory: {lacks}\n"

    out = diff(data_root, sweep, a)  # a sweep directory: its points are the runs
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1
    assert out.stderr.startswith(f"error: {sweep} is not a run directory: no .hydra/config.yaml")
    assert f"it is a sweep directory: compare two of its points, e.g. {a}" in out.stderr

    stopped = tmp_path / "stopped"  # a run that never wrote its summary (killed)
    shutil.copytree(a, stopped)
    (stopped / "summary.json").unlink()
    out = diff(data_root, a, stopped)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1
    assert out.stderr.startswith(f"error: {stopped} is not a run directory: no summary.json (a run stopped")
    assert f"resume=auto hydra.run.dir={stopped}" in out.stderr

    missing = tmp_path / "nowhere"
    out = diff(data_root, missing, a)
    assert (out.returncode, out.stderr) == (2, f"error: {missing}: no such directory\n")


@pytest.mark.parametrize(
    "name, text, fragment",
    [
        ("summary.json", '{"status": "compl', "cannot be read (JSONDecodeError"),  # cut short
        ("summary.json", "[1]", "holds no run's summary (a JSON object): it holds list"),
        (".hydra/config.yaml", "seed: [0\n", "cannot be read (ParserError"),
    ],
)
def test_a_run_file_cut_short_or_of_another_shape_is_one_line_naming_it(
    runs, data_root, tmp_path, name, text, fragment
):
    _, (a, _), _ = runs
    broken = tmp_path / "broken"
    shutil.copytree(a, broken)
    (broken / name).write_text(text)
    out = diff(data_root, a, broken)
    assert out.returncode == 2 and out.stdout == "", out.stderr
    [line] = out.stderr.splitlines()
    assert line.startswith("error: ") and str(broken / name) in line and fragment in line, line
