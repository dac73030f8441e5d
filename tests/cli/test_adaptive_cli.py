"""batch=adaptive and Seesaw through the CLI: each arm end to end, a resume across a change of
batch, and an out-of-memory error under a real cap that keeps the adaptive batch."""

import json
import signal
import subprocess
import sys

import pytest

from conftest import cli_env, limit_for_size
from resuming import SLOW, assert_ends_as, newest_step, records, start, started_with, stop_mid_run, uninterrupted

# c = 100 makes the batch grow at the first decision whatever B_simple is; max_size stops it there.
ADAPTIVE = [
    "batch=adaptive",
    "batch.size=64",
    "batch.find_micro_size=false",
    "batch.adaptive.interval=15",
    "batch.adaptive.c=100",
    "batch.adaptive.max_size=128",
]


# Warmup in steps: counted against the first batch's run, as the uninterrupted run counts it, not
# against the restored one, whose batch has grown by then (a resumed run's LRs all differed).
STEPS_WARMUP = ["schedule.unit=steps", "schedule.warmup=40"]


@pytest.mark.slow  # 17-32 s on 2 cores: scripts/test_slow.sh (the default tiers' time)
def test_an_adaptive_run_stopped_after_a_change_of_batch_resumes_bit_identically(make_cfg, data_root, tmp_path):
    run_dir = tmp_path / "run"
    args = [*SLOW, *ADAPTIVE, *STEPS_WARMUP, f"hydra.run.dir={run_dir}"]
    code, err = stop_mid_run(start(data_root, tmp_path, *args), run_dir, signal.SIGTERM, seed=3)
    stopped_at = newest_step(run_dir)
    assert code == 128 + signal.SIGTERM and stopped_at > 15  # after the change at step 15
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
    assert summary["status"] == "completed" and summary["adaptive"]["sizes"] == [[0, 64], [15, 128]]
    # What it started with, as the run uninterrupted says (not the batch and LR where it resumed)
    begun = started_with(make_cfg, *ADAPTIVE, *STEPS_WARMUP)
    assert begun["batch_size"] == 64 and summary["final_batch_size"] == 128
    assert {key: summary[key] for key in begun} == begun
    loop, progress = uninterrupted(make_cfg, *ADAPTIVE, *STEPS_WARMUP)
    assert loop.batch_control.policy.points == [(0, 64), (15, 128)]
    assert_ends_as(run_dir, loop)
    assert [r["val_loss"] for r in records(run_dir)] == [r["val_loss"] for r in progress.records]
    assert [r["batch_size"] for r in records(run_dir)] == [r["batch_size"] for r in progress.records]
    assert (run_dir / "batch.png").stat().st_size > 10_000  # the batch over training, against B_simple


SMALL = ["data.num_samples=2000", "model.width=8", "epochs=3", "trainer.progress=false", "logger=none"]


@pytest.mark.parametrize("arm", ["goodput", "adascale", "seesaw"])
def test_each_new_arm_trains_end_to_end(run_cli, tmp_path, arm):
    run_dir = tmp_path / arm
    overrides = {
        # max_size bounds the LR the linear rule can reach: the arm must train whatever throughput
        # the finder measured on a busy machine.
        "goodput": [
            "batch=adaptive",
            "batch.adaptive.objective=goodput",
            "batch.adaptive.interval=10",
            "batch.adaptive.max_size=128",
        ],
        "adascale": [
            "batch=adaptive",
            "batch.adaptive.lr=adascale",
            "batch.adaptive.interval=10",
            "batch.find_micro_size=false",
            "batch.adaptive.max_size=128",
        ],
        "seesaw": [
            "batch=scheduled",
            "batch.schedule.kind=seesaw",
            "schedule.main=step",
            "schedule.milestones=[1,2]",
            "schedule.factor=0.5",
        ],
    }[arm]
    out = run_cli(*SMALL, *overrides, f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["val_acc"] > 0.3  # trains (chance: 0.1)
    logged = records(run_dir)
    if arm == "seesaw":
        assert summary["final_batch_size"] == 4 * summary["batch_size"]  # x2 at each of the two decays
        return
    decisions = summary["adaptive"]["decisions"]
    assert decisions and all(d["step"] % 10 == 0 for d in decisions)
    assert all("adaptive/efficiency" in r for r in logged) and (run_dir / "batch.png").exists()
    if arm == "goodput":  # the finder's trials gave the throughput at each size
        trials = json.loads((run_dir / "finder.json").read_text())["trials"]
        assert sum(1 for t in trials if t["samples_per_s"]) >= 2
    else:
        assert all(1.0 <= d["gain"] <= d["size"] / summary["batch_size"] + 1e-9 for d in decisions)


# Memory grows fast with the batch and compute does not: one wide hidden layer on 40 inputs.
WIDE = [
    "data=synthetic",
    "data.shape=[1,40]",
    "data.val_size=200",
    "model=mlp",
    "model.hidden=[8192]",
    "model.norm=none",
    "trainer.eval_batch_size=256",
    "schedule.warmup_shape=none",
    "epochs=1",
    "data.num_samples=8200",
]


@pytest.mark.slow  # 20-70 s on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_an_adaptive_batch_that_outgrows_memory_keeps_its_global_batch(run_cli, data_root, tmp_path):
    (tmp_path / "calibration").mkdir()
    limit = limit_for_size(data_root, tmp_path / "calibration", WIDE, 1000)
    grows = [
        *WIDE,
        "batch=adaptive",
        "batch.size=500",
        "batch.find_micro_size=false",
        "batch.adaptive.interval=2",
        "batch.adaptive.c=1000",
        "batch.adaptive.max_growth=8",
        "batch.adaptive.max_size=4000",
        f"trainer.memory_limit_gb={limit}",
        "logger=none",
        "trainer.progress=false",
    ]
    out = run_cli(*grows, f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["oom_recoveries"] >= 1
    assert summary["adaptive"]["sizes"] == [[0, 500], [2, 4000]]  # the decision stands after the OOM
    assert summary["final_batch_size"] == 4000 and summary["final_micro_size"] < 4000
    assert summary["samples_seen"] == 8000 and "out of memory at micro-batch 4000" in out.stdout + out.stderr
