"""Batch schedules (Smith et al. 2018) laid out step by step, the LR coupled to them, and the policy's checks."""

import math

import pytest

from bsexp.batch.plan import PlanError, micro_sizes, plan_for
from bsexp.batch.policies import RunSpec
from bsexp.batch.policies.scheduled import BatchScheduleConfig, Scheduled, ScheduledBatch, ScheduleKind
from bsexp.batch.scaling import lr_coupling
from bsexp.batch.schedule import BatchSchedule
from bsexp.errors import ConfigError

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


def test_a_batch_the_run_chose_never_ends_an_epoch_with_a_step_of_a_few_samples():
    # MNIST-1D's 3,500 samples at the adaptive batch 437 = 8 x 437 + 4: a step of 4 samples at an
    # LR set for 437 undid training (validation accuracy 99.6 -> 94.4 %). With balance_tail (the
    # adaptive batch's layout) the last two steps share the rest; a user's fixed batch keeps
    # PyTorch's short last batch.
    changes = ((0, 32), (5, 437))
    plain = BatchSchedule(32, kind="by_step", step_points=changes).run_steps(3, 3500, drop_last=False)
    balanced = BatchSchedule(32, kind="by_step", step_points=changes, balance_tail=True)
    run = balanced.run_steps(3, 3500, drop_last=False)
    assert min(plain.taken) == 4  # the rest of every epoch at 437 after the first
    assert run.total_samples == plain.total_samples == 3 * 3500 and run.sizes == plain.sizes
    for epoch in range(3):
        taken, sizes = run.epoch_taken(epoch), run.epoch(epoch)
        assert sum(taken) == 3500 and all(t > s / 2 for t, s in zip(taken, sizes))
    assert run.epoch_taken(1)[-2:] == (221, 220)  # 441 left after 7 x 437: shared, not 437 + 4
    dropped = [
        BatchSchedule(32, kind="by_step", step_points=changes, balance_tail=balance).run_steps(3, 3500, drop_last=True)
        for balance in (True, False)
    ]
    assert dropped[0] == dropped[1]  # with drop_last the short step is dropped: nothing to share


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


def test_a_list_in_samples_seen_grows_the_batch_where_the_samples_say_within_an_epoch():
    # The LM critical batch's curve (docs: Language models): 16 sequences to 8,192 seen, 128 to
    # 24,576, then 512; epochs of 16,384 sequences, so both changes fall inside an epoch.
    curve = ((0, 16), (8192, 128), (24576, 512))
    run = BatchSchedule(16, kind="list", unit="samples", points=curve).run_steps(4, 16384, drop_last=False)
    assert run.sizes == (16,) * 512 + (128,) * 128 + (512,) * 80  # 8,192 / 16, 16,384 / 128, 40,960 / 512
    assert run.epoch_starts == (0, 512 + 64, 512 + 128 + 16, 512 + 128 + 48)
    assert run.total_samples == 4 * 16384
    # the same curve in optimizer steps lays out the same run
    in_steps = BatchSchedule(16, kind="list", unit="steps", points=((0, 16), (512, 128), (640, 512)))
    assert in_steps.run_steps(4, 16384, drop_last=False).sizes == run.sizes
    assert BatchSchedule(16, kind="list", unit="samples", points=curve).sizes(1) == [16, 128, 512]
    # a point between two steps' samples takes effect at the first step that starts past it
    late = BatchSchedule(16, kind="list", unit="samples", points=((0, 16), (8200, 128))).run_steps(1, 16384, False)
    assert late.sizes[:514] == (16,) * 513 + (128,)


def test_list_points_in_samples_are_checked_in_their_unit():
    good = scheduled(kind="list", unit="samples", size=16, points=[[0, 16], [8192, 128]])
    assert good._schedule(16).sizes(1) == [16, 128]
    with pytest.raises(
        ConfigError, match=r"\[sample, batch\], \.\.\.\] in sample order \(batch.schedule.unit=samples\)"
    ):
        scheduled(kind="list", unit="samples", size=16, points=[[0, 16], [8192, 128], [4096, 64]]).check()


