"""Batch plans: the invariant size == micro_size x accum_steps x world_size, and errors naming the key."""

import pytest

from bsexp.batch.plan import BatchPlan, PlanError, make_plan


def test_fixed_plan_splits_the_global_batch_over_ranks():
    # A world of 8 ranks with no process group, as torchtitan tests ParallelDims.
    plan = make_plan(256, world_size=8)
    assert plan == BatchPlan(size=256, micro_size=32, accum_steps=1, world_size=8)
    assert plan.per_rank == 32


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(size=1024, micro_size=64), (64, 16)),
        (dict(size=1024, accum_steps=4), (256, 4)),
        (dict(size=1024, micro_size=64, accum_steps=16), (64, 16)),
        (dict(size=1024, world_size=8, micro_size=16), (16, 8)),
        (dict(size=96, world_size=3, accum_steps=2), (16, 2)),
    ],
)
def test_accumulation_plans_keep_the_invariant(kwargs, expected):
    plan = make_plan(**kwargs)
    assert (plan.micro_size, plan.accum_steps) == expected
    assert plan.size == plan.micro_size * plan.accum_steps * plan.world_size


@pytest.mark.parametrize(
    "kwargs, key, fragment",
    [
        (dict(size=100, world_size=8), "batch.size", "divisible by the world size 8"),
        (dict(size=100, micro_size=64), "batch.micro_size", "divisors: 1, 2, 4, 5, 10"),
        (dict(size=64, micro_size=128), "batch.micro_size", "at most batch.size / world_size = 64"),
        (dict(size=64, accum_steps=3), "batch.accum_steps", "must divide"),
        (dict(size=64, micro_size=16, accum_steps=2), "batch.accum_steps", "= 4"),
        (dict(size=0), "batch.size", ">= 1"),
        (dict(size=64, micro_size=0), "batch.micro_size", ">= 1"),
        (dict(size=64, world_size=0), "distributed.world_size", ">= 1"),
    ],
)
def test_impossible_plans_name_the_key(kwargs, key, fragment):
    with pytest.raises(PlanError) as info:
        make_plan(**kwargs)
    assert info.value.key == key
    assert fragment in str(info.value)


def test_a_plan_that_breaks_the_invariant_cannot_be_built():
    with pytest.raises(PlanError, match="must equal micro_size \\* accum_steps \\* world_size = 8 \\* 2 \\* 2 = 32"):
        BatchPlan(size=64, micro_size=8, accum_steps=2, world_size=2)
    with pytest.raises(PlanError, match="batch.accum_steps"):
        BatchPlan(size=64, micro_size=64, accum_steps=0, world_size=1)


def test_plans_are_frozen():
    plan = make_plan(64)
    with pytest.raises(AttributeError):
        plan.size = 128
