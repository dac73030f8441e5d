"""batch=scheduled through the CLI: where the batch ended, OOM that cannot be recovered, a schedule
that outgrows memory, experiment=increase_batch."""

import json

import pytest

import wandb_records
from conftest import limit_for_size
from tiny import TINY

# --- the schedule itself -------------------------------------------------------------------


# TINY: 512 training samples; batch 32 for an epoch, 64 for one, 128 for one.
GROWING = [
    "batch=scheduled",
    "batch.size=32",
    "batch.schedule.milestones=[1,2]",
    "batch.schedule.factor=2",
    "epochs=3",
    "trainer.eval_every_steps=1",
    "scaling.lr_rule=linear",
    "scaling.ref_batch=32",
    "optimizer.lr=0.1",
]


def test_scheduled_summary_reports_where_the_batch_ended(run_cli, tmp_path):
    out = run_cli(*TINY, *GROWING, "logger=none", "trainer.eval_every_steps=0", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["batch_size"], summary["final_batch_size"], summary["steps"]) == (32, 128, 28)
    assert "grew to 128" in out.stdout
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["batch_size"] for r in records] == [32, 64, 128]
    assert [r["lr"] for r in records] == pytest.approx([0.1, 0.2, 0.4])


def test_a_list_in_samples_seen_changes_the_batch_at_the_step_that_starts_past_each_point(run_cli, tmp_path):
    # The points fall inside epochs (512 samples each): 32 to 200 samples seen, 64 to 700, then 128.
    points = [[0, 32], [200, 64], [700, 128]]
    listed = ["batch.schedule.kind=list", "batch.schedule.unit=samples", f"batch.schedule.points={points}"]
    out = run_cli(*TINY, *GROWING, *listed, "logger=none", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "batch_size" in r]
    assert [r["step"] for r in steps] == list(range(1, len(steps) + 1))  # a record every step
    seen_before = [0] + [r["samples_seen"] for r in steps[:-1]]
    in_force = [max(b for at, b in points if at <= seen) for seen in seen_before]
    assert [r["batch_size"] for r in steps] == in_force
    assert sorted(set(in_force)) == [32, 64, 128] and steps[-1]["samples_seen"] == 3 * 512
    assert any(r["epoch"] < 1 and r["batch_size"] == 64 for r in steps)  # changed within the first epoch
    assert [r["lr"] for r in steps] == pytest.approx([0.1 * r["batch_size"] / 32 for r in steps])


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
]


