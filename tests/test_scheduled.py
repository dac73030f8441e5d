"""Batch schedules and OOM recovery: the batch and LR at every boundary, a schedule that outgrows
memory, real out-of-memory errors recovered from in one process and over two ranks."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dist_workers
import wandb_records
from bsexp.batch_schedule import BatchSchedule, lr_coupling, micro_sizes, plan_for
from bsexp.config import check
from bsexp.errors import ConfigError
from bsexp.plan import PlanError
from bsexp.run import build_loop
from bsexp.trainer import Progress, train
from conftest import cli_env, limit_for_size
from test_training import TINY, assert_close, params

HERE = Path(__file__).parent


# --- the schedule itself -------------------------------------------------------------------


def test_step_schedule_multiplies_the_batch_at_each_milestone_epoch():
    schedule = BatchSchedule(32, kind="step", milestones=(2.0, 4.0), factor=5.0)
    run = schedule.run_steps(6, 1600, drop_last=False)
    assert [set(run.epoch(e)) for e in range(6)] == [{32}, {32}, {160}, {160}, {800}, {800}]
    assert run.epoch_starts == (0, 50, 100, 110, 120, 122) and run.total == 124
    assert schedule.sizes(6) == [32, 160, 800]


def test_step_milestones_in_steps_and_the_last_step_of_an_epoch():
    schedule = BatchSchedule(32, kind="step", unit="steps", milestones=(3, 5), factor=2.0)
    # 320 samples: 3 x 32 + 2 x 64 = 224, then a step of 128 scheduled with 96 samples left.
    kept = schedule.run_steps(2, 320, drop_last=False)
    assert kept.sizes == (32, 32, 32, 64, 64, 128, 128, 128, 128) and kept.epoch_starts == (0, 6)
    dropped = schedule.run_steps(2, 320, drop_last=True)
    assert dropped.sizes == (32, 32, 32, 64, 64, 128, 128) and dropped.epoch_starts == (0, 5)
    assert schedule.sizes(2) == [32, 64, 128]


def test_linear_and_exponential_schedules_round_to_what_the_ranks_allow():
    linear = BatchSchedule(32, world_size=2, kind="linear", end=104, epochs=4, round_to=4)
    assert [linear.size_at(e, 0) for e in range(4)] == [32, 56, 80, 104]
    # 30 -> 480 doubling per epoch, in multiples of 2 x 4 ranks: 30 and 60 round to 32 and 64.
    exponential = BatchSchedule(30, world_size=4, kind="exponential", end=480, epochs=5, round_to=2)
    assert [exponential.size_at(e, 0) for e in range(5)] == [32, 64, 120, 240, 480]
    assert exponential.size_at(9, 0) == 480  # held at the end


def test_list_schedule_holds_each_size_until_the_next_point():
    schedule = BatchSchedule(32, kind="list", points=((0, 32), (3, 128), (5, 64)))
    assert [schedule.size_at(e, 0) for e in range(7)] == [32, 32, 32, 128, 128, 64, 64]


def test_a_factor_that_makes_a_fractional_batch_is_refused(make_cfg):
    with pytest.raises(PlanError):
        BatchSchedule(33, kind="step", milestones=(1.0,), factor=1.5).size_at(1, 0)
    cfg = make_cfg("batch=scheduled", "batch.size=33", "batch.schedule.factor=1.5")
    with pytest.raises(ConfigError) as info:
        check(cfg)
    assert info.value.key == "batch.schedule.factor"


@pytest.mark.parametrize("points, key", [("[[0,32],[2,3]]", "batch.schedule"), ("[[1,32]]", "batch.schedule.points")])
def test_a_schedule_below_what_the_ranks_need_is_refused(make_cfg, points, key):
    cfg = make_cfg("batch=scheduled", "batch.schedule.kind=list", f"batch.schedule.points={points}",
                   "distributed=ddp", "distributed.nproc_per_node=2")
    with pytest.raises(ConfigError) as info:
        check(cfg)
    assert info.value.key == key


@pytest.mark.parametrize("rule, expected", [("linear", [1, 1, 5, 5, 25]), ("sqrt", [1, 1, math.sqrt(5), math.sqrt(5), 5]),
                                            ("none", [1] * 5)])
def test_the_lr_follows_the_batch_through_the_rule(rule, expected):
    sizes = (32, 32, 160, 160, 800)
    assert lr_coupling(sizes, 64, rule, True, 0) == pytest.approx(expected)  # relative to the first step
    assert lr_coupling(sizes, 64, rule, False, 0) == [1.0] * 5  # couple_lr=false holds it


def test_an_lr_jump_is_ramped_over_ramp_steps():
    factors = lr_coupling((32, 32, 160, 160, 160, 160, 160), 32, "linear", True, 4)
    assert factors == pytest.approx([1, 1, 2, 3, 4, 5, 5])


def test_a_batch_above_the_micro_cap_accumulates_the_largest_divisor_under_it():
    assert (plan_for(160, 2, 32).micro_size, plan_for(160, 2, 32).accum_steps) == (20, 4)
    assert (plan_for(800, 1, 256).micro_size, plan_for(800, 1, 256).accum_steps) == (200, 4)
    assert (plan_for(64, 2, None).micro_size, plan_for(64, 2, 32).accum_steps) == (32, 1)
    # A smaller last step keeps equal micro-batch counts on every rank.
    assert micro_sizes(48, 96, plan_for(128, 2, 16)) == [16, 16, 16]


# --- scheduled training --------------------------------------------------------------------

# TINY: 512 training samples; batch 32 for an epoch, 64 for one, 128 for one.
GROWING = ["batch=scheduled", "batch.size=32", "batch.schedule.milestones=[1,2]", "batch.schedule.factor=2",
           "epochs=3", "trainer.eval_every_steps=1", "scaling.lr_rule=linear", "scaling.ref_batch=32",
           "optimizer.lr=0.1"]


def scheduled(make_cfg, *overrides):
    cfg = make_cfg(*TINY, *GROWING, *overrides)
    loop, progress = build_loop(cfg, check(cfg)), Progress()
    assert train(loop, progress) == "completed"
    return loop, progress


@pytest.mark.parametrize("couple, ramp, lrs", [
    ("true", 0, [0.1] * 16 + [0.2] * 8 + [0.4] * 4),
    ("false", 0, [0.1] * 28),
    ("true", 4, [0.1] * 16 + [0.125, 0.15, 0.175] + [0.2] * 5 + [0.25, 0.3, 0.35, 0.4]),
])
def test_every_step_trains_at_the_scheduled_batch_and_its_lr(make_cfg, couple, ramp, lrs):
    _, progress = scheduled(make_cfg, f"batch.schedule.couple_lr={couple}", f"batch.schedule.ramp_steps={ramp}")
    records = progress.records
    assert [r["batch_size"] for r in records] == [32] * 16 + [64] * 8 + [128] * 4
    assert [r["lr"] for r in records] == pytest.approx(lrs)
    assert [r["samples_seen"] for r in records] == list(range(32, 513, 32)) + list(range(576, 1025, 64)) + \
        list(range(1152, 1537, 128))


def test_weight_decay_stays_at_the_first_batch_value(make_cfg):
    loop, _ = scheduled(make_cfg, "scaling.ref_batch=8", "scaling.wd_rule=sqrt", "optimizer.weight_decay=0.01")
    decays = {g["weight_decay"] for g in loop.optimizer.param_groups} - {0.0}  # norms and biases: none
    assert list(decays) == pytest.approx([0.02])  # sqrt(32 / 8) x 0.01, not sqrt(128 / 8) x 0.01


def test_batches_above_the_micro_cap_accumulate_to_the_same_parameters(make_cfg):
    capped, capped_progress = scheduled(make_cfg, "batch.micro_size=16")
    direct, _ = scheduled(make_cfg)
    plans = [(r["batch_size"], r["micro_size"], r["accum_steps"]) for r in capped_progress.records]
    assert sorted(set(plans)) == [(32, 16, 2), (64, 16, 4), (128, 16, 8)]
    assert_close(params(capped), params(direct), atol=1e-6)


def test_scheduled_summary_reports_where_the_batch_ended(run_cli, tmp_path):
    out = run_cli(*TINY, *GROWING, "logger=none", "trainer.eval_every_steps=0", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["batch_size"], summary["final_batch_size"], summary["steps"]) == (32, 128, 28)
    assert "grew to 128" in out.stdout
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["batch_size"] for r in records] == [32, 64, 128]
    assert [r["lr"] for r in records] == pytest.approx([0.1, 0.2, 0.4])


# --- real memory caps ----------------------------------------------------------------------

# Memory grows fast with the batch and compute does not: one wide hidden layer on 40 inputs.
WIDE = ["data=synthetic", "data.shape=[1,40]", "data.val_size=200", "model=mlp", "model.hidden=[8192]",
        "model.norm=none", "trainer.eval_batch_size=256", "schedule.warmup_shape=none", "epochs=1"]


def capped_train(tmp_path, name, room_mb, *overrides):
    """bsexp's training in a fresh process capped at what it holds plus room_mb (tests/capped_train.py)."""
    out = tmp_path / f"{name}.pt"
    done = subprocess.run([sys.executable, str(HERE / "capped_train.py"), str(out), str(room_mb), *overrides],
                          capture_output=True, text=True, timeout=300, env=cli_env(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out, weights_only=False), done.stderr


def test_a_real_oom_halves_the_micro_batch_and_trains_as_if_started_there(tmp_path):
    shape = [*WIDE, "data.num_samples=4300", "batch.size=2048", "trainer.max_steps=2"]
    # 2048 samples need about 0.5 GB in this model's step: 150 MB above what the process holds is far too little.
    recovered, stderr = capped_train(tmp_path, "recovered", 150, *shape)
    plan = recovered["plan"]
    assert recovered["status"] == "completed" and recovered["oom_recoveries"] >= 1
    assert plan.size == 2048 and plan.micro_size == 2048 >> recovered["oom_recoveries"]
    assert plan.micro_size * plan.accum_steps == 2048
    assert "out of memory at micro-batch 2048" in stderr
    assert [r["micro_size"] for r in recovered["records"]] == [plan.micro_size]
    assert [r["norm_batch"] for r in recovered["records"]] == [plan.micro_size]  # what a norm layer now sees
    direct, _ = capped_train(tmp_path, "direct", 0, *shape, "batch=accumulation", f"batch.micro_size={plan.micro_size}")
    assert direct["oom_recoveries"] == 0
    assert_close(recovered["params"], direct["params"], atol=1e-6)


def test_without_recovery_the_same_oom_ends_the_run(tmp_path):
    out = tmp_path / "x.pt"
    done = subprocess.run([sys.executable, str(HERE / "capped_train.py"), str(out), "150", *WIDE,
                           "data.num_samples=4300", "batch.size=2048", "trainer.max_steps=1",
                           "trainer.oom_recovery=false"], capture_output=True, text=True, timeout=300,
                          env=cli_env(tmp_path))
    assert done.returncode != 0 and "can't allocate memory" in done.stderr and not out.exists()


def test_out_of_memory_at_a_micro_batch_of_one_is_a_clear_error(run_cli, tmp_path):
    conf = tmp_path / "my_conf" / "model"
    conf.mkdir(parents=True)  # 20 GB a sample: even one does not fit under a 4 GB cap
    (conf / "heavy.yaml").write_text("_target_: user_models.HeavyPerSample\nmb_per_sample: 20000\n")
    out = run_cli("data=synthetic", "data.shape=[1,8]", "data.num_samples=100", "data.val_size=20",
                  f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "model=heavy", "batch.size=4",
                  "trainer.memory_limit_gb=4", "logger=none", "trainer.progress=false", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 1
    assert out.stdout.count("out of memory at micro-batch") == 2  # 4 -> 2 -> 1 (the log's warnings)
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: out of memory (even a micro-batch of 1 sample per rank does not fit")
    assert "Traceback" not in out.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["oom_recoveries"] == 2


def test_two_ranks_agree_on_an_oom_only_one_of_them_had(make_cfg):
    cfg = make_cfg(*WIDE, "data.num_samples=4300", "batch.size=2048", "trainer.max_steps=2", "trainer.progress=false",
                   "distributed=ddp", "distributed.nproc_per_node=2")
    # Rank 1 has 40 MB to spare, too little for a micro-batch of 1024 (60-100 MB); rank 0 is not capped.
    ranks = dist_workers.launch(dist_workers.train_with_room, cfg, [0, 40])
    zero, one = ranks[0], ranks[1]
    assert zero["status"] == one["status"] == "completed"
    assert zero["oom_recoveries"] == one["oom_recoveries"] >= 1 and zero["plan"] == one["plan"]
    assert zero["plan"].micro_size * zero["plan"].accum_steps * 2 == 2048
    assert_close(zero["params"], one["params"], atol=0)
    single = make_cfg(*WIDE, "data.num_samples=4300", "batch.size=2048", "trainer.max_steps=2", "trainer.progress=false")
    loop = build_loop(single, check(single))
    train(loop, Progress())
    assert_close(params(loop), zero["params"], atol=1e-5)


@pytest.fixture(scope="module")
def micro_limit_gb(data_root, tmp_path_factory):
    """A memory limit under which the finder's micro-batch is about 1000."""
    return limit_for_size(data_root, tmp_path_factory.mktemp("calibration"), [*WIDE, "data.num_samples=8200"], 1000)


def test_a_schedule_that_outgrows_memory_switches_to_accumulation(run_cli, tmp_path, micro_limit_gb):
    limit = micro_limit_gb
    grows = [*WIDE, "data.num_samples=8200", "epochs=2", "batch=scheduled", "batch.size=500",
             "batch.schedule.milestones=[1]", "batch.schedule.factor=8", "batch.find_micro_size=true",
             f"batch.finder.memory_limit_gb={limit}", f"trainer.memory_limit_gb={limit}", "logger=none"]
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
    whole = run_cli(*WIDE, "data.num_samples=8200", "batch.size=4000", f"trainer.memory_limit_gb={limit}",
                    "trainer.oom_recovery=false", "trainer.max_steps=1", "logger=none",
                    f"hydra.run.dir={tmp_path / 'whole'}")
    assert whole.returncode == 1 and "out of memory" in whole.stderr


def test_a_schedule_past_the_training_set_is_refused(make_cfg):
    cfg = make_cfg(*TINY, *GROWING, "batch.schedule.factor=5")  # 32 -> 160 -> 800, with 512 samples
    with pytest.raises(ConfigError) as info:
        build_loop(cfg, check(cfg))
    assert info.value.key == "batch.schedule" and "512 training samples" in str(info.value)


def phase_means(make_cfg, arm: str) -> list[float]:
    """Mean samples per optimizer step in each phase (between the milestones) of an arm of
    experiment=increase_batch, counted from the batches the run is fed."""
    cfg = make_cfg("experiment=increase_batch", f"experiment/increase_batch={arm}")
    loop = build_loop(cfg, check(cfg))
    phases = [0, *cfg.schedule.milestones, *cfg.batch.schedule.milestones, cfg.epochs]
    bounds = sorted({int(m) for m in phases})
    means = []
    for start, stop in zip(bounds, bounds[1:]):
        samples = [n for epoch in range(start, stop) for _, _, n in loop.batches.steps(epoch, loop.run_steps.epoch(epoch))]
        means.append(sum(samples) / len(samples))
    return means


def test_increase_batch_grows_the_batch_exactly_where_the_lr_arm_decays_it(make_cfg):
    # Smith et al. 2018: the batch x5 where the LR / 5. Every step of every phase is the scheduled
    # batch (no smaller last step pulling the mean down), so the noise scale falls by the same factor.
    decay = 1 / make_cfg("experiment=increase_batch", "experiment/increase_batch=lr_decay").schedule.factor
    growth = phase_means(make_cfg, "batch_growth")
    assert growth == [32, 160, 800]
    assert growth[1] / growth[0] == pytest.approx(decay) and growth[2] / growth[1] == pytest.approx(decay)
    assert phase_means(make_cfg, "hybrid") == [32, 160, 160]
    assert phase_means(make_cfg, "lr_decay") == [32, 32, 32]


def test_the_increase_batch_experiment_runs_its_three_arms(run_cli, tmp_path):
    out = run_cli("-m", "experiment=increase_batch", "seed=0", "data.num_samples=1200", "data.val_size=100", "model.width=8",
                  "trainer.progress=false", f"hydra.sweep.dir={tmp_path / 'sweep'}", timeout=600)
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
            [run] = [r.run for r in wandb_records.records(run_file) if r.WhichOneof("record_type") == "run"]
            assert run.display_name == f"{arm}-bs32-seed0" and list(run.tags) == ["increase_batch", arm]
    assert sorted(arms) == ["batch_growth", "hybrid", "lr_decay"]
    # batch: 32 throughout / x5 at epochs 8 and 14 / x5 at 8; LR 0.05: /5 at 8 and 14 / held / /5 at 14.
    expected = {"lr_decay": ([32] * 20, [0.05] * 8 + [0.01] * 6 + [0.002] * 6),
                "batch_growth": ([32] * 8 + [160] * 6 + [800] * 6, [0.05] * 20),
                "hybrid": ([32] * 8 + [160] * 12, [0.05] * 14 + [0.01] * 6)}
    for arm, (batches, lrs) in expected.items():
        summary, records = arms[arm]
        assert summary["status"] == "completed" and summary["final_batch_size"] == batches[-1]
        assert [r["batch_size"] for r in records] == batches, arm
        assert [r["lr"] for r in records] == pytest.approx(lrs), arm
        assert summary["samples_seen"] == arms["lr_decay"][0]["samples_seen"]  # the same epochs of data
        assert summary["test_acc"] > 0.5
    assert arms["batch_growth"][0]["steps"] < arms["hybrid"][0]["steps"] < arms["lr_decay"][0]["steps"]
