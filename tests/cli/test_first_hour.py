"""A user's first hour, through the real command line: a resume continues the run's own config,
runs never share a directory, Ctrl-C checkpoints and says how to go on, the default finder run
trains, and the set-up warns where it is likely to train badly."""

import json
import signal
import subprocess
import sys
import time

import pytest
import yaml

from conftest import TINY_RUN, cli_env
from resuming import SLOW, assert_same_state, final_state, newest_step, start, stop_mid_run, uninterrupted


def command(data_root, cwd, *args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "bsexp.train", *args],
        cwd=cwd,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line(out, key, fragment):
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(f"error: {key}") and fragment in line, line


def test_a_resume_continues_the_runs_own_config_whatever_the_command_line_omits(make_cfg, data_root, tmp_path):
    run_dir = tmp_path / "run"
    code, _ = stop_mid_run(
        start(data_root, tmp_path, *SLOW, "batch.size=64", f"hydra.run.dir={run_dir}"), run_dir, signal.SIGTERM, seed=3
    )
    assert code == 128 + signal.SIGTERM
    saved = (run_dir / ".hydra" / "config.yaml").read_text()
    # The README's command: only the run directory. Everything the run was started with stays.
    resumed = command(data_root, tmp_path, "resume=auto", f"hydra.run.dir={run_dir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs"] == 3 and summary["steps"] == 180
    assert summary["data"] == "synthetic" and summary["resume_changes"] == []
    loop, _ = uninterrupted(make_cfg, "batch.size=64")
    assert_same_state(final_state(run_dir)["model"], loop.step.net.state_dict())
    # The run's own .hydra/ is as it was; the resume's overrides are kept beside it.
    assert (run_dir / ".hydra" / "config.yaml").read_text() == saved
    resume_overrides = yaml.safe_load((run_dir / ".hydra" / "resume-1" / "overrides.yaml").read_text())
    assert "resume=auto" in resume_overrides and "batch.size=64" in resume_overrides


@pytest.mark.slow  # 17-32 s on 2 cores: scripts/test_slow.sh (the default tiers' time)
def test_a_resume_that_would_change_the_run_is_refused_or_taken_and_recorded(data_root, tmp_path):
    run_dir = tmp_path / "run"
    code, _ = stop_mid_run(
        start(data_root, tmp_path, *SLOW, "batch.size=64", f"hydra.run.dir={run_dir}"), run_dir, signal.SIGTERM, seed=5
    )
    files = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    refused = command(data_root, tmp_path, "resume=auto", f"hydra.run.dir={run_dir}", "epochs=20")
    one_line(refused, "epochs=20", "differs from the run being resumed, which has epochs=3")
    assert "checkpoint.allow_mismatch=true" in refused.stderr
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == files  # nothing touched
    taken = command(
        data_root, tmp_path, "resume=auto", f"hydra.run.dir={run_dir}", "epochs=4", "checkpoint.allow_mismatch=true"
    )
    assert taken.returncode == 0, taken.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 240
    assert summary["resume_changes"] == [{"key": "epochs", "was": 3, "now": 4}]


def test_resume_auto_with_nothing_to_resume_says_so(data_root, tmp_path):
    one_line(command(data_root, tmp_path, "resume=auto"), "resume=auto", "hydra.run.dir=")
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line(
        command(data_root, tmp_path, "resume=auto", f"hydra.run.dir={empty}"), "resume=auto", "holds no run to continue"
    )
    assert not (tmp_path / "outputs").exists() and list(empty.iterdir()) == []


def test_ctrl_c_checkpoints_and_prints_the_exact_command_that_continues(data_root, tmp_path):
    run_dir = tmp_path / "run"
    args = [
        *[o for o in SLOW if not o.startswith("checkpoint.every_steps")],
        "checkpoint.every_steps=1000",
        "batch.size=64",
        f"hydra.run.dir={run_dir}",
    ]
    proc = start(data_root, tmp_path, *args)
    deadline = time.time() + 240
    while not (run_dir / "train.log").exists() or "lr " not in (run_dir / "train.log").read_text():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    time.sleep(0.5)  # mid-epoch: no checkpoint yet (the first is at the epoch's end)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["preempted_by"] == "SIGINT"
    assert newest_step(run_dir) == summary["steps"] > 0  # a checkpoint at the step it stopped
    [resume_line] = [line.strip() for line in err.splitlines() if "resume=auto" in line]
    assert resume_line == f"python -m bsexp.train resume=auto hydra.run.dir={run_dir}"
    again = command(data_root, tmp_path, *resume_line.split()[3:])
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 180


