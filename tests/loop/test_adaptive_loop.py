"""batch=adaptive in the loop: the batch follows the measured noise scale, the LR and weight decay
follow the batch counted in samples, measuring leaves training unchanged; and Seesaw's schedule."""

import logging
import math

import pytest
import torch

from bsexp.batch import scaling
from bsexp.train.loop import TrainState, build_loop, train

# MNIST-1D's 1-D CNN (BatchNorm): B_simple rises past 100 within the first epoch.
ADAPTIVE = [
    "batch=adaptive",
    "batch.size=32",
    "batch.find_micro_size=false",
    "batch.adaptive.interval=20",
    "epochs=4",
    "trainer.progress=false",
    "trainer.eval_every_steps=0",
    "model.width=16",
]


def observed(loop) -> list[tuple[float, float]]:
    """(LR, weight decay) of the first parameter group at every optimizer step, as torch's
    optimizer sees them when it steps."""
    seen = []
    loop.step.optimizer.register_step_pre_hook(
        lambda opt, *_: seen.append((opt.param_groups[0]["lr"], opt.param_groups[0]["weight_decay"]))
    )
    return seen


@pytest.mark.slow  # 20-70 s on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_the_lr_and_weight_decay_follow_the_batch_with_the_schedule_counted_in_samples(make_cfg):
    loop = build_loop(make_cfg(*ADAPTIVE))
    seen = observed(loop)
    assert train(loop, TrainState()) == "completed"
    run, hp = loop.batch_control.layout.run, loop.hp
    sizes = run.sizes
    assert len(set(sizes)) >= 3 and sizes[-1] > sizes[0]  # the batch grew, more than once
    assert len(seen) == run.total
    # The schedule, rebuilt here from the config in samples: 2 warmup epochs of N samples, cosine
    # over 4 x N. Where each step stands is the samples taken before it, whatever their batches.
    n = run.n
    schedule = scaling.LRSchedule(total=4 * n, warmup=2 * n, warmup_shape="linear", start_factor=1.0, main="cosine")
    before = 0
    for step, ((lr, wd), size, taken) in enumerate(zip(seen, sizes, run.taken)):
        k = size / 32  # against the first batch; hp.lr is the LR at batch 32 (linear rule)
        assert lr == pytest.approx(hp.lr * schedule(before) * k, rel=1e-9), step
        assert wd == pytest.approx(hp.weight_decay * math.sqrt(k), rel=1e-9), step  # sqrt rule
        before += taken
    assert before == 4 * n  # the sample budget, exactly
    # The warmup ends after 2 epochs of samples, not after as many steps as batch 32 would take.
    ends = next(step for step, position in enumerate(run.before) if position >= 2 * n)
    assert seen[ends][0] == pytest.approx(hp.lr * sizes[ends] / 32 * schedule(2 * n), rel=1e-9)
    assert ends < 2 * n / 32  # fewer steps than at the first batch: the batch grew during warmup


@pytest.mark.slow  # minutes on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_the_batch_follows_the_measured_noise_scale(make_cfg):
    loop = build_loop(make_cfg(*ADAPTIVE))
    assert train(loop, TrainState()) == "completed"
    decisions = loop.batch_control.policy.decisions
    assert [d["step"] for d in decisions] == list(range(20, loop.batch_control.layout.run.total, 20))
    for d in decisions:  # c = 1: the target is B_simple itself, reached within a doubling
        if d["b_simple"] is not None:
            assert d["target"] == pytest.approx(d["b_simple"])
            assert d["previous"] <= d["size"] <= 2 * d["previous"]
            assert d["size"] == min(max(round(d["b_simple"]), d["previous"]), 2 * d["previous"])


@pytest.mark.slow  # 20-70 s on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_power_half_aims_each_decision_of_a_run_at_c_times_the_root_of_the_first_batch_times_b_simple(make_cfg):
    loop = build_loop(make_cfg(*ADAPTIVE, "batch.adaptive.power=0.5", "batch.adaptive.c=2", "trainer.max_steps=100"))
    assert train(loop, TrainState()) == "completed"
    known = [d for d in loop.batch_control.policy.decisions if d["b_simple"] is not None]
    assert len(known) >= 2
    for d in known:
        assert d["target"] == pytest.approx(2 * math.sqrt(32 * d["b_simple"]))
        assert d["size"] == min(max(round(d["target"]), d["previous"]), 2 * d["previous"])