def scheduled(world: int = 1, **schedule) -> Scheduled:
    """batch=scheduled's policy at batch 32 (or `size`) over bsexp's default 20 epochs, no Hydra."""
    size = schedule.pop("size", 32)
    config = ScheduledBatch(size=size, schedule=BatchScheduleConfig(**schedule))
    return Scheduled(config=config, spec=RunSpec(epochs=20, world_size=world))


def test_a_factor_that_makes_a_fractional_batch_is_refused():
    with pytest.raises(PlanError):
        BatchSchedule(33, kind="step", milestones=(1.0,), factor=1.5).size_at(1, 0)
    with pytest.raises(ConfigError) as info:
        scheduled(size=33, factor=1.5).check()
    assert info.value.key == "batch.schedule.factor"


@pytest.mark.parametrize("points, key", [([[0, 32], [2, 3]], "batch.schedule"), ([[1, 32]], "batch.schedule.points")])
def test_a_schedule_below_what_the_ranks_need_is_refused(points, key):
    with pytest.raises(ConfigError) as info:
        scheduled(world=2, kind=ScheduleKind.list, points=points).check()
    assert info.value.key == key


@pytest.mark.parametrize(
    "rule, expected", [("linear", [1, 1, 5, 5, 25]), ("sqrt", [1, 1, math.sqrt(5), math.sqrt(5), 5]), ("none", [1] * 5)]
)
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


def test_the_run_counts_the_samples_each_step_takes():
    # 100 samples in steps of 32: 32, 32, 32 and a last step of 4 (kept: 2 a rank at least).
    run = BatchSchedule(32).run_steps(epochs=2, n=100, drop_last=False)
    assert run.taken == (32, 32, 32, 4) * 2 and run.before == (0, 32, 64, 96, 100, 132, 164, 196)
    assert run.total_samples == 200 and run.samples_at(1) == 100 and run.samples_at(1.5) == 150
    assert run.samples_before_step(3) == 96 and run.samples_before_step(10) == 200 + 2 * 4  # past the end
    cut = BatchSchedule(32).run_steps(epochs=4, n=100, drop_last=False, max_steps=5)
    assert cut.samples_at(3) == 300  # past a run cut short: at a whole epoch's rate
    assert cut.epoch_samples() == [100, 32] and cut.cut_epoch == 4  # the second epoch cut after one of its 4 steps
    assert cut.samples_at(1.5) == 150 and cut.samples_at(0.5) == 50  # within the cut epoch too
    assert BatchSchedule(32).run_steps(epochs=4, n=100, drop_last=False, max_steps=2).samples_at(0.5) == 50


def test_the_lr_schedule_is_counted_in_samples_when_the_batch_grows():
    # Smith et al.'s schedule, 32 -> 160 -> 800 at epochs 8 and 14 of 20: 800 of the run's 944
    # steps come before the first increase. Counted in steps, a cosine decay would be at 9 % of its
    # peak when the batch grows; counted in samples it stands where 8 epochs of 20 put it.
    from bsexp.batch.hparams import Rules, scaled
    from bsexp.batch.layout import Layout

    grow = BatchSchedule(start=32, kind="step", milestones=(8, 14), factor=5, epochs=20)
    run = grow.run_steps(epochs=20, n=3200, drop_last=False)
    hp, factors = scaled(
        Layout(run, 1, plan_for(32, 1, None)),
        Rules(lr=0.1, weight_decay=5e-4, ref_batch=128, warmup=2, main="cosine"),  # the batch=scheduled defaults
    )
    first_of_epoch_8 = run.epoch_starts[8]
    assert first_of_epoch_8 == 800 and run.total == 944  # 8 x 100 steps of 32, then 6 x 20, 6 x 4
    progress = (8 - 2) / (20 - 2)  # past a 2-epoch warmup, in samples
    assert factors(first_of_epoch_8) == pytest.approx(0.5 * (1 + math.cos(math.pi * progress)))
    assert factors(run.epoch_starts[14]) == pytest.approx(0.5 * (1 + math.cos(math.pi * 12 / 18)))
    assert hp.warmup_steps == 200  # 2 epochs of 100 steps
