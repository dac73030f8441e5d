"""Sweeps on a real SLURM cluster (one node on this machine, scripts/slurm_local.sh) through
Hydra's submitit launcher: every point a SLURM job, DDP inside a job, a preempted job requeued
and resumed bit-identically, a failing point among completed ones."""

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import dist_workers
from resuming import SLOW, assert_ends_as, assert_same_state, final_state, newest_step, records, uninterrupted
from slurm_cluster import MARKS, accounting, bsexp, cancel, env, job_ids, slurm

pytestmark = MARKS

LAUNCHER = "hydra/launcher=slurm_local"
# A tiny run on the default data and model: seconds a point.
TINY = [
    "data.num_samples=1000",
    "data.val_size=100",
    "epochs=2",
    "model.width=8",
    "logger=none",
    "trainer.progress=false",
]


def summaries(sweep: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/summary.json")}


def index(sweep: Path) -> list[dict]:
    return [json.loads(line) for line in (sweep / "jobs.jsonl").read_text().splitlines()]


def test_a_sweep_runs_each_point_as_a_slurm_job_and_reports(data_root, tmp_path):
    sweep = tmp_path / "sweep"
    out = bsexp(data_root, tmp_path, "-m", LAUNCHER, "batch.size=32,64,128,256", *TINY, f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    # Four SLURM jobs (submitit submits a sweep as one job array), each completed in SLURM's books.
    [array] = job_ids(sweep)[:1]
    tasks = dict(accounting(array.split("_")[0], tasks=4))
    assert len(tasks) == 4 and set(tasks.values()) == {"COMPLETED"}, tasks
    assert "4 points (4 completed)" in out.stdout + out.stderr
    entries = index(sweep)
    assert sorted(e["batch_size"] for e in entries) == [32, 64, 128, 256]
    assert {e["status"] for e in entries} == {"completed"} and len({e["dir"] for e in entries}) == 4
    seen = set()
    for entry in entries:
        summary = json.loads((sweep / entry["dir"] / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["batch_size"] == entry["batch_size"]
        assert summary["steps"] == entry["steps"] == 2 * -(-summary["samples_seen"] // 2 // entry["batch_size"])
        seen.add(summary["samples_seen"])
    assert len(seen) == 1  # two whole epochs of the same data at every batch size
    report = subprocess.run(
        [sys.executable, "-m", "bsexp.report", str(sweep)],
        cwd=tmp_path,
        env=env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    rows = (sweep / "report.csv").read_text().splitlines()
    assert len(rows) == 1 + 4  # header and one row per batch size
    assert (sweep / "accuracy.png").stat().st_size > 0


# A model without BatchNorm, so that 2 ranks x 32 compute exactly what 1 process x 64 does (up to
# float rounding in the all-reduce).
NO_NORM = [
    "data=synthetic",
    "data.shape=[1,16]",
    "data.num_samples=1000",
    "data.val_size=100",
    "model=mlp",
    "model.norm=none",
    "model.hidden=[32]",
    "epochs=2",
    "batch.size=64",
    "logger=none",
    "trainer.progress=false",
]


def test_ddp_inside_a_slurm_job_equals_one_process(data_root, tmp_path):
    sweep = tmp_path / "sweep"
    out = bsexp(
        data_root,
        tmp_path,
        "-m",
        LAUNCHER,
        "hydra.launcher.cpus_per_task=2",
        "distributed=ddp",
        "distributed.nproc_per_node=2",
        *NO_NORM,
        f"hydra.sweep.dir={sweep}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    [job] = job_ids(sweep)
    assert dict(accounting(job)) == {job: "COMPLETED"}
    [(point, summary)] = summaries(sweep).items()
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["micro_size"] == 32
    one = tmp_path / "one"
    alone = bsexp(data_root, tmp_path, *NO_NORM, f"hydra.run.dir={one}")
    assert alone.returncode == 0, alone.stderr[-3000:]
    reference = json.loads((one / "summary.json").read_text())
    assert reference["world_size"] == 1 and reference["steps"] == summary["steps"] == 2 * 15
    ddp, single = final_state(sweep / point), final_state(one)
    for key, value in single["model"].items():
        assert torch.allclose(ddp["model"][key], value, atol=1e-5, rtol=0), key
    logged, expected = records(sweep / point), records(one)
    assert [r["samples_seen"] for r in logged] == [r["samples_seen"] for r in expected]
    for mine, theirs in zip(logged, expected):
        assert mine["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-5)
        assert mine["val_acc"] == pytest.approx(theirs["val_acc"], abs=1 / 100 + 1e-9)


def submission_script(sweep: Path, job: str) -> str:
    return next((sweep / ".submitit" / job).glob("*_submission.sh")).read_text()


def preempt_once(data_root: Path, tmp_path: Path, *args: str) -> tuple[Path, str, int]:
    """Run a one-point sweep as a SLURM job and send its step SIGUSR1 once the run is past a random
    step (after a periodic checkpoint); wait for the sweep to end. The point's directory, the job
    id, and the step the signal came after."""
    sweep = tmp_path / "sweep"
    log = open(tmp_path / "sweep.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bsexp.train", "-m", LAUNCHER, *args, f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path,
        env=env(data_root),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        target, deadline = random.Random(len(args)).randrange(20, 45), time.time() + 300
        point = None
        while point is None or newest_step(point) < target:
            assert proc.poll() is None, (tmp_path / "sweep.log").read_text()[-3000:]
            assert time.time() < deadline, "the job did not reach its first checkpoints in time"
            point = next(sweep.glob("0_*"), None)
            time.sleep(0.01)
        [job] = job_ids(sweep)
        # What SLURM sends signal_delay_s before the time limit (the job asked for it: --signal=USR1@120).
        assert "#SBATCH --signal=USR1@120" in submission_script(sweep, job)
        slurm("scancel", "--signal=USR1", job)
        assert proc.wait(timeout=400) == 0, (tmp_path / "sweep.log").read_text()[-3000:]
    except BaseException:
        proc.kill()
        cancel(sweep)  # a requeued attempt the sweep no longer waits for
        raise
    finally:
        log.close()
    # SLURM's books: the first attempt requeued, the second completed, under the same job id.
    books = accounting(job)
    assert books == [(job, "REQUEUED"), (job, "COMPLETED")], books
    submitit_log = "".join(p.read_text() for p in (sweep / ".submitit" / job).glob("*_log.err"))
    assert "Caught signal SIGUSR1" in submitit_log
    [entry] = index(sweep)  # one point, recorded once, when it completed
    assert entry["status"] == "completed"
    return point, job, target


# About 10 ms a step on one thread: USR1 arrives mid-run, after a periodic checkpoint.
PREEMPTED = [o for o in SLOW if not o.startswith("epochs=")] + ["epochs=5", "batch.size=64"]


def test_a_preempted_job_is_requeued_and_resumes_bit_identically(make_cfg, data_root, tmp_path):
    point, job, target = preempt_once(data_root, tmp_path, *PREEMPTED)
    summary = json.loads((point / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 300  # 5 epochs of 60 steps
    stopped_at = int(Path(summary["resumed_from"]).stem.split("-")[1])
    assert target <= stopped_at < 300
    # Parameters, optimizer state and metrics as if the job had never been interrupted.
    loop, progress = uninterrupted(make_cfg, *PREEMPTED)
    assert_ends_as(point, loop)
    assert [r["step"] for r in records(point)] == [r["step"] for r in progress.records]
    assert [r["val_loss"] for r in records(point)] == [r["val_loss"] for r in progress.records]


def test_a_preempted_ddp_job_is_requeued_and_its_workers_resume_bit_identically(make_cfg, data_root, tmp_path):
    # The signal reaches the job's every process: the workers bsexp started checkpoint and stop,
    # then the job's own process lets submitit requeue it.
    ddp = ["distributed=ddp", "distributed.nproc_per_node=2"]
    point, job, target = preempt_once(data_root, tmp_path, "hydra.launcher.cpus_per_task=2", *ddp, *PREEMPTED)
    summary = json.loads((point / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["steps"] == 300
    assert target <= int(Path(summary["resumed_from"]).stem.split("-")[1]) < 300
    reference = dist_workers.launch(dist_workers.train_steps, make_cfg(*PREEMPTED, *ddp))[0]
    assert_same_state(final_state(point)["model"], reference["params"])


def test_a_failing_point_is_recorded_failed_and_the_others_complete(data_root, tmp_path):
    conf = tmp_path / "my_conf" / "model"
    conf.mkdir(parents=True)
    (conf / "tiny.yaml").write_text("_target_: user_models.TinyNet\nhidden: 16\nfail_at_step: 0\n")
    sweep = tmp_path / "sweep"
    # fail_at_step=3: a real RuntimeError in the third training step of that point's job.
    out = bsexp(
        data_root,
        tmp_path,
        "-m",
        LAUNCHER,
        f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]",
        "model=tiny",
        "model.fail_at_step=0,3",
        "batch.size=32,64",
        *TINY[:3],
        "logger=none",
        "trainer.progress=false",
        f"hydra.sweep.dir={sweep}",
    )
    assert out.returncode == 1
    [line] = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: a sweep point failed (") and "failed on purpose at training step 3" in line
    entries = {
        tuple(o for o in e["overrides"] if o.startswith(("model.fail_at_step=", "batch.size="))): e
        for e in index(sweep)
    }
    assert len(entries) == 4
    for (failing, size), entry in entries.items():
        size = int(size.split("=")[1])
        if failing == "model.fail_at_step=3":
            assert entry["status"] == "failed" and "failed on purpose at training step 3" in entry["error"]
            assert json.loads((sweep / entry["dir"] / "summary.json").read_text())["status"] == "failed"
        else:
            summary = json.loads((sweep / entry["dir"] / "summary.json").read_text())
            assert entry["status"] == summary["status"] == "completed" and summary["batch_size"] == size
    # Each point was its own SLURM job; the failure was the point's, not the job's.
    [array] = job_ids(sweep)[:1]
    assert set(dict(accounting(array.split("_")[0], tasks=4)).values()) == {"COMPLETED"}


def test_a_sweep_whose_allocation_ended_is_continued_by_one_command(data_root, tmp_path):
    # Two points as SLURM jobs, cut off mid-run (their jobs cancelled, the launching process gone,
    # as when an allocation ends); `-m resume=auto hydra.sweep.dir=...` continues both as SLURM
    # jobs again (the launcher is the sweep's own), and the sweep ends as it would have unbroken.
    args = ["-m", LAUNCHER, "batch.size=64,128", *PREEMPTED]
    whole = tmp_path / "whole"
    out = bsexp(data_root, tmp_path, *args, f"hydra.sweep.dir={whole}")
    assert out.returncode == 0, out.stderr[-3000:]
    sweep = tmp_path / "sweep"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bsexp.train", *args, f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path,
        env=env(data_root),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 300
        while max((newest_step(p) for p in sweep.glob("*_batch.size=*")), default=0) < 20:
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.05)
        cancel(sweep)
    finally:
        proc.kill()
        proc.wait()
    assert not all(s.get("status") == "completed" for s in summaries(sweep).values()) or len(summaries(sweep)) < 2
    out = bsexp(data_root, tmp_path, "-m", "resume=auto", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    timing = {"wall_time_s", "train_time_s", "samples_per_s", "peak_memory_mb", "provenance", "resumed_from"}

    def same(s: dict) -> dict:
        return {k: v for k, v in s.items() if k not in timing}

    assert {k: same(s) for k, s in summaries(sweep).items()} == {k: same(s) for k, s in summaries(whole).items()}
    assert len(job_ids(sweep)) >= 2  # the continued points ran as jobs of their own
