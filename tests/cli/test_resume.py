"""Checkpoints and resume through the CLI: bit-identical continuation after a kill or a signal,
divergence, corrupt and foreign checkpoints; W&B that cannot start."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bsexp.errors import DIVERGED
from conftest import cli_env
from resuming import (
    POLICIES,
    SLOW,
    assert_ends_as,
    assert_same_state,
    final_state,
    newest_step,
    records,
    start,
    stop_mid_run,
    uninterrupted,
)

# Dropout draws from torch's generator at every step after the restore: without the generators
# put back, a resumed run drops other units than the uninterrupted one and ends elsewhere.
DRAWS = ["model.dropout=0.1"]


# SIGKILL: a crash (resumed from the last periodic checkpoint); SIGTERM: a preemption; SIGUSR1:
# SLURM's warning before the time limit (both checkpoint at the next step boundary).
@pytest.mark.parametrize(
    "policy, sig", [("fixed", signal.SIGKILL), ("accumulation", signal.SIGTERM), ("scheduled", signal.SIGUSR1)]
)
def test_a_run_stopped_mid_epoch_resumes_bit_identically(make_cfg, data_root, tmp_path, policy, sig):
    run_dir = tmp_path / "run"
    # The preempted accumulation run logs to (offline) W&B, to see it resume under the same run id.
    logger = "logger=wandb" if policy == "accumulation" else "logger=none"
    args = [*(o for o in SLOW if o != "logger=none"), logger, *POLICIES[policy], *DRAWS, f"hydra.run.dir={run_dir}"]
    code, err = stop_mid_run(start(data_root, tmp_path, *args), run_dir, sig, seed=len(policy))
    stopped_at = newest_step(run_dir)
    if sig != signal.SIGKILL:  # a checkpoint at the next step boundary, then status preempted
        assert code == 128 + sig and f"stopped by {signal.Signals(sig).name}" in err
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "preempted" and summary["steps"] == stopped_at
    else:
        assert code == -signal.SIGKILL
    assert 0 < stopped_at < 180 and stopped_at % 60 != 0  # mid-epoch (60 steps an epoch at 64)
    left = torch.load(run_dir / "checkpoints" / f"step-{stopped_at:09d}.pt", weights_only=False)
    resumed = subprocess.run(
        [sys.executable, "-m", "bsexp.train", *args, "resume=auto"],
        cwd=tmp_path,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from"].endswith(f"step-{stopped_at:09d}.pt")
    # The clocks count both processes: the first's to its checkpoint, then the second's.
    assert 0 < left["train_time_s"] < left["wall_time_s"]
    assert summary["wall_time_s"] > left["wall_time_s"] + (summary["train_time_s"] - left["train_time_s"])
    loop, progress = uninterrupted(make_cfg, *POLICIES[policy], *DRAWS)
    assert_ends_as(run_dir, loop)
    # metrics.jsonl goes on where the checkpoint left it: no record missing, none twice.
    logged = records(run_dir)
    assert [r["step"] for r in logged] == [r["step"] for r in progress.records]
    assert [r["val_loss"] for r in logged] == [r["val_loss"] for r in progress.records]
    assert [r["train_loss"] for r in logged] == [r["train_loss"] for r in progress.records]
    if logger == "logger=wandb":  # both attempts wrote to one W&B run id
        run_files = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
        assert len(run_files) == 2 and run_files[0].name == run_files[1].name


DIVERGES = [
    "data=synthetic",
    "data.shape=[1,16]",
    "data.num_samples=1000",
    "data.val_size=100",
    "model=mlp",
    "model.norm=none",
    "optimizer.lr=1e6",
    "schedule.warmup_shape=none",
    "trainer.progress=false",
]


def test_a_diverging_run_stops_with_its_step_and_last_finite_loss_and_keeps_its_checkpoint(run_cli, tmp_path):
    run_dir = tmp_path / "run"
    out = run_cli(*DIVERGES, "checkpoint.every_steps=1", "logger=none", f"hydra.run.dir={run_dir}")
    assert out.returncode == DIVERGED, out.stderr[-3000:]  # its own exit code: neither a crash's nor a config's
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["diverged_at_step"] == summary["steps"]
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(f"diverged at step {summary['steps']} (a non-finite training loss; the last finite: ")
    assert summary["last_finite_loss"] is not None and summary["last_finite_loss"] == summary["last_finite_loss"]
    assert newest_step(run_dir) == summary["steps"] - 1  # the last good step's checkpoint, nothing after it
    assert "status diverged" in out.stdout


def test_a_corrupt_newest_checkpoint_is_skipped_for_the_one_before(make_cfg, data_root, run_cli, tmp_path):
    run_dir = tmp_path / "run"
    args = [*SLOW, "batch.size=64", "epochs=1", *DRAWS, f"hydra.run.dir={run_dir}"]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr[-2000:]
    newest = sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # cut short, as by a full disk
    again = run_cli(*args, "resume=auto")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "is unreadable" in again.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"].endswith("step-000000056.pt") and summary["status"] == "completed"
    loop, _ = uninterrupted(make_cfg, "batch.size=64", "epochs=1", *DRAWS)
    assert_same_state(final_state(run_dir)["model"], loop.step.net.state_dict())


@pytest.mark.parametrize(
    "other, fragment",
    [(["model.hidden=[32,16]"], "parameter shapes"), (["batch.size=128"], "global batch (64 there, 128 here)")],
)
def test_a_checkpoint_of_another_run_is_refused(run_cli, tmp_path, other, fragment):
    source = tmp_path / "source"
    small = [*SLOW, "data.shape=[1,16]", "data.num_samples=700", "model.hidden=[32,32]", "batch.size=64", "epochs=1"]
    first = run_cli(*small, f"hydra.run.dir={source}")
    assert first.returncode == 0, first.stderr[-2000:]
    checkpoint = sorted((source / "checkpoints").glob("step-*.pt"))[-1]
    # Beside its run, the checkpoint's own config refuses the change, naming the key.
    out = run_cli(*small, *other, f"resume={checkpoint}", f"hydra.run.dir={tmp_path / 'other'}")
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    key, value = other[0].split("=")
    assert line.startswith(f"error: {key}=") and "differs from the run being resumed" in line
    assert "checkpoint.allow_mismatch=true" in line
    # A checkpoint file alone (no run config beside it) is refused by what it holds.
    alone = tmp_path / "alone" / checkpoint.name
    alone.parent.mkdir()
    alone.write_bytes(checkpoint.read_bytes())
    out = run_cli(*small, *other, f"resume={alone}", f"hydra.run.dir={tmp_path / 'other2'}")
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(f"error: resume={alone}: was written by another run") and fragment in line
    assert "checkpoint.allow_mismatch=true" in line


@pytest.mark.parametrize(
    "value, fragment",
    [("/no/such/file.pt", "no such checkpoint file"), ("{tmp}/junk.pt", "is not a readable checkpoint")],
)
def test_resume_from_a_path_that_is_not_a_checkpoint_is_one_clear_line(run_cli, tmp_path, value, fragment):
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    value = value.format(tmp=tmp_path)
    out = run_cli(*SLOW, "epochs=1", f"resume={value}", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(f"error: resume={value}:") and fragment in line
    if "no such" in fragment:  # found before Hydra writes anything
        assert not (tmp_path / "run").exists()


def test_resume_from_a_missing_checkpoint_of_a_real_run_adds_nothing_to_it(run_cli, tmp_path):
    run_dir = tmp_path / "run"
    out = run_cli(*SLOW, "epochs=1", "trainer.max_steps=3", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    missing = run_dir / "checkpoints" / "step-000000999.pt"
    out = run_cli(f"resume={missing}")
    assert out.returncode == 2 and f"error: resume={missing}: no such checkpoint file" in out.stderr
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before  # no .hydra/resume-1/


def test_resuming_a_completed_run_says_so_and_rewrites_nothing(run_cli, tmp_path):
    # A requeued job, or resume=auto run twice: the run is over, and its summary (the test split,
    # the wall time, the W&B run) is the one it finished with. Its directory is named as a sweep's
    # points are, so Hydra reads it quoted only, and the resume finds it.
    run_dir = tmp_path / "0_batch.size=64,seed=0"
    out = run_cli(*SLOW, "epochs=1", "trainer.max_steps=3", f"hydra.run.dir='{run_dir}'")
    assert out.returncode == 0, out.stderr[-3000:]
    before = _files(run_dir)
    out = run_cli("resume=auto", f"hydra.run.dir='{run_dir}'")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "completed at step 3 (summary.json): nothing left to resume" in out.stderr + out.stdout
    assert _files(run_dir) == before  # every file, .hydra/ and train.log too: no .hydra/resume-1/
    assert json.loads(before[Path("summary.json")])["resumed_from"] is None


def _files(run_dir):
    return {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_a_run_none_of_whose_checkpoints_loads_is_refused_not_trained_again_over_them(run_cli, tmp_path):
    # resume=auto used to find no readable checkpoint, warn, and train the run again from step 0:
    # over its metrics.jsonl, its checkpoints and (a completed run's) its summary.json.
    run_dir = tmp_path / "run"
    out = run_cli(*SLOW, "epochs=1", "trainer.max_steps=14", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    checkpoints = sorted((run_dir / "checkpoints").glob("step-*.pt"))
    assert len(checkpoints) == 2
    for path in checkpoints:  # cut short, as by a full disk
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = _files(run_dir)
    out = run_cli("resume=auto", f"hydra.run.dir={run_dir}")
    assert out.returncode == 2, out.stderr[-3000:]
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: resume=auto: none of the 2 checkpoints in") and "move them aside" in line
    assert _files(run_dir) == before  # every file as it was: no .hydra/resume-1/, no line in train.log


@pytest.mark.parametrize(
    "name, text, key",
    [
        ("overrides.yaml", "- [unclosed\n", "resume=auto"),  # does not parse
        ("overrides.yaml", "epochs=1\n", "resume=auto"),  # parses, as no list
        ("config.yaml", "seed: [0\n", "resume=auto"),  # the run's config: held against the resume's
    ],
)
def test_a_run_whose_own_config_cannot_be_read_is_refused_with_the_file_named(run_cli, tmp_path, name, text, key):
    run_dir = tmp_path / "run"
    out = run_cli(*SLOW, "epochs=1", "trainer.max_steps=7", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir / ".hydra" / name).write_text(text)
    before = _files(run_dir)
    out = run_cli("resume=auto", f"hydra.run.dir={run_dir}")
    assert out.returncode == 2, out.stderr[-3000:]
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(f"error: {key}") and str(run_dir / ".hydra" / name) in line, line
    assert "Traceback" not in out.stdout + out.stderr
    assert _files(run_dir) == before


@pytest.mark.slow  # 20-70 s on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_wandb_that_cannot_start_leaves_training_to_go_on(data_root, tmp_path):
    env = cli_env(data_root) | {
        "WANDB_MODE": "online",
        "WANDB_BASE_URL": "http://127.0.0.1:9",
        "WANDB_API_KEY": "x" * 40,
        "WANDB_INIT_TIMEOUT": "10",
    }
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bsexp.train",
            "data=digits",
            "model=mlp",
            "epochs=1",
            "trainer.progress=false",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "W&B could not start" in out.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and len(records(run_dir)) == 1
