"""Sweeps that survive (issue 46): a sweep killed mid-way is continued in its own directory by one
command, `python -m bsexp.train -m resume=auto hydra.sweep.dir=<dir>`, which runs only what is
left (points never started, failed, or cut off: those resume from their own checkpoints), each
point keeping its number and directory; it ends as the sweep uninterrupted would have."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bsexp.runs.sweep import read_index
from conftest import TINY_RUN, cli_env
from resuming import SLOW

# Four points of ~180 steps each, two at a time (Hydra's joblib launcher), a checkpoint every 7 steps.
SWEEP = ["-m", "batch.size=64,128", "seed=0,1", *SLOW, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
# Figures of the machine, not of the run: left out of the comparison.
TIMING = {"wall_time_s", "train_time_s", "samples_per_s", "peak_memory_mb", "provenance", "resumed_from", "threads"}


def bsexp(data_root, cwd, *args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "bsexp.train", *args],
        cwd=cwd,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=900,
        **kwargs,
    )


def summaries(sweep: Path) -> dict[str, dict]:
    return {
        d.name: {k: v for k, v in json.loads((d / "summary.json").read_text()).items() if k not in TIMING}
        for d in sweep.iterdir()
        if (d / "summary.json").exists()
    }


def newest_step(sweep: Path) -> int:
    return max((int(p.stem.split("-")[1]) for p in sweep.glob("*/checkpoints/step-*.pt")), default=0)


@pytest.mark.slow  # 20-70 s on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_a_killed_sweep_continued_ends_as_the_sweep_uninterrupted(data_root, tmp_path):
    whole = tmp_path / "whole"
    out = bsexp(data_root, tmp_path, *SWEEP, f"hydra.sweep.dir={whole}")
    assert out.returncode == 0, out.stderr[-3000:]
    expected = summaries(whole)
    assert len(expected) == 4 and all(s["status"] == "completed" for s in expected.values())

    sweep = tmp_path / "sweep"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bsexp.train", *SWEEP, f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path,
        env=cli_env(data_root),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # its own process group: the launcher's workers die with it
    deadline = time.time() + 600
    while newest_step(sweep) < 20:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole sweep, as a machine that goes down
    proc.communicate()
    before = summaries(sweep)
    assert len(before) < 4, "the sweep ended before it was killed: nothing left to continue"

    # The one command: the sweep's own arguments come from its directory.
    out = bsexp(data_root, tmp_path, "-m", "resume=auto", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert summaries(sweep) == expected  # every point, in its own numbered directory, as if never stopped
    index = [json.loads(line) for line in (sweep / "jobs.jsonl").read_text().splitlines()]
    assert {e["dir"] for e in index} == set(expected) and {e["num"] for e in index} == {0, 1, 2, 3}
    cut = [
        d
        for d in sweep.iterdir()
        if (d / "summary.json").exists() and json.loads((d / "summary.json").read_text()).get("resumed_from")
    ]
    assert cut, "no point was resumed from its own checkpoint"
    # A point that ran before keeps the config it was started with; this run's is beside it.
    for point in cut:
        assert (point / ".hydra" / "config.yaml").is_file() and (point / ".hydra" / "continued-1").is_dir()

    # Continued once more, nothing is left: every point says so and nothing is rewritten.
    files = {p: p.read_bytes() for p in sweep.glob("*/summary.json")}
    out = bsexp(data_root, tmp_path, "-m", "resume=auto", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("nothing left to resume") == 4
    assert {p: p.read_bytes() for p in files} == files


def test_a_continued_sweep_that_would_change_its_points_is_one_line(data_root, tmp_path):
    sweep = tmp_path / "sweep"
    out = bsexp(data_root, tmp_path, "-m", "batch.size=32,64", *TINY_RUN, f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    files = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}
    out = bsexp(data_root, tmp_path, "-m", "resume=auto", f"hydra.sweep.dir={sweep}", "epochs=5")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: epochs=5: resume=auto continues the sweep in {sweep} as it was started: leave epochs out (its "
        f"points cannot change)"
    ]
    out = bsexp(data_root, tmp_path, "-m", "resume=auto", f"hydra.sweep.dir={tmp_path / 'nowhere'}")
    assert out.returncode == 2 and "holds no sweep to continue (no multirun.yaml)" in out.stderr
    assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == files
    # A multirun.yaml emptied or cut short: once run as a sweep of the defaults, beside the points.
    saved = sweep / "multirun.yaml"
    for text, fragment in (
        ("", "holds no mapping"),
        ("hydra: [oops\n", "cannot be read"),
        ("a: 1\n", "hydra.overrides"),
    ):
        saved.write_text(text)
        out = bsexp(data_root, tmp_path, "-m", "resume=auto", f"hydra.sweep.dir={sweep}")
        assert out.returncode == 2, out.stderr[-2000:]
        [line] = out.stderr.strip().splitlines()
        assert line.startswith(f"error: hydra.sweep.dir={sweep}: {saved}") and fragment in line, line
        assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file() and p != saved} == {
            p: b for p, b in files.items() if p != saved
        }


@pytest.mark.slow  # 17-32 s on 2 cores: scripts/test_slow.sh (the default tiers' time)
def test_a_point_that_failed_is_run_again_and_the_sweep_ends_as_if_it_never_had(data_root, tmp_path):
    # A model of the user's (tests/helpers/user_models.py) that fails while a file names its size:
    # point 1 (hidden 32) fails at its third step, point 0 completes; the fault is then fixed.
    conf = tmp_path / "my_conf" / "model"
    conf.mkdir(parents=True)
    flag = tmp_path / "flag"
    (conf / "flaky.yaml").write_text(f"_target_: user_models.FailsWhileFlagged\nhidden: 16\nflag: {flag}\n")
    sweep_args = [
        "-m",
        "model.hidden=16,32",
        *(o for o in TINY_RUN if not o.startswith("model.")),
        f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]",
        "model=flaky",
    ]
    whole = tmp_path / "whole"
    out = bsexp(data_root, tmp_path, *sweep_args, f"hydra.sweep.dir={whole}")
    assert out.returncode == 0, out.stderr[-3000:]
    expected = summaries(whole)

    flag.write_text("32")
    sweep = tmp_path / "sweep"
    out = bsexp(data_root, tmp_path, *sweep_args, f"hydra.sweep.dir={sweep}")
    assert out.returncode == 1 and "hidden 32 is flagged" in out.stderr
    failed = {d: e["status"] for d, e in read_index(sweep).items()}
    assert sorted(failed.values()) == ["completed", "failed"]
    done = {p: p.read_bytes() for p in sweep.glob("*/summary.json") if '"completed"' in p.read_text()}
    [failed_dir] = [d for d, status in failed.items() if status == "failed"]
    index = sweep / "jobs.jsonl"
    assert json.loads(index.read_text().splitlines()[-1])["dir"] == failed_dir  # the points run in turn
    index.write_bytes(index.read_bytes()[:-12])  # its last line cut short, as by a disk that filled

    flag.unlink()  # the fault fixed
    out = bsexp(data_root, tmp_path, "-m", "resume=auto", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert summaries(sweep) == expected  # the failed point ran again; the completed one as it was
    assert {p: p.read_bytes() for p in done} == done and out.stdout.count("nothing left to resume") == 1
    # The index keeps each point's history, the last line its outcome now (bsexp.runs.sweep.read_index);
    # the line cut short stays one unreadable line, not the start of the next point's.
    outcomes = {d: e["status"] for d, e in read_index(sweep).items()}
    assert outcomes == {d: "completed" for d in failed}
    lines = index.read_text().splitlines()
    assert [line for line in lines if not line.endswith("}")] == [lines[1]]
    history = [json.loads(line)["status"] for line in lines if line.endswith("}") and failed_dir in line]
    assert history == ["completed"]


def test_the_report_lists_every_point_of_the_grid_those_never_started_as_missing(data_root, tmp_path):
    sweep = tmp_path / "sweep"
    out = bsexp(data_root, tmp_path, "-m", "batch.size=32,64,128", *TINY_RUN, f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    # As if the sweep had stopped before its last point: no directory, no line in the index.
    [last] = [d for d in sweep.iterdir() if d.name.startswith("2_")]
    shutil.rmtree(last)
    index = sweep / "jobs.jsonl"
    index.write_text("".join(line + "\n" for line in index.read_text().splitlines() if f'"{last.name}"' not in line))
    report = subprocess.run(
        [sys.executable, "-m", "bsexp.report", str(sweep), "--no-wandb"],
        cwd=tmp_path,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert f"- `{last.name}`: missing" in (sweep / "report.md").read_text()
