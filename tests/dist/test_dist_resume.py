"""Two ranks stopped and resumed, by a signal and by torchrun's restarts, bit-identical to an uninterrupted run."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import dist_workers
from bsexp.train.loop import TrainState, build_loop, train
from conftest import cli_env
from resuming import POLICIES, SLOW, assert_same_state, final_state, newest_step, records, start, stop_mid_run, uninterrupted

@pytest.mark.slow  # 34-36 s on 2 cores, the default tiers' longest: scripts/test_slow.sh (and .ci/run) runs it
def test_two_ranks_stopped_by_sigterm_resume_bit_identically(make_cfg, data_root, tmp_path):
    run_dir = tmp_path / "run"
    args = [*SLOW, "batch.size=64", "epochs=2", "distributed=ddp", f"hydra.run.dir={run_dir}"]
    code, err = stop_mid_run(start(data_root, tmp_path, *args, torchrun=2), run_dir, signal.SIGTERM, seed=7)
    assert code != 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["world_size"] == 2
    stopped_at = summary["steps"]
    assert newest_step(run_dir) == stopped_at and 0 < stopped_at < 120
    resumed = subprocess.run([sys.executable, "-m", "bsexp.train", *args, "distributed.nproc_per_node=2",
                              "resume=auto"], cwd=tmp_path, env=cli_env(data_root), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    cfg = make_cfg(*SLOW, "batch.size=64", "epochs=2", "distributed=ddp", "distributed.nproc_per_node=2")
    reference = dist_workers.launch(dist_workers.train_steps, cfg)[0]
    assert_same_state(final_state(run_dir)["model"], reference["params"])


@pytest.mark.slow  # 17-32 s on 2 cores: scripts/test_slow.sh (the default tiers' time)
def test_torchrun_restarts_a_killed_worker_and_the_job_resumes_and_finishes(data_root, tmp_path):
    conf = tmp_path / "my_conf" / "model"
    conf.mkdir(parents=True)
    (conf / "dies.yaml").write_text("_target_: user_models.DiesOnce\nrank: 1\ndie_at: 25\n")
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "--max-restarts=1",
         "-m", "bsexp.train", "distributed=ddp", "data=synthetic", "data.shape=[1,16]", "data.num_samples=1000",
         "data.val_size=100", f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "model=dies", "batch.size=32",
         "epochs=2", "checkpoint.every_steps=10", "logger=none", "trainer.progress=false"],
        cwd=tmp_path, env=cli_env(data_root), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    [run_dir] = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir() and not p.name.startswith(".")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 2 * 29  # 900 samples: 28 x 32 + 4
    assert summary["resumed_from"].endswith("step-000000020.pt")  # rank 1 died in step 25
    assert [r["step"] for r in records(run_dir)] == [29, 58]
