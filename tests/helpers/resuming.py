"""Runs stopped mid-way and what they left: start one, stop it at a random step after a
checkpoint, read its checkpoints and records, and the same run uninterrupted to hold it against."""

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from bsexp.train.loop import TrainState, build_loop, train
from bsexp.train.summary import hyperparameters
from conftest import cli_env

# About 10 ms a step on one thread, 180 steps: long enough to stop at a random step mid-epoch.
SLOW = [
    "data=synthetic",
    "data.shape=[1,128]",
    "data.num_samples=4000",
    "data.val_size=200",
    "model=mlp",
    "model.norm=none",
    "model.hidden=[1024,1024]",
    "epochs=3",
    "trainer.threads=1",
    "checkpoint.every_steps=7",
    "checkpoint.keep=3",
    "logger=none",
    "trainer.progress=false",
]
POLICIES = {
    "fixed": ["batch.size=64"],
    "accumulation": ["batch=accumulation", "batch.size=64", "batch.micro_size=16"],
    "scheduled": ["batch=scheduled", "batch.size=64", "batch.schedule.milestones=[1]", "batch.schedule.factor=2"],
}


def start(data_root, cwd, *args, torchrun: int = 0) -> subprocess.Popen:
    launcher = ["-m", "torch.distributed.run", f"--nproc_per_node={torchrun}", "--standalone"] if torchrun else []
    return subprocess.Popen(
        [sys.executable, *launcher, "-m", "bsexp.train", *args],
        cwd=cwd,
        env=cli_env(data_root),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def newest_step(run_dir: Path) -> int:
    steps = [int(p.stem.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*.pt")]
    return max(steps, default=0)


def stop_mid_run(proc: subprocess.Popen, run_dir: Path, sig: int, seed: int) -> tuple[int, str]:
    """Send `sig` once the run has passed a random step (after its first checkpoint)."""
    target = random.Random(seed).randrange(20, 45)  # within the first epoch (60 steps), past a checkpoint
    deadline = time.time() + 240
    while newest_step(run_dir) < target:
        assert proc.poll() is None, f"the run ended before step {target}: {proc.communicate()[1][-2000:]}"
        assert time.time() < deadline, "the run did not reach its checkpoints in time"
        time.sleep(0.01)
    time.sleep(random.Random(seed).uniform(0, 0.05))
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def final_state(run_dir: Path) -> dict:
    return torch.load(sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1], weights_only=False)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def uninterrupted(make_cfg, *overrides):
    threads = torch.get_num_threads()
    try:
        cfg = make_cfg(*SLOW, *overrides)
        loop, progress = build_loop(cfg), TrainState()
        assert train(loop, progress) == "completed"
        return loop, progress
    finally:
        torch.set_num_threads(threads)


def started_with(make_cfg, *overrides) -> dict:
    """What the run starts with (bsexp.train.summary.hyperparameters: its batch, LR, ...), built
    and not trained."""
    threads = torch.get_num_threads()
    try:
        cfg = make_cfg(*SLOW, *overrides)
        return hyperparameters(cfg, build_loop(cfg))
    finally:
        torch.set_num_threads(threads)


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def assert_ends_as(run_dir: Path, loop) -> None:
    """The run's last checkpoint holds the parameters and optimizer state `loop` (the same run,
    uninterrupted) ended with, bit for bit."""
    state = final_state(run_dir)
    assert_same_state(state["model"], loop.step.net.state_dict())
    for key, value in loop.step.optimizer.state_dict()["state"].items():
        assert_same_state(state["optimizer"]["state"][key], value)