def test_a_noise_scale_measured_through_batchnorm_is_said_once_and_not_without_batchnorm(make_cfg, caplog):
    caplog.set_level(logging.INFO, logger="bsexp.engine.build")

    def warned() -> int:
        found = [r for r in caplog.records if "whole batch's statistics (BatchNorm)" in r.message]
        caplog.clear()
        return len(found)

    build_loop(make_cfg(*ADAPTIVE))  # cnn1d: BatchNorm
    assert warned() == 1
    build_loop(make_cfg("trainer.noise_scale=always", "trainer.progress=false"))  # as the finder's measurement runs
    assert warned() == 1
    build_loop(make_cfg(*ADAPTIVE, "model.norm=none"))
    build_loop(make_cfg("trainer.progress=false"))  # auto: one micro-batch, nothing measured
    assert warned() == 0


def test_measuring_the_noise_scale_at_one_micro_batch_leaves_training_unchanged(make_cfg):
    # Until its first decision an adaptive run is a fixed run at its first batch that measures
    # B_simple on the side of each step (half the batch, BatchNorm's statistics put back): its
    # parameters must be those of the fixed run that measures nothing.
    first = [o for o in ADAPTIVE if not o.startswith("batch")] + ["trainer.max_steps=20"]
    adaptive = build_loop(make_cfg(*ADAPTIVE, "trainer.max_steps=20"))
    train(adaptive, TrainState())
    assert adaptive.step.noise.scale.count == 20  # every step measured
    fixed = build_loop(make_cfg(*first, "batch.size=32", "trainer.noise_scale=off"))
    train(fixed, TrainState())
    assert fixed.step.noise is None
    for a, b in zip(adaptive.step.net.state_dict().values(), fixed.step.net.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), atol=1e-6)


@pytest.mark.slow  # minutes on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_adascale_scales_the_lr_by_its_gain_and_advances_the_schedule_by_it(make_cfg):
    loop = build_loop(make_cfg(*ADAPTIVE, "batch.adaptive.lr=adascale"))
    seen, state = observed(loop), TrainState()
    assert train(loop, state) == "completed"
    run = loop.batch_control.layout.run
    gains = dict(loop.batch_control.policy.gains)
    assert any(1.0 < g for g in gains.values())
    position, gain = 0.0, 1.0
    schedule = scaling.LRSchedule(
        total=4 * run.n, warmup=2 * run.n, warmup_shape="linear", start_factor=1.0, main="cosine"
    )
    budget = 4 * run.n  # 4 epochs of batch 32's steps: AdaScale's T, in samples of batch 32
    for step, ((lr, _), size, taken) in enumerate(zip(seen, run.sizes, run.taken)):
        gain = gains.get(step, gain)
        assert 1.0 <= gain <= size / 32 + 1e-12
        assert lr == pytest.approx(loop.hp.lr * gain * schedule(position), rel=1e-9), step
        assert position < budget, step  # a step is taken only while the progress is short of T
        position += taken * gain * 32 / size  # r steps of batch 32 a step
    # AdaScale's length (Johnson et al. 2020, Algorithm 1: train while tau < T): the run ends once
    # its progress reaches T, so the schedule runs to its end (the cosine near zero), which takes
    # more samples than the 4 epochs, as the gain is below the scale.
    assert position >= budget
    assert schedule(position - run.taken[-1] * gain * 32 / run.sizes[-1]) < 0.01
    assert state.step == run.total == len(seen) and state.samples_seen == sum(run.taken) > budget
    assert state.epoch > 4  # epochs past the config's 4: the loop trained them all
    # It ends within its last epoch, and says how much of that epoch it trained.
    assert 0.05 < state.samples_seen / run.n % 1 < 0.95
    assert loop.batch_control.epochs_done(state) == pytest.approx(state.samples_seen / run.n, abs=0.02)