def test_out_of_memory_at_a_micro_batch_of_one_is_a_clear_error(run_cli, tmp_path):
    conf = tmp_path / "my_conf" / "model"
    conf.mkdir(parents=True)  # 20 GB a sample: even one does not fit under a 4 GB cap
    (conf / "heavy.yaml").write_text("_target_: user_models.HeavyPerSample\nmb_per_sample: 20000\n")
    out = run_cli(
        "data=synthetic",
        "data.shape=[1,8]",
        "data.num_samples=100",
        "data.val_size=20",
        f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]",
        "model=heavy",
        "batch.size=4",
        "trainer.memory_limit_gb=4",
        "logger=none",
        "trainer.progress=false",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert out.returncode == 1
    assert out.stdout.count("out of memory at micro-batch") == 2  # 4 -> 2 -> 1 (the log's warnings)
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: out of memory (even a micro-batch of 1 sample per rank does not fit")
    assert (tmp_path / "run" / "train.log").read_text().splitlines()[-1].endswith(f"[ERROR] {last}")
    assert "Traceback" not in out.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["oom_recoveries"] == 2


@pytest.fixture(scope="module")
def micro_limit_gb(data_root, tmp_path_factory):
    """A memory limit under which the finder's micro-batch is about 1000."""
    return limit_for_size(data_root, tmp_path_factory.mktemp("calibration"), [*WIDE, "data.num_samples=8200"], 1000)


@pytest.mark.slow  # 20-70 s on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_a_schedule_that_outgrows_memory_switches_to_accumulation(run_cli, tmp_path, micro_limit_gb):
    limit = micro_limit_gb
    grows = [
        *WIDE,
        "data.num_samples=8200",
        "epochs=2",
        "batch=scheduled",
        "batch.size=500",
        "batch.schedule.milestones=[1]",
        "batch.schedule.factor=8",
        "batch.find_micro_size=true",
        f"batch.finder.memory_limit_gb={limit}",
        f"trainer.memory_limit_gb={limit}",
        "logger=none",
    ]
    out = run_cli(*grows, f"hydra.run.dir={tmp_path / 'scheduled'}")
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads((tmp_path / "scheduled" / "finder.json").read_text())["micro_size"]
    assert 500 <= found < 4000
    records = [json.loads(line) for line in (tmp_path / "scheduled" / "metrics.jsonl").read_text().splitlines()]
    first, second = records
    assert (first["batch_size"], first["micro_size"], first["accum_steps"]) == (500, 500, 1)
    assert second["batch_size"] == 4000 and second["micro_size"] <= found and second["accum_steps"] > 1
    assert second["micro_size"] * second["accum_steps"] == 4000
    summary = json.loads((tmp_path / "scheduled" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["oom_recoveries"] == 0
    assert summary["samples_seen"] == 2 * 8000
    # The scheduled batch in one piece does not fit under the same cap.
    whole = run_cli(
        *WIDE,
        "data.num_samples=8200",
        "batch.size=4000",
        f"trainer.memory_limit_gb={limit}",
        "trainer.oom_recovery=false",
        "trainer.max_steps=1",
        "logger=none",
        f"hydra.run.dir={tmp_path / 'whole'}",
    )
    assert whole.returncode == 1 and "out of memory" in whole.stderr


@pytest.mark.slow  # minutes on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_the_increase_batch_experiment_runs_its_three_arms(run_cli, tmp_path):
    out = run_cli(
        "-m",
        "experiment=increase_batch",
        "seed=0",
        "data.num_samples=1200",
        "data.val_size=100",
        "model.width=8",
        "trainer.progress=false",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    arms = {}
    for job in sorted((tmp_path / "sweep").iterdir()):
        if (job / "summary.json").exists():
            overrides = (job / ".hydra" / "overrides.yaml").read_text()
            arm = next(a for a in ("lr_decay", "batch_growth", "hybrid") if f"={a}" in overrides)
            summary = json.loads((job / "summary.json").read_text())
            records = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
            arms[arm] = summary, records
            # Its (offline) W&B run: named by arm, batch and seed, tagged with the experiment and arm.
            [run_file] = job.glob("wandb/offline-run-*/run-*.wandb")
            [run] = wandb_records.of_type(run_file, "run")
            assert run["display_name"] == f"{arm}-bs32-seed0" and run["tags"] == ["increase_batch", arm]
    assert sorted(arms) == ["batch_growth", "hybrid", "lr_decay"]
    # batch: 32 throughout / x5 at epochs 8 and 14 / x5 at 8; LR 0.05: /5 at 8 and 14 / held / /5 at 14.
    expected = {
        "lr_decay": ([32] * 20, [0.05] * 8 + [0.01] * 6 + [0.002] * 6),
        "batch_growth": ([32] * 8 + [160] * 6 + [800] * 6, [0.05] * 20),
        "hybrid": ([32] * 8 + [160] * 12, [0.05] * 14 + [0.01] * 6),
    }
    for arm, (batches, lrs) in expected.items():
        summary, records = arms[arm]
        assert summary["status"] == "completed" and summary["final_batch_size"] == batches[-1]
        assert [r["batch_size"] for r in records] == batches, arm
        assert [r["lr"] for r in records] == pytest.approx(lrs), arm
        assert summary["samples_seen"] == arms["lr_decay"][0]["samples_seen"]  # the same epochs of data
        assert summary["test_acc"] > 0.5
    assert arms["batch_growth"][0]["steps"] < arms["hybrid"][0]["steps"] < arms["lr_decay"][0]["steps"]
