"""batch=scheduled in training, and OOM recovery under real CPU memory caps."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bsexp.errors import ConfigError
from bsexp.train.loop import TrainState, build_loop, train
from conftest import cli_env
from tiny import TINY, assert_close, params

HELPERS = Path(__file__).resolve().parents[1] / "helpers"


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


def scheduled(make_cfg, *overrides):
    cfg = make_cfg(*TINY, *GROWING, *overrides)
    loop, progress = build_loop(cfg), TrainState()
    assert train(loop, progress) == "completed"
    return loop, progress


@pytest.mark.parametrize(
    "couple, ramp, lrs",
    [
        ("true", 0, [0.1] * 16 + [0.2] * 8 + [0.4] * 4),
        ("false", 0, [0.1] * 28),
        ("true", 4, [0.1] * 16 + [0.125, 0.15, 0.175] + [0.2] * 5 + [0.25, 0.3, 0.35, 0.4]),
    ],
)
def test_every_step_trains_at_the_scheduled_batch_and_its_lr(make_cfg, couple, ramp, lrs):
    _, progress = scheduled(make_cfg, f"batch.schedule.couple_lr={couple}", f"batch.schedule.ramp_steps={ramp}")
    records = progress.records
    assert [r["batch_size"] for r in records] == [32] * 16 + [64] * 8 + [128] * 4
    assert [r["lr"] for r in records] == pytest.approx(lrs)
    assert [r["samples_seen"] for r in records] == list(range(32, 513, 32)) + list(range(576, 1025, 64)) + list(
        range(1152, 1537, 128)
    )


def test_weight_decay_stays_at_the_first_batch_value(make_cfg):
    loop, _ = scheduled(make_cfg, "scaling.ref_batch=8", "scaling.wd_rule=sqrt", "optimizer.weight_decay=0.01")
    decays = {g["weight_decay"] for g in loop.step.optimizer.param_groups} - {0.0}  # norms and biases: none
    assert list(decays) == pytest.approx([0.02])  # sqrt(32 / 8) x 0.01, not sqrt(128 / 8) x 0.01


def test_batches_above_the_micro_cap_accumulate_to_the_same_parameters(make_cfg):
    capped, capped_progress = scheduled(make_cfg, "batch.micro_size=16")
    direct, _ = scheduled(make_cfg)
    plans = [(r["batch_size"], r["micro_size"], r["accum_steps"]) for r in capped_progress.records]
    assert sorted(set(plans)) == [(32, 16, 2), (64, 16, 4), (128, 16, 8)]
    assert_close(params(capped), params(direct), atol=1e-6)


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


def capped_train(tmp_path, name, room_mb, *overrides):
    """bsexp's training in a fresh process capped at what it holds plus room_mb (tests/capped_train.py)."""
    out = tmp_path / f"{name}.pt"
    done = subprocess.run(
        [sys.executable, str(HELPERS / "capped_train.py"), str(out), str(room_mb), *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        env=cli_env(tmp_path),
    )
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
    done = subprocess.run(
        [
            sys.executable,
            str(HELPERS / "capped_train.py"),
            str(out),
            "150",
            *WIDE,
            "data.num_samples=4300",
            "batch.size=2048",
            "trainer.max_steps=1",
            "trainer.oom_recovery=false",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=cli_env(tmp_path),
    )
    assert done.returncode != 0 and "can't allocate memory" in done.stderr and not out.exists()


def test_a_schedule_past_the_training_set_is_refused(make_cfg):
    cfg = make_cfg(*TINY, *GROWING, "batch.schedule.factor=5")  # 32 -> 160 -> 800, with 512 samples
    with pytest.raises(ConfigError) as info:
        build_loop(cfg)
    assert info.value.key == "batch.schedule" and "512 training samples" in str(info.value)


def phase_means(make_cfg, arm: str) -> list[float]:
    """Mean samples per optimizer step in each phase (between the milestones) of an arm of
    experiment=increase_batch, counted from the batches the run is fed."""
    cfg = make_cfg("experiment=increase_batch", f"experiment/increase_batch={arm}")
    loop = build_loop(cfg)
    phases = [0, *cfg.schedule.milestones, *cfg.batch.schedule.milestones, cfg.epochs]
    bounds = sorted({int(m) for m in phases})
    means = []
    for start, stop in zip(bounds, bounds[1:]):
        samples = [
            n
            for epoch in range(start, stop)
            for _, _, n in loop.feed.steps(epoch, loop.batch_control.layout.run.epoch(epoch))
        ]
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