def test_seesaw_multiplies_the_batch_by_alpha_and_the_lr_by_one_over_root_alpha_at_each_decay(make_cfg):
    cfg = make_cfg(
        "batch=scheduled",
        "batch.schedule.kind=seesaw",
        "batch.size=32",
        "schedule.main=step",
        "schedule.milestones=[2,3]",
        "schedule.factor=0.5",
        "schedule.warmup_shape=none",
        "epochs=4",
        "trainer.progress=false",
        "model.width=8",
    )
    loop = build_loop(cfg)
    seen = observed(loop)
    assert train(loop, TrainState()) == "completed"
    run = loop.batch_control.layout.run
    starts = run.epoch_starts
    assert [run.sizes[s] for s in starts] == [32, 32, 64, 128]
    lrs = [seen[s][0] for s in starts]
    assert lrs[2] / lrs[1] == pytest.approx(2**-0.5) and lrs[3] / lrs[2] == pytest.approx(2**-0.5)


def test_a_batch_that_grows_at_an_epochs_last_step_waits_for_the_next_epoch(make_cfg):
    # 660 training samples at batch 32: after 20 steps, 20 are left when the controller (c = 100:
    # the batch doubles once B_simple is known) sets 64. Its last step cannot share that rest with
    # the step before, which has been taken: at 64 it would train on 20 samples at the LR of 64.
    # The new batch starts with the next epoch; the epoch ends at 32.
    loop = build_loop(
        make_cfg(*ADAPTIVE, "data.num_samples=1000", "data.val_size=140", "batch.adaptive.c=100", "epochs=3")
    )
    seen = observed(loop)
    assert train(loop, TrainState()) == "completed"
    run, hp = loop.batch_control.layout.run, loop.hp
    assert run.n == 660 and run.epoch_starts[1] == 21
    first = loop.batch_control.policy.decisions[0]
    assert first["step"] == 20 and first["size"] == 64 and first["from_step"] == 21
    assert run.sizes[20] == 32 and run.taken[20] == 20 and run.sizes[21] == 64
    for step, (size, taken) in enumerate(zip(run.sizes, run.taken)):  # no step of less than half its batch
        assert taken >= size / 2, (step, size, taken)
    for step, ((_lr, wd), size) in enumerate(zip(seen, run.sizes)):  # the LR and WD of the batch it takes
        assert wd == pytest.approx(hp.weight_decay * math.sqrt(size / 32), rel=1e-9), step
    assert loop.batch_control.policy.points[:2] == [(0, 32), (21, 64)]


def test_a_cap_in_steps_is_a_budget_of_the_first_batchs_samples_and_the_schedule_ends_with_the_run(make_cfg):
    # trainer.max_steps=60 at batch 32: 1,920 samples, the schedule's length. The batch grows (c =
    # 100), so the run ends once it has taken them, in fewer than 60 steps, its cosine at its end;
    # counted against the first batch's 60 steps instead, the schedule ran out at 1,920 samples and
    # the steps after it trained at LR 0.
    loop = build_loop(make_cfg(*ADAPTIVE, "batch.adaptive.c=100", "trainer.max_steps=60", "schedule.warmup=0"))
    seen = observed(loop)
    assert train(loop, TrainState()) == "completed"
    run, hp = loop.batch_control.layout.run, loop.hp
    assert run.sizes[-1] > 32 and run.total < 60 and len(seen) == run.total
    assert sum(run.taken[:-1]) < 60 * 32 <= sum(run.taken)
    schedule = scaling.LRSchedule(total=60 * 32, warmup=0, warmup_shape="linear", start_factor=1.0, main="cosine")
    for step, ((lr, _), size, before) in enumerate(zip(seen, run.sizes, run.before)):
        assert lr > 0 and lr == pytest.approx(hp.lr * schedule(before) * size / 32, rel=1e-9), step
    assert schedule(run.before[-1]) < 0.05  # the last step near the cosine's end