@pytest.mark.slow  # 20-70 s on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_runs_started_in_the_same_second_get_directories_of_their_own(data_root, tmp_path):
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bsexp.train", *TINY_RUN, f"seed={s}"],
            cwd=tmp_path,
            env=cli_env(data_root),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for s in (0, 1, 2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
    runs = sorted(tmp_path.glob("outputs/*/*/summary.json"))
    assert len(runs) == 3
    seeds = set()
    for path in runs:
        config = yaml.safe_load((path.parent / ".hydra" / "config.yaml").read_text())
        assert json.loads(path.read_text())["seed"] == config["seed"]  # each directory, one run
        assert (path.parent / "train.log").read_text().count("status") <= 1
        seeds.add(config["seed"])
    assert seeds == {0, 1, 2}


def test_a_second_run_given_the_same_directory_is_refused_before_it_writes_there(data_root, tmp_path):
    run_dir = tmp_path / "run"
    first = start(data_root, tmp_path, *SLOW, "batch.size=64", f"hydra.run.dir={run_dir}")
    deadline = time.time() + 240
    # Hydra opens train.log before it writes .hydra/; once the run logs, .hydra/ is written in full
    # (and the lock was taken before either).
    while not (run_dir / "train.log").exists() or not (run_dir / "train.log").read_text():
        assert first.poll() is None and time.time() < deadline
        time.sleep(0.05)
    before = (run_dir / ".hydra" / "config.yaml").read_text()
    assert "batch:" in before
    second = command(data_root, tmp_path, *TINY_RUN, "seed=7", f"hydra.run.dir={run_dir}")
    one_line(second, "hydra.run.dir", "in use by another run")
    assert (run_dir / ".hydra" / "config.yaml").read_text() == before
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=120)
    assert "seed: 7" not in (run_dir / ".hydra" / "config.yaml").read_text()
    assert "seed=7" not in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert not list((run_dir / ".hydra").glob("resume-*"))
    # Each run logs its data once as it builds it: a second run let into the directory would too.
    assert (run_dir / "train.log").read_text().count("][bsexp.train.summary][INFO] data ") == 1


@pytest.mark.slow  # minutes on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_the_default_finder_run_trains_as_well_as_the_default_run(data_root, tmp_path):
    # Bounded by the data (a tenth of the training set, McCandlish et al., Smith et al.), the
    # finder's batch keeps enough steps an epoch and an LR the warmup can carry.
    fixed = command(data_root, tmp_path, "logger=none", "trainer.progress=false", f"hydra.run.dir={tmp_path / 'fixed'}")
    found = command(
        data_root,
        tmp_path,
        "batch=finder",
        "logger=none",
        "trainer.progress=false",
        f"hydra.run.dir={tmp_path / 'found'}",
    )
    assert fixed.returncode == 0 and found.returncode == 0, found.stderr[-3000:]
    a = json.loads((tmp_path / "fixed" / "summary.json").read_text())
    b = json.loads((tmp_path / "found" / "summary.json").read_text())
    finder = json.loads((tmp_path / "found" / "finder.json").read_text())
    assert b["batch_size"] <= 350 and "batch.finder.data_fraction=0.1 of 3,500" in finder["max_size_by"]
    assert "set by batch.finder.data_fraction" in found.stdout  # shown in the finder's table
    assert b["test_acc"] >= a["test_acc"] - 0.03, (a["test_acc"], b["test_acc"])


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["data=digits", "model=mlp", "batch.size=512", "epochs=1"], "fewer than 8"),
        (["epochs=2", "model.width=8"], "takes the whole run"),
        # x8 (batch 1024 at the reference 128) raised in 1 step of warmup, not the 7 that carry it
        (["batch.size=1024", "epochs=1", "schedule.warmup=0.25", "model.width=8"], "raises the LR x8"),
    ],
)
def test_a_set_up_likely_to_train_badly_is_warned_about(data_root, tmp_path, overrides, fragment):
    out = command(data_root, tmp_path, *overrides, "logger=none", "trainer.progress=false")
    assert out.returncode == 0, out.stderr[-2000:]
    assert fragment in out.stdout + out.stderr


def test_a_run_cut_short_by_max_steps_is_not_told_its_batch_leaves_few_steps_an_epoch(data_root, tmp_path):
    # 3 steps of the default batch (128) on 3,500 samples: the batch leaves 28 steps an epoch; the
    # run takes 3 of them.
    out = command(
        data_root,
        tmp_path,
        "trainer.max_steps=3",
        "logger=none",
        "trainer.progress=false",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "fewer than 8" not in out.stdout + out.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["epochs"] == pytest.approx(3 / 28, abs=1e-4)


@pytest.mark.slow  # minutes on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_under_a_batch_schedule_the_lr_decay_is_counted_in_samples(data_root, tmp_path):
    # 32 -> 160 -> 800 at epochs 8 and 14 of 20, the LR held apart from its cosine decay: after
    # epoch 8 the decay stands where 8 epochs of 20 put it (counted in steps, 800 of 944 steps would
    # have taken the LR to a tenth of its peak before the batch first grows).
    run_dir = tmp_path / "run"
    out = command(
        data_root,
        tmp_path,
        "batch=scheduled",
        "data.val_size=800",
        "batch.schedule.couple_lr=false",
        "model.width=8",
        "logger=none",
        "trainer.progress=false",
        f"hydra.run.dir={run_dir}",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    import math

    seen = records[7]["samples_seen"] - 32  # before the last step of epoch 8
    progress = (seen - 2 * 3200) / (18 * 3200)
    assert records[7]["lr"] == pytest.approx(0.025 * 0.5 * (1 + math.cos(math.pi * progress)))
    assert records[7]["lr"] > 0.7 * 0.025


def test_a_signal_to_a_sweep_stops_the_sweep_not_just_its_running_point(data_root, tmp_path):
    sweep = tmp_path / "sweep"
    proc = start(data_root, tmp_path, "-m", *SLOW, "batch.size=64", "seed=0,1,2", f"hydra.sweep.dir={sweep}")
    deadline = time.time() + 240
    while not list(sweep.glob("0_*/train.log")) or "lr " not in next(sweep.glob("0_*/train.log")).read_text():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # as SLURM does to a job it preempts
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "the points after it did not run" in err
    [point] = sweep.glob("0_*")
    assert json.loads((point / "summary.json").read_text())["status"] == "preempted"
    assert not list(sweep.glob("1_*")) and not list(sweep.glob("2_*"))
